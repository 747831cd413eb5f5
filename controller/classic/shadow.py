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

from api import wire
from api.names import (
    CLASSIC_RESOURCE_PREFIX,
    DELETE_PROTECTION_FINALIZER,
    SHADOW_CLAIM_CONTAINER_ANNOTATION,
    SHADOW_CLAIM_LABEL,
    SHADOW_CLAIM_PROFILE_LABEL,
    profile_device_class,
)
from controller.allocation.cel_library import Quantity
from controller.allocation.conditions import PlacementProblem, Reason
from driver.cluster import ops
from driver.cluster.port import PODS, RESOURCE_CLAIMS, ClusterApi, JsonObject
from driver.cluster.views import ClaimView, PodView
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


def _pod(pod: JsonObject | PodView) -> PodView:
    return pod if isinstance(pod, PodView) else PodView.of(pod)


def asks_classic(pod: JsonObject | PodView) -> bool:
    """Whether a container requests or limits a classic MIG resource: ``classic_requests`` of a
    pod that does not is empty, whatever the profiles."""
    return _pod(pod).requests_resource(_is_classic_name)


def _is_classic_name(name: str) -> bool:
    return name.startswith(CLASSIC_RESOURCE_PREFIX)


def classic_requests(
    pod: JsonObject | PodView, *, profiles: Mapping[str, str]
) -> list[ClassicRequest]:
    """The pod's classic MIG requests; ``profiles`` maps resource names to profile names.

    ``PlacementProblem`` (``UnknownProfile`` / ``InvalidRequest``) for a resource no profile has or
    a count that is not a whole number.
    """
    found: list[ClassicRequest] = []
    for container in _pod(pod).all_containers:
        amounts = container.amounts()  # a limit wins over a request (they must match)
        for resource in sorted(amounts):
            if not resource.startswith(CLASSIC_RESOURCE_PREFIX):
                continue
            where = f"container {container.name!r}: {resource}"
            try:
                value = Quantity.parse(amounts[resource]).value
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
                ClassicRequest(container=container.name, profile=profile, count=int(value))
            )
    return found


def shadow_claim_name(pod: JsonObject | PodView, request: ClassicRequest) -> str:
    view = _pod(pod)
    name = (
        f"{view.name}-{view.uid[:8]}-{request.container}-{profile_label(request.profile)}"
    ).lower()
    if len(name) > _MAX_NAME:
        digest = hashlib.sha256(name.encode()).hexdigest()[:10]
        name = f"{name[: _MAX_NAME - 11].rstrip('-.')}-{digest}"
    return name


def shadow_claim(pod: JsonObject | PodView, request: ClassicRequest) -> wire.ResourceClaim:
    """The claim to create for one classic request of ``pod``."""
    view = _pod(pod)
    return {
        "apiVersion": RESOURCE_CLAIMS.api_version,
        "kind": RESOURCE_CLAIMS.kind,
        "metadata": {
            "name": shadow_claim_name(view, request),
            "namespace": view.namespace,
            "labels": {
                SHADOW_CLAIM_LABEL: view.uid,
                SHADOW_CLAIM_PROFILE_LABEL: request.profile.replace("+", "_"),
            },
            "annotations": {
                SHADOW_CLAIM_CONTAINER_ANNOTATION: request.container,
                SHADOW_CLAIM_PROFILE_LABEL: request.profile,
            },
            "ownerReferences": [ops.owner_reference(PODS, view.raw)],
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


def is_shadow_of(claim: JsonObject | ClaimView, pod: PodView) -> bool:
    return _claim(claim).meta.labels.get(SHADOW_CLAIM_LABEL) == pod.uid


def ensure_shadow_claims(
    api: ClusterApi,
    pod: JsonObject | PodView,
    requests: list[ClassicRequest],
    *,
    cached: Callable[[str, str], JsonObject | None],
) -> list[JsonObject]:
    """The shadow claims of ``pod``, created where missing (idempotent: deterministic names)."""
    view = _pod(pod)
    claims = []
    namespace = view.namespace or "default"
    for request in requests:
        name = shadow_claim_name(view, request)
        claim = cached(namespace, name)
        if claim is None:
            try:
                claim = api.create(
                    RESOURCE_CLAIMS, shadow_claim(view, request), namespace=namespace
                )
                logger.info("created shadow claim %s/%s for pod %s", namespace, name, view.name)
            except AlreadyExistsError:
                claim = api.get(RESOURCE_CLAIMS, name=name, namespace=namespace)
        if not is_shadow_of(claim, view):
            raise PlacementProblem(
                Reason.INVALID_REQUEST,
                f"ResourceClaim {namespace}/{name} exists and is not this pod's shadow claim",
            )
        claims.append(claim)
    return claims


def _claim(claim: JsonObject | ClaimView) -> ClaimView:
    return claim if isinstance(claim, ClaimView) else ClaimView.of(claim)


def holds_something(claim: JsonObject | ClaimView) -> bool:
    """Whether releasing the claim would change it: an allocation, a reservation, or (being
    deleted) the delete-protection finalizer that keeps it."""
    view = _claim(claim)
    return view.allocated or bool(view.reserved_for) or _kept_from_deletion(view)


def _kept_from_deletion(claim: ClaimView) -> bool:
    return claim.meta.deleting and DELETE_PROTECTION_FINALIZER in claim.meta.finalizers


def release(api: ClusterApi, claim: JsonObject | ClaimView, *, pod_uid: str) -> bool:
    """Release the shadow claim of a pod that finished or is gone; True if an allocation was cleared.

    The pod leaves ``status.reservedFor``; with no consumer left the allocation goes too (one
    ``/status`` write, resourceVersion-checked: ``ConflictError`` means re-read and call again). A
    claim being deleted and no longer reserved then loses the delete-protection finalizer, so its
    deletion completes: kube-controller-manager would lift it too, but nothing may ever make it look
    at the claim again (docs/design.md F3 and F6). Only call it once the pod is known finished or gone.
    """
    view = _claim(claim)
    reserved = view.reserved_for
    others = [ref for ref in reserved if ref.uid != pod_uid]
    cleared = False
    if not others and (view.allocated or reserved):
        cleared = view.allocated
        view = ClaimView.of(ops.clear_claim_allocation(api, claim=view.raw))
        logger.info("released shadow claim %s/%s", view.namespace, view.name)
    elif len(others) < len(reserved):
        updated = copy.deepcopy(view.raw)
        updated["status"]["reservedFor"] = [dict(ref.raw) for ref in others]
        view = ClaimView.of(api.update_status(RESOURCE_CLAIMS, updated))
        logger.info(
            "shadow claim %s/%s: pod %s no longer reserves it (%d consumer(s) left)",
            view.namespace,
            view.name,
            pod_uid,
            len(others),
        )
    if _kept_from_deletion(view) and not (view.reserved_for or view.allocated):
        _drop_delete_protection(api, view)
    return cleared


def _drop_delete_protection(api: ClusterApi, claim: ClaimView) -> None:
    """Lift the finalizer of an unreserved, unallocated claim being deleted (a normal update)."""
    updated = copy.deepcopy(claim.raw)
    updated["metadata"]["finalizers"] = [
        f for f in claim.meta.finalizers if f != DELETE_PROTECTION_FINALIZER
    ]
    try:
        api.update(RESOURCE_CLAIMS, updated)
    except ApiNotFoundError:
        return  # deleted meanwhile: what we wanted
    logger.info(
        "shadow claim %s/%s: %s removed, deletion completes",
        claim.namespace,
        claim.name,
        DELETE_PROTECTION_FINALIZER,
    )
