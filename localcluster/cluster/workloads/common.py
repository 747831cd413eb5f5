"""What the workload controllers share: their resources, pods made from a template, the index of
pods by controller, kube's "expectations" (so a stale cache never makes a controller create or
delete twice), the ordering of pods to delete first, and resourceVersion-checked status writes.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from driver.cluster.port import (
    PODS,
    ClusterApi,
    JsonObject,
    Resource,
    metadata,
    name_of,
    namespace_of,
    uid_of,
)
from driver.errors import ApiNotFoundError, ConflictError
from localcluster.cluster.podutil import is_deleting, is_terminal, node_name

log = logging.getLogger(__name__)

DEPLOYMENTS = Resource(
    group="apps", version="v1", plural="deployments", kind="Deployment", namespaced=True
)
REPLICA_SETS = Resource(
    group="apps", version="v1", plural="replicasets", kind="ReplicaSet", namespaced=True
)
STATEFUL_SETS = Resource(
    group="apps", version="v1", plural="statefulsets", kind="StatefulSet", namespaced=True
)
JOBS = Resource(group="batch", version="v1", plural="jobs", kind="Job", namespaced=True)

BY_CONTROLLER = "controller-uid"
EXPECTATIONS_TIMEOUT_S = 30.0
_ATTEMPTS = 5


def controller_uids(obj: JsonObject) -> Iterable[str]:
    """Index function: the uid of the object's controller owner."""
    for ref in metadata(obj).get("ownerReferences") or []:
        if ref.get("controller"):
            yield str(ref.get("uid"))


def controller_of(obj: JsonObject, resource: Resource) -> JsonObject | None:
    for ref in metadata(obj).get("ownerReferences") or []:
        if (
            ref.get("controller")
            and ref.get("kind") == resource.kind
            and (ref.get("apiVersion") == resource.api_version)
        ):
            return dict(ref)
    return None


def owner_ref(resource: Resource, owner: JsonObject) -> JsonObject:
    return {
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "name": name_of(owner),
        "uid": uid_of(owner),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pod_from_template(
    owner: JsonObject,
    resource: Resource,
    *,
    name: str | None = None,
    generate_name: str | None = None,
    labels: dict[str, str] | None = None,
) -> JsonObject:
    """A pod from ``owner.spec.template`` owned by ``owner`` (kube's ``GetPodFromTemplate``)."""
    template = (owner.get("spec") or {}).get("template") or {}
    template_meta = template.get("metadata") or {}
    pod_meta: JsonObject = {
        "namespace": namespace_of(owner),
        "labels": {**(template_meta.get("labels") or {}), **(labels or {})},
        "ownerReferences": [owner_ref(resource, owner)],
    }
    if template_meta.get("annotations"):
        pod_meta["annotations"] = dict(template_meta["annotations"])
    if template_meta.get("finalizers"):
        pod_meta["finalizers"] = list(template_meta["finalizers"])
    if name is not None:
        pod_meta["name"] = name
    else:
        pod_meta["generateName"] = generate_name or f"{name_of(owner)}-"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta,
            "spec": copy.deepcopy(template.get("spec") or {})}  # fmt: skip


def is_active(pod: JsonObject) -> bool:
    return not is_terminal(pod) and not is_deleting(pod)


def is_ready(pod: JsonObject) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


_PHASE_RANK = {"Pending": 0, "Unknown": 1, "Running": 2}


def deletion_order(pods: Iterable[JsonObject]) -> list[JsonObject]:
    """Pods to delete first first (kube's ``ActivePods`` ranking, simplified): unscheduled, then
    pending, then not ready, then the newest."""

    def rank(pod: JsonObject) -> tuple[bool, int, bool, str]:
        created = str(metadata(pod).get("creationTimestamp") or "")
        inverted = "".join(chr(0x10FFFF - ord(ch)) for ch in created)
        phase = _PHASE_RANK.get(str((pod.get("status") or {}).get("phase")), 0)
        return (bool(node_name(pod)), phase, is_ready(pod), inverted)

    return sorted(pods, key=rank)


@dataclass(slots=True)
class _Expected:
    adds: int
    deletes: set[str]
    since: float


class Expectations:
    """Creates and deletes a controller issued but its cache does not show yet, per owner key."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._by_owner: dict[str, _Expected] = {}

    def expect(self, owner: str, *, adds: int = 0, deletes: Iterable[str] = ()) -> None:
        with self._lock:
            self._by_owner[owner] = _Expected(adds, set(deletes), self._clock())

    def created(self, owner: str) -> None:
        with self._lock:
            if owner in self._by_owner:
                self._by_owner[owner].adds -= 1

    def deleted(self, owner: str, pod_uid: str) -> None:
        with self._lock:
            if owner in self._by_owner:
                self._by_owner[owner].deletes.discard(pod_uid)

    def satisfied(self, owner: str) -> bool:
        with self._lock:
            expected = self._by_owner.get(owner)
            if expected is None:
                return True
            if expected.adds <= 0 and not expected.deletes:
                return True
            return self._clock() - expected.since > EXPECTATIONS_TIMEOUT_S

    def forget(self, owner: str) -> None:
        with self._lock:
            self._by_owner.pop(owner, None)


def write_status(
    api: ClusterApi, resource: Resource, obj: JsonObject, build: Callable[[JsonObject], JsonObject]
) -> None:
    """Replace ``status`` with ``build(stored object)`` unless unchanged; retried on conflicts."""
    current = obj
    for attempt in range(_ATTEMPTS):
        status = build(current)
        if status == current.get("status"):
            return
        try:
            api.update_status(resource, {**current, "status": status})
            return
        except ApiNotFoundError:
            return
        except ConflictError:
            if attempt == _ATTEMPTS - 1:
                raise
            current = api.get(resource, name=name_of(obj), namespace=namespace_of(obj))


def delete_pod(api: ClusterApi, pod: JsonObject) -> None:
    with contextlib.suppress(ApiNotFoundError, ConflictError):
        api.delete(PODS, name=name_of(pod), namespace=namespace_of(pod), uid=uid_of(pod))
