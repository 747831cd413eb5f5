"""Shadow ResourceClaims for classic ``nvidia.com/mig-<profile>: N`` pods (docs/design.md F6).

Every MIG slice is one allocated claim, also for pods that ask the classic way: for each container
(init containers too) and profile, the controller creates a claim *owned by the pod* (controller
owner, ``blockOwnerDeletion``: garbage collection removes it with the pod) with one request of
``N`` devices on the profile's DeviceClass. Its name is derived from the pod (name, UID prefix,
container, profile), so a retry after a crash finds the claim it created instead of creating a
second one. Labels ``instaslice.dev/shadow-for-pod=<pod uid>`` and ``instaslice.dev/profile``
(``+`` spelled ``_``, label values cannot hold ``+``; the exact profile is in the annotation of the
same name) and annotation ``instaslice.dev/container`` tell the node's device-plugin shim which
slices belong to which container.

The allocator allocates shadow claims like any claim, with ``reservedFor`` the pod, gives the pod a
``nodeSelector`` for the chosen node while it is still gated, then ungates it. When the pod finishes
(Succeeded/Failed) nothing in Kubernetes releases its shadow claims (the pod does not reference
them), so ``release`` clears their allocation and the slices return to the pool; it does the same
for a pod that is gone, and lets a shadow claim being deleted go (``shadowrelease`` decides when).
"""

from __future__ import annotations

import copy
import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from api.names import (
    CLASSIC_RESOURCE_PREFIX,
    DELETE_PROTECTION_FINALIZER,
    SHADOW_CLAIM_CONTAINER_ANNOTATION,
    SHADOW_CLAIM_LABEL,
    SHADOW_CLAIM_PROFILE_LABEL,
    profile_device_class,
)
from controller.cel_library import Quantity
from controller.conditions import PlacementProblem, Reason
from driver.cluster import ops
from driver.cluster.port import (
    PODS,
    RESOURCE_CLAIMS,
    ClusterApi,
    JsonObject,
    name_of,
    namespace_of,
    uid_of,
)
from driver.errors import AlreadyExistsError, ApiNotFoundError
from driver.mig.naming import profile_label

logger = logging.getLogger(__name__)

SHADOW_REQUEST = "mig"
"""The request name in every shadow claim."""
_MAX_NAME = 253


@dataclass(frozen=True, slots=True)
class ClassicRequest:
    container: str
    profile: str
    count: int


def classic_requests(pod: JsonObject, *, profiles: Mapping[str, str]) -> list[ClassicRequest]:
    """The pod's classic MIG requests; ``profiles`` maps resource names to profile names.

    ``PlacementProblem`` (``UnknownProfile`` / ``InvalidRequest``) for a resource no profile has or
    a count that is not a whole number.
    """
    found: list[ClassicRequest] = []
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = container.get("resources") or {}
        amounts = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        for resource in sorted(amounts):
            if not resource.startswith(CLASSIC_RESOURCE_PREFIX):
                continue
            where = f"container {container.get('name')!r}: {resource}"
            try:
                value = Quantity.parse(str(amounts[resource])).value
            except ValueError:
                value = Fraction(-1)
            if value.denominator != 1 or value < 0:
                raise PlacementProblem(
                    Reason.INVALID_REQUEST, f"{where} must be a whole number of slices"
                )
            if value == 0:
                continue
            profile = profiles.get(resource)
            if profile is None:
                known = ", ".join(sorted(profiles)) or "none"
                raise PlacementProblem(
                    Reason.UNKNOWN_PROFILE, f"{where} is an unknown MIG profile (known: {known})"
                )
            found.append(
                ClassicRequest(
                    container=str(container.get("name", "")), profile=profile, count=int(value)
                )
            )
    return found


def shadow_claim_name(pod: JsonObject, request: ClassicRequest) -> str:
    name = (
        f"{name_of(pod)}-{uid_of(pod)[:8]}-{request.container}-{profile_label(request.profile)}"
    ).lower()
    if len(name) > _MAX_NAME:
        digest = hashlib.sha256(name.encode()).hexdigest()[:10]
        name = f"{name[: _MAX_NAME - 11].rstrip('-.')}-{digest}"
    return name


def shadow_claim(pod: JsonObject, request: ClassicRequest) -> JsonObject:
    """The claim to create for one classic request of ``pod``."""
    return {
        "apiVersion": RESOURCE_CLAIMS.api_version,
        "kind": RESOURCE_CLAIMS.kind,
        "metadata": {
            "name": shadow_claim_name(pod, request),
            "namespace": namespace_of(pod),
            "labels": {
                SHADOW_CLAIM_LABEL: uid_of(pod),
                SHADOW_CLAIM_PROFILE_LABEL: request.profile.replace("+", "_"),
            },
            "annotations": {
                SHADOW_CLAIM_CONTAINER_ANNOTATION: request.container,
                SHADOW_CLAIM_PROFILE_LABEL: request.profile,
            },
            "ownerReferences": [ops.owner_reference(PODS, pod)],
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": SHADOW_REQUEST,
                        "exactly": {
                            "deviceClassName": profile_device_class(request.profile),
                            "allocationMode": "ExactCount",
                            "count": request.count,
                        },
                    }
                ]
            }
        },
    }


def is_shadow_of(claim: JsonObject, pod: JsonObject) -> bool:
    labels = (claim.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(SHADOW_CLAIM_LABEL) == uid_of(pod))


def ensure_shadow_claims(
    api: ClusterApi,
    pod: JsonObject,
    requests: list[ClassicRequest],
    *,
    cached: Callable[[str, str], JsonObject | None],
) -> list[JsonObject]:
    """The shadow claims of ``pod``, created where missing (idempotent: deterministic names)."""
    claims = []
    namespace = namespace_of(pod) or "default"
    for request in requests:
        wanted = shadow_claim(pod, request)
        name = name_of(wanted)
        claim = cached(namespace, name)
        if claim is None:
            try:
                claim = api.create(RESOURCE_CLAIMS, wanted, namespace=namespace)
                logger.info("created shadow claim %s/%s for pod %s", namespace, name, name_of(pod))
            except AlreadyExistsError:
                claim = api.get(RESOURCE_CLAIMS, name=name, namespace=namespace)
        if not is_shadow_of(claim, pod):
            raise PlacementProblem(
                Reason.INVALID_REQUEST,
                f"ResourceClaim {namespace}/{name} exists and is not this pod's shadow claim",
            )
        claims.append(claim)
    return claims


def holds_something(claim: JsonObject) -> bool:
    """Whether releasing the claim would change it: an allocation, a reservation, or (being
    deleted) the delete-protection finalizer that keeps it."""
    status = claim.get("status") or {}
    return bool(status.get("allocation") or status.get("reservedFor")) or _kept_from_deletion(claim)


def _kept_from_deletion(claim: JsonObject) -> bool:
    meta = claim.get("metadata") or {}
    return bool(meta.get("deletionTimestamp")) and DELETE_PROTECTION_FINALIZER in (
        meta.get("finalizers") or []
    )


def release(api: ClusterApi, claim: JsonObject, *, pod_uid: str) -> bool:
    """Release the shadow claim of a pod that finished or is gone; True if an allocation was cleared.

    The pod leaves ``status.reservedFor``; with no consumer left the allocation goes too (one
    ``/status`` write, resourceVersion-checked: ``ConflictError`` means re-read and call again). A
    claim being deleted and no longer reserved then loses the delete-protection finalizer, so its
    deletion completes: kube-controller-manager would lift it too, but nothing may ever make it look
    at the claim again (docs/design.md F3 and F6). Only call it once the pod is known finished or gone.
    """
    status = claim.get("status") or {}
    reserved = status.get("reservedFor") or []
    others = [ref for ref in reserved if str(ref.get("uid") or "") != pod_uid]
    cleared = False
    if not others and (status.get("allocation") or reserved):
        cleared = bool(status.get("allocation"))
        claim = ops.clear_claim_allocation(api, claim=claim)
        logger.info("released shadow claim %s/%s", namespace_of(claim), name_of(claim))
    elif len(others) < len(reserved):
        updated = copy.deepcopy(claim)
        updated["status"]["reservedFor"] = others
        claim = api.update_status(RESOURCE_CLAIMS, updated)
        logger.info(
            "shadow claim %s/%s: pod %s no longer reserves it (%d consumer(s) left)",
            namespace_of(claim),
            name_of(claim),
            pod_uid,
            len(others),
        )
    status = claim.get("status") or {}
    if _kept_from_deletion(claim) and not (status.get("reservedFor") or status.get("allocation")):
        _drop_delete_protection(api, claim)
    return cleared


def _drop_delete_protection(api: ClusterApi, claim: JsonObject) -> None:
    """Lift the finalizer of an unreserved, unallocated claim being deleted (a normal update)."""
    updated = copy.deepcopy(claim)
    meta = updated["metadata"]
    meta["finalizers"] = [
        f for f in meta.get("finalizers") or [] if f != DELETE_PROTECTION_FINALIZER
    ]
    try:
        api.update(RESOURCE_CLAIMS, updated)
    except ApiNotFoundError:
        return  # deleted meanwhile: what we wanted
    logger.info(
        "shadow claim %s/%s: %s removed, deletion completes",
        namespace_of(claim),
        name_of(claim),
        DELETE_PROTECTION_FINALIZER,
    )
