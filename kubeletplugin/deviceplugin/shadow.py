"""Shadow claims as the node sees them: read from the API server, and handed from pod to pod.

The controller stands for each classic request (``nvidia.com/mig-<profile>: N`` in one container)
with shadow ResourceClaims in the pod's namespace (docs/design.md "Classic pod"): owned by the pod (a
controller ``ownerReference``, so garbage collection removes them with it), labelled
``instaslice.dev/shadow-for-pod=<pod UID>``, annotated ``instaslice.dev/container=<container>``,
allocated to devices of our driver on one node and reserved for the pod. One claim may hold one
slice or ``count: N`` slices; the container's claims together hold N.

The profile is read from the allocated devices (this node's inventory), not from the
``instaslice.dev/profile`` label: the allocation is what the slice is made from, and label values
cannot spell every profile name (``+`` is not allowed in them).

``move_claim`` changes which pod and container a claim stands for — owner reference, label,
annotation, and the pod in ``status.reservedFor`` (kube-controller-manager deallocates a claim whose
reserved pods are all gone, so it must name the pod that really uses the slice). Two writes, each
resourceVersion-checked; a ``ConflictError`` means someone else changed the claim: the next
reconcile pass recomputes.
"""

import copy
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from api import wire
from api.names import (
    DRIVER_NAME,
    SHADOW_CLAIM_CONTAINER_ANNOTATION,
    SHADOW_CLAIM_LABEL,
)
from driver.cluster.port import PODS, RESOURCE_CLAIMS, ClusterApi, JsonObject
from driver.cluster.views import ClaimView, items, path
from driver.ids import ClaimUid, PodUid
from kubeletplugin.node.inventory import NodeInventory
from kubeletplugin.state.claims import allocated_nodes

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, order=True)
class Slot:
    """Who a shadow claim stands for: one container of one pod."""

    namespace: str
    pod_uid: PodUid
    pod_name: str
    container: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod_name}[{self.container}] ({self.pod_uid})"


@dataclass(frozen=True, slots=True)
class ShadowClaim:
    """A shadow claim allocated to this node."""

    uid: ClaimUid
    namespace: str
    name: str
    created: str
    """``metadata.creationTimestamp``: older reservations are served first."""
    slot: Slot | None
    """None when the claim names no pod owner (not written by our controller)."""
    profile: str
    devices: tuple[str, ...]
    """Our driver's allocated device names, in allocation order."""
    deleting: bool
    obj: JsonObject = field(compare=False, repr=False)

    @property
    def shape(self) -> tuple[str, int]:
        """(profile, number of slices): claims of one shape can stand in for each other."""
        return (self.profile, len(self.devices))

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


def claim_slot(claim: ClaimView) -> Slot | None:
    """The pod and container a shadow claim stands for, from its owner reference and annotation."""
    owners = [ref for ref in claim.meta.owners if ref.kind == "Pod"]
    owner = next((ref for ref in owners if ref.controller), owners[0] if owners else None)
    label = claim.meta.labels.get(SHADOW_CLAIM_LABEL)
    if owner is None or not owner.uid or (label and label != owner.uid):
        return None
    return Slot(
        namespace=claim.namespace,
        pod_uid=PodUid(owner.uid),
        pod_name=owner.name,
        container=claim.meta.annotations.get(SHADOW_CLAIM_CONTAINER_ANNOTATION, ""),
    )


def parse_shadow_claim(
    obj: JsonObject, *, node_name: str, inventory: NodeInventory
) -> ShadowClaim | None:
    """The claim if it is a shadow claim allocated to devices of one profile on this node."""
    claim = ClaimView.of(obj)
    if SHADOW_CLAIM_LABEL not in claim.meta.labels:
        return None
    allocation = claim.allocation
    if allocation is None:
        return None
    nodes = allocated_nodes(allocation)
    if nodes is not None and node_name not in nodes:
        return None
    results = allocation.results_of(DRIVER_NAME)
    if not results or any(r.pool != node_name for r in results):
        return None
    devices = tuple(r.device for r in results)
    profiles = {d.profile.name for name in devices if (d := inventory.devices.get(name))}
    if len(profiles) != 1 or any(name not in inventory.devices for name in devices):
        logger.warning(
            "shadow claim %s/%s: devices %s are not one profile of this node's inventory; skipped",
            claim.meta.namespace,
            claim.name,
            ", ".join(devices),
        )
        return None
    return ShadowClaim(
        uid=ClaimUid(claim.uid),
        namespace=claim.namespace,
        name=claim.name,
        created=claim.meta.creation_timestamp,
        slot=claim_slot(claim),
        profile=profiles.pop(),
        devices=devices,
        deleting=claim.meta.deleting,
        obj=obj,
    )


def list_shadow_claims(
    api: ClusterApi, *, node_name: str, inventory: NodeInventory
) -> list[ShadowClaim]:
    """Every shadow claim allocated to this node (one list call; raises ``ClusterError``)."""
    objs = api.list_objects(RESOURCE_CLAIMS, label_selector=SHADOW_CLAIM_LABEL).items
    parsed = (parse_shadow_claim(o, node_name=node_name, inventory=inventory) for o in objs)
    return sorted((c for c in parsed if c is not None), key=lambda c: (c.created, c.name))


def _owner_reference(slot: Slot) -> wire.OwnerReference:
    return {
        "apiVersion": PODS.api_version,
        "kind": PODS.kind,
        "name": slot.pod_name,
        "uid": slot.pod_uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def moved_metadata(obj: JsonObject, to: Slot) -> JsonObject:
    """A copy of the claim standing for ``to``: pod owner, label and container annotation."""
    updated = copy.deepcopy(obj)
    meta = updated.setdefault("metadata", {})
    others = [ref for ref in items(path(meta, "ownerReferences")) if path(ref, "kind") != "Pod"]
    meta["ownerReferences"] = [*others, _owner_reference(to)]
    meta.setdefault("labels", {})[SHADOW_CLAIM_LABEL] = to.pod_uid
    meta.setdefault("annotations", {})[SHADOW_CLAIM_CONTAINER_ANNOTATION] = to.container
    return updated


def moved_reservations(reserved: Sequence[Mapping[str, Any]], to: Slot) -> list[Mapping[str, Any]]:
    """``status.reservedFor`` with its pod entries replaced by ``to``'s pod (once)."""
    others = [r for r in reserved if path(r, "resource") != "pods"]
    if len(others) == len(reserved):
        return list(reserved)
    pod: wire.ResourceClaimConsumerReference = {
        "resource": "pods",
        "name": to.pod_name,
        "uid": to.pod_uid,
    }
    return [*others, pod]


def move_claim(api: ClusterApi, claim: ShadowClaim, to: Slot) -> JsonObject:
    """Make ``claim`` stand for ``to`` in the API server; returns the claim as written."""
    written = api.update(RESOURCE_CLAIMS, moved_metadata(claim.obj, to))
    reserved = list(items(path(written, "status", "reservedFor")))
    wanted = moved_reservations(reserved, to)
    if wanted != reserved:
        status_update = copy.deepcopy(written)
        status_update["status"]["reservedFor"] = wanted
        written = api.update_status(RESOURCE_CLAIMS, status_update)
    logger.info(
        "shadow claim %s now stands for %s (was %s)",
        claim,
        to,
        claim.slot,
        extra={"claim_uid": claim.uid, "pod_uid": to.pod_uid},
    )
    return written


def by_uid(claims: Iterable[ShadowClaim]) -> dict[ClaimUid, ShadowClaim]:
    return {c.uid: c for c in claims}
