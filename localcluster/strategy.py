"""Per-kind preparation of an object before it is validated and stored — kube's "strategies".

What the server decides rather than the client: status reset on create (status is written through
``/status`` only), spec kept on a status write and status kept on a spec write, ``generation``
bumped on spec change, a claim's ``status.devices`` of deallocated devices dropped, defaults a
reader may rely on (pod ``phase``, ``schedulerName``, a PodDisruptionBudget's zero counts, …), and
system metadata carried over from the stored object on update. The functions mutate the object
passed in; the store hands them a private copy.
"""

from __future__ import annotations

import base64
from typing import Any

from localcluster.defaults_dra import apply_dra_defaults
from localcluster.resources import ResourceType
from localcluster.scheduling.api import apply_priority_class_defaults

JsonObj = dict[str, Any]

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
_SYSTEM_METADATA = (
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
)
_KEEP_STATUS_ON_CREATE = {("", "nodes")}
_BUDGETS = ("policy", "poddisruptionbudgets")
_BUDGET_COUNTS = ("disruptionsAllowed", "currentHealthy", "desiredHealthy", "expectedPods")


def prepare_create(resource: ResourceType, obj: JsonObj) -> None:
    """Server-side fields of a new object (system metadata is the store's job)."""
    meta = obj.setdefault("metadata", {})
    if resource.tracks_generation:
        meta["generation"] = 1
    if resource.has_status and (resource.group, resource.plural) not in _KEEP_STATUS_ON_CREATE:
        obj.pop("status", None)
    apply_defaults(resource, obj)
    if resource.plural == "pods" and not resource.group:
        obj["status"] = {"phase": "Pending", "qosClass": _qos_class(obj.get("spec") or {})}
    elif resource.plural == "namespaces" and not resource.group:
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj["status"] = {"phase": "Active"}
    elif (resource.group, resource.plural) == _BUDGETS:
        obj["status"] = _budget_counts({})


def prepare_update(
    resource: ResourceType, old: JsonObj, new: JsonObj, *, subresource: str | None
) -> JsonObj:
    """The object to store: for ``status`` only the status of ``new`` counts, otherwise the
    status of ``old`` is kept; system metadata always comes from ``old``."""
    if subresource == "status":
        result = {k: v for k, v in old.items() if k != "status"}
        result["metadata"] = dict(old.get("metadata") or {})
        if "status" in new:
            result["status"] = new["status"]
            if (resource.group, resource.plural) == ("resource.k8s.io", "resourceclaims"):
                _drop_deallocated_device_statuses(result, old)
            elif (resource.group, resource.plural) == _BUDGETS and isinstance(new["status"], dict):
                result["status"] = _budget_counts(new["status"])
        return result
    meta = new.setdefault("metadata", {})
    old_meta = old.get("metadata") or {}
    for key in _SYSTEM_METADATA:
        if key in old_meta:
            meta[key] = old_meta[key]
        else:
            meta.pop(key, None)
    if resource.has_status:
        if "status" in old:
            new["status"] = old["status"]
        else:
            new.pop("status", None)
    apply_defaults(resource, new)
    if resource.tracks_generation and new.get("spec") != old.get("spec"):
        meta["generation"] = int(old_meta.get("generation") or 0) + 1
    return new


def _budget_counts(status: JsonObj) -> JsonObj:
    """A PodDisruptionBudget's status always carries its four counts (Go ints, not
    ``omitempty``): zero when a writer leaves one out."""
    return {**dict.fromkeys(_BUDGET_COUNTS, 0), **status}


def _allocated(claim: JsonObj) -> set[tuple[Any, ...]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return {
        (r.get("driver"), r.get("pool"), r.get("device"), r.get("shareID"))
        for r in (allocation.get("devices") or {}).get("results") or []
        if isinstance(r, dict)
    }


def _drop_deallocated_device_statuses(new: JsonObj, old: JsonObj) -> None:
    """Kube's ``dropDeallocatedStatusDevices``: a status write that removes allocated devices
    also removes their ``status.devices`` entries (so deallocating never trips validation)."""
    status = new.get("status")
    if not isinstance(status, dict) or not status.get("devices"):
        return
    gone = _allocated(old) - _allocated(new)
    if not gone:
        return
    status["devices"] = [
        d
        for d in status["devices"]
        if not isinstance(d, dict)
        or (d.get("driver"), d.get("pool"), d.get("device"), d.get("shareID")) not in gone
    ]
    if not status["devices"]:
        del status["devices"]


_OMIT_EMPTY_METADATA = ("labels", "annotations", "finalizers", "ownerReferences")
_OMIT_EMPTY_POD_SPEC = ("schedulingGates", "nodeSelector", "tolerations", "resourceClaims")


def _omit_empty(obj: JsonObj, keys: tuple[str, ...]) -> None:
    """Kube serializes these ``omitempty``: an emptied list or map is absent, not ``[]``."""
    for key in keys:
        if key in obj and not obj[key]:
            del obj[key]


def apply_defaults(resource: ResourceType, obj: JsonObj) -> None:
    """Defaults kube applies when decoding any write, so a client that omits them changes nothing."""
    if isinstance(obj.get("metadata"), dict):
        _omit_empty(obj["metadata"], _OMIT_EMPTY_METADATA)
    if resource.group == "resource.k8s.io":
        apply_dra_defaults(resource.plural, obj)
    elif (resource.group, resource.plural) == ("scheduling.k8s.io", "priorityclasses"):
        apply_priority_class_defaults(obj)
    if resource.group:
        return
    if resource.plural == "pods":
        _default_pod_spec(obj.setdefault("spec", {}))
    elif resource.plural == "secrets":
        _fold_string_data(obj)
    elif resource.plural == "namespaces":
        name = (obj.get("metadata") or {}).get("name")
        if name:
            labels = obj["metadata"].get("labels") or {}
            obj["metadata"]["labels"] = {**labels, NAMESPACE_NAME_LABEL: name}


def _default_pod_spec(spec: JsonObj) -> None:
    _omit_empty(spec, _OMIT_EMPTY_POD_SPEC)
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    for field in ("containers", "initContainers"):
        for container in spec.get(field) or []:
            if not isinstance(container, dict):
                continue
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            image = str(container.get("image") or "")
            tagless = ":" not in image.rsplit("/", 1)[-1] and "@" not in image
            latest = tagless or image.endswith(":latest")
            container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")


def _fold_string_data(obj: JsonObj) -> None:
    string_data = obj.pop("stringData", None)
    if isinstance(string_data, dict) and string_data:
        data = dict(obj.get("data") or {})
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        obj["data"] = data


def _qos_class(spec: JsonObj) -> str:
    """BestEffort / Guaranteed / Burstable, comparing quantities as written."""
    containers = [
        c
        for c in (spec.get("containers") or []) + (spec.get("initContainers") or [])
        if isinstance(c, dict)
    ]
    any_set = False
    guaranteed = True
    for container in containers:
        resources = container.get("resources") or {}
        requests = resources.get("requests") or {}
        limits = resources.get("limits") or {}
        for name in ("cpu", "memory"):
            if name in requests or name in limits:
                any_set = True
            if name not in limits or requests.get(name, limits[name]) != limits[name]:
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"
