"""The writes our daemons make, each with the wire semantics Kubernetes requires of it.

Functions over the ``ClusterApi`` port, so every adapter (and every fake) gets the same rules:
optimistic concurrency everywhere (a stale object raises ``ConflictError``: re-read and recompute,
never force), the claim finalizer before an allocation and the allocation timestamp in it (docs/design.md
F2 and F3), gates only ever removed and only our own (F4). Objects passed in are never
mutated — they may be informer-cache dicts.
"""

from __future__ import annotations

import copy
import logging
from datetime import datetime

from api import wire
from api.names import DELETE_PROTECTION_FINALIZER, SCHEDULING_GATE
from driver.cluster.port import (
    PODS,
    RESOURCE_CLAIMS,
    Body,
    ClusterApi,
    JsonObject,
    PatchType,
    Resource,
    format_time,
    gate_names,
    name_of,
    namespace_of,
    uid_of,
)
from driver.cluster.views import ClaimView, PodView, mapping, path
from driver.errors import ConflictError, InvalidError

logger = logging.getLogger(__name__)

_ATTEMPTS = 3


def remove_scheduling_gate(
    api: ClusterApi, *, pod: JsonObject, gate: str = SCHEDULING_GATE
) -> JsonObject:
    """Lift ``gate`` from the pod, keeping every other gate; return the pod as written.

    A JSON patch guarded by a ``test`` of the whole gate list: it succeeds however stale ``pod``
    is in other fields, and can never drop a gate someone else added or lifted meanwhile (the test
    fails, we re-read and try again). Idempotent: a pod without the gate is returned unchanged.
    """
    namespace, name, uid = namespace_of(pod), name_of(pod), uid_of(pod)
    for _ in range(_ATTEMPTS):
        current = gate_names(pod)
        if gate not in current:
            return pod
        # the wire list itself: the ``test`` must match what the API server holds
        gates = path(pod, "spec", "schedulingGates") or []
        ops: list[wire.JsonPatchOperation] = [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "test", "path": "/spec/schedulingGates", "value": gates},
            {
                "op": "replace",
                "path": "/spec/schedulingGates",
                "value": [g for g in gates if path(g, "name") != gate],
            },
        ]
        try:
            return api.patch(
                PODS, name=name, namespace=namespace, patch=ops, patch_type=PatchType.JSON
            )
        except InvalidError as exc:
            # A failed ``test`` is a lost race, not a bad request: look again.
            pod = api.get(PODS, name=name, namespace=namespace)
            if uid_of(pod) != uid:
                raise ConflictError(f"pod {namespace}/{name} was replaced") from exc
            if gate_names(pod) == current:
                raise  # the gates did not change: the server refused for another reason
    raise ConflictError(f"pod {namespace}/{name}: gates kept changing; gate {gate} not removed")


def set_pod_node_selector(
    api: ClusterApi, *, pod: JsonObject, node_selector: dict[str, str]
) -> JsonObject:
    """Merge ``node_selector`` into the pod's ``spec.nodeSelector`` — allowed only while the pod is
    gated, so it is guarded by a ``test`` that the pod is the same and still carries its gates."""
    gates = path(pod, "spec", "schedulingGates") or []
    if not gates:
        raise InvalidError(f"pod {namespace_of(pod)}/{name_of(pod)} is not gated")
    merged = {**PodView.of(pod).node_selector, **node_selector}
    ops: list[wire.JsonPatchOperation] = [
        {"op": "test", "path": "/metadata/uid", "value": uid_of(pod)},
        {"op": "test", "path": "/spec/schedulingGates", "value": gates},
        {"op": "add", "path": "/spec/nodeSelector", "value": merged},
    ]
    return api.patch(
        PODS, name=name_of(pod), namespace=namespace_of(pod), patch=ops, patch_type=PatchType.JSON
    )


def nominate_node(api: ClusterApi, *, pod: JsonObject, node: str) -> JsonObject:
    """Set the pod's ``status.nominatedNodeName`` to ``node``: where it will be bound (F24).

    kube-scheduler (1.35+, ``NominatedNodeNameForExpectation``) writes it itself before binding
    a pod with ResourceClaims unless it already names the chosen node, and tries a nominated node
    before filtering every node; set before the gate goes, it saves kube-scheduler a write through
    its rate-limited client and a search. A JSON patch of ``/status`` guarded by a ``test`` of the
    UID (never the hint of a re-created pod of the same name); a pod that names ``node`` already
    is returned unchanged.
    """
    if path(pod, "status", "nominatedNodeName") == node:
        return pod
    ops: list[wire.JsonPatchOperation] = [
        {"op": "test", "path": "/metadata/uid", "value": uid_of(pod)},
        {"op": "add", "path": "/status/nominatedNodeName", "value": node},
    ]
    return api.patch(
        PODS,
        name=name_of(pod),
        namespace=namespace_of(pod),
        patch=ops,
        patch_type=PatchType.JSON,
        subresource="status",
    )


def set_pod_annotation(api: ClusterApi, *, pod: JsonObject, key: str, value: str) -> JsonObject:
    """Set one annotation of the pod (a JSON patch guarded by a ``test`` of the UID, so a pod
    re-created under the same name is never annotated for the one it replaced)."""
    ops: list[wire.JsonPatchOperation] = [
        {"op": "test", "path": "/metadata/uid", "value": uid_of(pod)}
    ]
    if isinstance(path(pod, "metadata", "annotations"), dict):
        # one member, so that annotations others add meanwhile are kept (RFC 6901 escapes)
        member = key.replace("~", "~0").replace("/", "~1")
        ops.append({"op": "add", "path": f"/metadata/annotations/{member}", "value": value})
    else:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {key: value}})
    return api.patch(
        PODS, name=name_of(pod), namespace=namespace_of(pod), patch=ops, patch_type=PatchType.JSON
    )


def set_pod_condition(
    api: ClusterApi,
    *,
    pod: JsonObject,
    condition_type: str,
    status: str,
    reason: str,
    message: str,
    now: datetime,
) -> JsonObject:
    """Set one condition on ``pod.status.conditions`` (others untouched) through ``/status``.

    ``lastTransitionTime`` moves only when ``status`` changes; an identical condition is not
    rewritten. Conflicts re-read the pod and retry a few times.
    """
    namespace, name = namespace_of(pod), name_of(pod)
    for attempt in range(_ATTEMPTS):
        view = PodView.of(pod)
        existing = view.condition(condition_type)
        if existing is not None and (existing.status, existing.reason, existing.message) == (
            status,
            reason,
            message,
        ):
            return pod
        condition: wire.PodCondition = {
            "type": condition_type,
            "status": status,
            "reason": reason,
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": (
                existing.last_transition_time
                if existing is not None
                and existing.status == status
                and existing.last_transition_time
                else format_time(now)
            ),
        }
        updated = copy.deepcopy(pod)
        updated.setdefault("status", {})["conditions"] = [
            condition if c is existing else copy.deepcopy(dict(c.raw)) for c in view.conditions
        ] + ([] if existing is not None else [condition])
        try:
            return api.update_status(PODS, updated)
        except ConflictError:
            if attempt == _ATTEMPTS - 1:
                raise
            pod = api.get(PODS, name=name, namespace=namespace)
    raise AssertionError("unreachable")


def add_claim_finalizer(
    api: ClusterApi, *, claim: JsonObject, finalizer: str = DELETE_PROTECTION_FINALIZER
) -> JsonObject:
    """Add the delete-protection finalizer (a normal update, resourceVersion-checked) — required
    before writing an allocation (docs/design.md F3). No write if it is already there."""
    finalizers = ClaimView.of(claim).meta.finalizers
    if finalizer in finalizers:
        return claim
    # shallow copies of what changes: the cached claim is never mutated, and a deep copy of the
    # whole claim per placed pod cost more CPU than the rest of the write
    updated = {**claim, "metadata": {**claim["metadata"], "finalizers": [*finalizers, finalizer]}}
    return api.update(RESOURCE_CLAIMS, updated)


def write_claim_allocation(
    api: ClusterApi,
    *,
    claim: JsonObject,
    allocation: wire.AllocationResult,
    allocated_at: datetime,
    reserved_for: list[wire.ResourceClaimConsumerReference] | None = None,
) -> JsonObject:
    """Write ``status.allocation`` (with ``allocationTimestamp``, docs/design.md F2) through
    ``/status`` with the claim's resourceVersion. ``reserved_for`` is set too when given (the
    controller reserves each claim for the pod it allocates it for, so kube-scheduler has no claim
    write left to do before binding)."""
    view = ClaimView.of(claim)
    if DELETE_PROTECTION_FINALIZER not in view.meta.finalizers:
        raise ValueError(
            f"claim {namespace_of(claim)}/{name_of(claim)} lacks {DELETE_PROTECTION_FINALIZER}; "
            "call add_claim_finalizer first"
        )
    if view.allocated:
        raise ConflictError(f"claim {namespace_of(claim)}/{name_of(claim)} is already allocated")
    written: wire.ResourceClaimStatus = {
        "allocation": {**allocation, "allocationTimestamp": format_time(allocated_at)}
    }
    if reserved_for is not None:
        written["reservedFor"] = [entry.copy() for entry in reserved_for]
    status = {**mapping(path(claim, "status")), **written}
    return api.update_status(RESOURCE_CLAIMS, {**claim, "status": status})


def clear_claim_allocation(api: ClusterApi, *, claim: JsonObject) -> JsonObject:
    """Deallocate: drop ``allocation``, ``reservedFor`` and per-device status in one ``/status``
    update (resourceVersion-checked). Used for shadow claims of finished pods (docs/design.md F6)."""
    updated = copy.deepcopy(claim)
    status = updated.setdefault("status", {})
    for key in ("allocation", "reservedFor", "devices"):
        status.pop(key, None)
    return api.update_status(RESOURCE_CLAIMS, updated)


def owner_reference(
    resource: Resource, owner: Body, *, controller: bool = True, block_deletion: bool = True
) -> wire.OwnerReference:
    """An ``ownerReferences`` entry pointing at ``owner`` (garbage collection follows it)."""
    return {
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "name": name_of(owner),
        "uid": uid_of(owner),
        "controller": controller,
        "blockOwnerDeletion": block_deletion,
    }


def pod_reference(pod: Body) -> wire.ResourceClaimConsumerReference:
    """A ``status.reservedFor`` entry for a pod."""
    return {"resource": "pods", "name": name_of(pod), "uid": uid_of(pod)}
