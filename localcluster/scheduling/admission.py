"""kube-apiserver's ``Priority`` admission plugin (``plugin/pkg/admission/priority``).

Mutating, on pod CREATE: the pod's ``priorityClassName`` resolves to the class's ``value`` in
``spec.priority`` and its ``preemptionPolicy``; a pod without a class gets the global default
class (its name too), or priority 0 and ``PreemptLowerPriority`` when there is none. An unknown
class is 403. So is a ``spec.priority`` or ``spec.preemptionPolicy`` the pod sets itself that
differs from what the class gives — with no class that is priority 0 (or the default's value):
a pod may not choose its own priority. On pod UPDATE a body without them keeps the stored ones.

Validating, on PriorityClass CREATE and UPDATE: a second ``globalDefault`` class is 403. kube
validates the class before this check, so an invalid class is left to the store's 422.

Built-in plugins run before the mutating webhooks and their validating half after them, as
kube-apiserver orders its admission chain.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from localcluster import errors, strategy, validation
from localcluster.admission import Attributes
from localcluster.resources import PODS, PRIORITY_CLASSES
from localcluster.scheduling import decoding
from localcluster.scheduling.api import DEFAULT_PRIORITY, PREEMPT_LOWER_PRIORITY
from localcluster.scheduling.storage import global_default
from localcluster.store import Store, meta

JsonObj = dict[str, Any]

log = logging.getLogger(__name__)


class PriorityAdmission:
    """The ``Priority`` plugin over the store's PriorityClasses (kube reads them from an
    informer; this reads the store, so a class is seen as soon as it is written)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def admit(self, attributes: Attributes, obj: JsonObj, old: JsonObj | None) -> JsonObj:
        """The mutating half: the object to pass on; raises ApiError when it is refused."""
        if attributes.subresource:
            return obj
        if attributes.resource is PRIORITY_CLASSES:
            decoding.check_priority_class(obj)
        elif attributes.resource is PODS:
            decoding.check_pod(obj)
            if attributes.operation == "CREATE":
                return self._resolve(attributes, obj)
            if old is not None:
                return _keep_priority(obj, old)
        return obj

    def validate(self, attributes: Attributes, obj: JsonObj, old: JsonObj | None) -> None:
        """The validating half: at most one PriorityClass is the global default."""
        if attributes.resource is not PRIORITY_CLASSES or attributes.subresource:
            return
        if obj.get("globalDefault") is not True or self._store_refuses(obj, old):
            return
        default = global_default(self._store)
        if default is None:
            return
        default_name = meta(default).get("name")
        if attributes.operation == "CREATE" or default_name != attributes.name:
            raise errors.forbidden(
                PRIORITY_CLASSES,
                _admitted_name(attributes, obj),
                f"PriorityClass {default_name} is already marked as default. "
                "Only one default can exist",
            )

    def _resolve(self, attributes: Attributes, pod: JsonObj) -> JsonObj:
        spec = pod.get("spec")
        if not isinstance(spec, dict):
            return pod  # the store refuses a pod without a spec
        spec = dict(spec)
        wanted = str(spec.get("priorityClassName") or "")
        if wanted:
            pc = self._class_named(attributes, pod, wanted)
            name, value, policy = wanted, _value(pc), pc.get("preemptionPolicy")
        elif (default := global_default(self._store)) is not None:
            name, value = str(meta(default)["name"]), _value(default)
            policy = default.get("preemptionPolicy")
        else:
            name, value, policy = "", DEFAULT_PRIORITY, PREEMPT_LOWER_PRIORITY
        if name:
            spec["priorityClassName"] = name
        else:
            spec.pop("priorityClassName", None)
        asked = spec.get("priority")
        if asked is not None and asked != value:
            raise errors.forbidden(
                PODS,
                _admitted_name(attributes, pod),
                f"the integer value of priority ({asked}) must not be provided in pod spec; "
                f"priority admission controller computed {value} from the given PriorityClass "
                "name",
            )
        spec["priority"] = value
        if policy is not None:
            asked_policy = spec.get("preemptionPolicy")
            if asked_policy is not None and asked_policy != policy:
                raise errors.forbidden(
                    PODS,
                    _admitted_name(attributes, pod),
                    f"the string value of PreemptionPolicy ({asked_policy}) must not be provided "
                    f"in pod spec; priority admission controller computed {policy} from the "
                    "given PriorityClass name",
                )
            spec["preemptionPolicy"] = policy
        log.debug("pod %s/%s gets priority %s", attributes.namespace, attributes.name, value)
        return {**pod, "spec": spec}

    def _class_named(self, attributes: Attributes, pod: JsonObj, name: str) -> JsonObj:
        try:
            return self._store.get(PRIORITY_CLASSES, "", name)
        except errors.ApiError as exc:
            if exc.code != 404:
                raise
            raise errors.forbidden(
                PODS,
                _admitted_name(attributes, pod),
                f"no PriorityClass with name {name} was found",
            ) from exc

    def _store_refuses(self, pc: JsonObj, old: JsonObj | None) -> bool:
        """Whether the store will refuse the class as invalid (kube validates before this
        plugin's validating half, so that 422 comes first)."""
        candidate = copy.deepcopy(pc)
        strategy.apply_defaults(PRIORITY_CLASSES, candidate)
        if old is None:
            return bool(validation.validate_create(PRIORITY_CLASSES, candidate))
        return bool(validation.validate_update(PRIORITY_CLASSES, old, candidate, subresource=None))


def _keep_priority(pod: JsonObj, old: JsonObj) -> JsonObj:
    """An update keeps what the plugin set on create when the body leaves it out (both fields
    are immutable, so anything else is refused by validation)."""
    spec, old_spec = pod.get("spec"), old.get("spec") or {}
    if not isinstance(spec, dict):
        return pod
    kept = {
        key: old_spec[key]
        for key in ("priority", "preemptionPolicy")
        if spec.get(key) is None and old_spec.get(key) is not None
    }
    return {**pod, "spec": {**spec, **kept}} if kept else pod


def _value(pc: JsonObj) -> int:
    return int(pc.get("value") or 0)


def _admitted_name(attributes: Attributes, obj: JsonObj) -> str:
    """The name kube's admission errors give: the request's, else the body's name or
    ``generateName`` (names are generated after admission), else ``Unknown``."""
    metadata = meta(obj)
    return attributes.name or str(metadata.get("name") or metadata.get("generateName") or "Unknown")
