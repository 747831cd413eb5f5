"""Which claims a gated pod needs, which of them are ours, and where allocated ones pin the pod.

A pod's DRA claims are named in ``spec.resourceClaims``: directly (``resourceClaimName``) or through
a template, whose generated claim kube-controller-manager records in
``pod.status.resourceClaimStatuses`` (``resourceClaimName: null`` there means no claim is needed).
Until every claim exists the pod waits (``NotReady``): it is looked at again when the pod's status
or the claim changes. A claim is *ours* when a request names one of our DeviceClasses; a claim that
mixes our classes with another driver's cannot be allocated by us alone (``InvalidRequest``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from api.names import DRIVER_NAME, is_our_device_class_name
from controller.allocation.conditions import PlacementProblem, Reason
from driver.cluster.port import JsonObject
from driver.cluster.views import ClaimView, DeviceClassView, PodView

ClaimLookup = Callable[[str, str], JsonObject | None]
"""(namespace, name) → the cached claim, or None."""
ClassLookup = Callable[[str], JsonObject | None]


class NotReady(Exception):  # noqa: N818 - a state, not a failure: the pod waits for Kubernetes
    """The pod cannot be considered yet (a claim not created, a claim being deleted)."""


is_our_class_name = is_our_device_class_name


def is_our_class(name: str, device_class: JsonObject | None) -> bool:
    """Our classes: ours by name, or any class whose selectors name our driver."""
    if is_our_class_name(name):
        return True
    if device_class is None:
        return False
    return any(
        DRIVER_NAME in expression for expression in DeviceClassView.of(device_class).selectors
    )


def claim_is_ours(claim: ClaimView, classes: ClassLookup) -> bool:
    """Whether the claim uses our classes; ``InvalidRequest`` if it mixes them with others'."""
    names = claim.spec.device_class_names()
    ours = [is_our_class(n, classes(n)) for n in names]
    if any(ours) and not all(ours):
        foreign = sorted(n for n, mine in zip(names, ours, strict=True) if not mine)
        raise PlacementProblem(
            Reason.INVALID_REQUEST,
            f"claim {claim.name} mixes MIG slices with DeviceClasses of other drivers "
            f"({', '.join(foreign)}); put them in separate claims",
        )
    return any(ours)


def dra_claims(pod: PodView, *, claims: ClaimLookup) -> list[ClaimView]:
    """Every ResourceClaim the pod references, in ``spec.resourceClaims`` order."""
    namespace = pod.namespace or "default"
    found: list[ClaimView] = []
    for ref in pod.claim_refs:
        if ref.claim_name:
            name = ref.claim_name
        elif ref.template_name:
            if ref.name not in pod.claim_statuses:
                raise NotReady(f"the claim of {ref.name!r} is not created yet")
            generated = pod.claim_statuses[ref.name]
            if not generated:
                continue  # kube decided no claim is needed
            name = generated
        else:
            continue
        obj = claims(namespace, name)
        if obj is None:
            raise NotReady(f"ResourceClaim {namespace}/{name} does not exist yet")
        claim = ClaimView.of(obj)
        if claim.meta.deleting:
            raise NotReady(f"ResourceClaim {namespace}/{name} is being deleted")
        if ref.template_name and not claim.meta.owned_by(pod.uid):
            raise NotReady(f"ResourceClaim {namespace}/{name} is not owned by the pod")
        found.append(claim)
    return found


@dataclass(slots=True)
class PodClaims:
    """The claims one pod needs, sorted out for the allocator."""

    ours: list[ClaimView] = field(default_factory=list)
    """Claims of our driver (DRA claims and shadow claims), each once."""
    shadow: set[str] = field(default_factory=set)
    """UIDs of the shadow claims among ``ours``."""
    pinned: list[frozenset[str]] = field(default_factory=list)
    """Per already allocated claim of the pod (ours or not), the nodes its allocation allows."""
    foreign: int = 0

    @property
    def to_allocate(self) -> list[ClaimView]:
        return [c for c in self.ours if not c.allocated]

    @property
    def allocated(self) -> list[ClaimView]:
        return [c for c in self.ours if c.allocated]

    def allows(self, node: str) -> bool:
        """Whether every allocated claim of the pod allows ``node``."""
        return all(node in nodes for nodes in self.pinned)


def sort_claims(
    dra: Sequence[ClaimView], shadow: Sequence[ClaimView], *, classes: ClassLookup
) -> PodClaims:
    result = PodClaims()
    seen: set[str] = set()
    shadow_uids = {c.uid for c in shadow}
    for claim in [*dra, *shadow]:
        uid = claim.uid
        if uid in seen:
            continue
        seen.add(uid)
        is_shadow = uid in shadow_uids
        if is_shadow or claim_is_ours(claim, classes):
            result.ours.append(claim)
            if is_shadow:
                result.shadow.add(uid)
        else:
            result.foreign += 1
        if claim.allocated:
            nodes = frozenset(claim.node_names())
            if nodes:
                result.pinned.append(nodes)
    return result
