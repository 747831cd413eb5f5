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
from controller.admission import device_classes_of_claim_spec
from controller.conditions import PlacementProblem, Reason
from driver.cluster.indexes import claim_node_names
from driver.cluster.port import JsonObject, name_of, namespace_of, uid_of

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
    for selector in (device_class.get("spec") or {}).get("selectors") or []:
        if DRIVER_NAME in str((selector.get("cel") or {}).get("expression", "")):
            return True
    return False


def claim_is_ours(claim: JsonObject, classes: ClassLookup) -> bool:
    """Whether the claim uses our classes; ``InvalidRequest`` if it mixes them with others'."""
    names = device_classes_of_claim_spec(claim.get("spec") or {})
    ours = [is_our_class(n, classes(n)) for n in names]
    if any(ours) and not all(ours):
        foreign = sorted(n for n, mine in zip(names, ours, strict=True) if not mine)
        raise PlacementProblem(
            Reason.INVALID_REQUEST,
            f"claim {name_of(claim)} mixes MIG slices with DeviceClasses of other drivers "
            f"({', '.join(foreign)}); put them in separate claims",
        )
    return any(ours)


def is_allocated(claim: JsonObject) -> bool:
    return bool((claim.get("status") or {}).get("allocation"))


def dra_claims(pod: JsonObject, *, claims: ClaimLookup) -> list[JsonObject]:
    """Every ResourceClaim the pod references, in ``spec.resourceClaims`` order."""
    namespace = namespace_of(pod) or "default"
    statuses = {
        str(s.get("name")): s for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    found: list[JsonObject] = []
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        if ref.get("resourceClaimName"):
            name = str(ref["resourceClaimName"])
        elif ref.get("resourceClaimTemplateName"):
            status = statuses.get(str(ref.get("name")))
            if status is None:
                raise NotReady(f"the claim of {ref.get('name')!r} is not created yet")
            if not status.get("resourceClaimName"):
                continue  # kube decided no claim is needed
            name = str(status["resourceClaimName"])
        else:
            continue
        claim = claims(namespace, name)
        if claim is None:
            raise NotReady(f"ResourceClaim {namespace}/{name} does not exist yet")
        if (claim.get("metadata") or {}).get("deletionTimestamp"):
            raise NotReady(f"ResourceClaim {namespace}/{name} is being deleted")
        if ref.get("resourceClaimTemplateName"):
            owners = (claim.get("metadata") or {}).get("ownerReferences") or []
            if not any(o.get("uid") == uid_of(pod) for o in owners):
                raise NotReady(f"ResourceClaim {namespace}/{name} is not owned by the pod")
        found.append(claim)
    return found


@dataclass(slots=True)
class PodClaims:
    """The claims one pod needs, sorted out for the allocator."""

    ours: list[JsonObject] = field(default_factory=list)
    """Claims of our driver (DRA claims and shadow claims), each once."""
    shadow: set[str] = field(default_factory=set)
    """UIDs of the shadow claims among ``ours``."""
    pinned: list[frozenset[str]] = field(default_factory=list)
    """Per already allocated claim of the pod (ours or not), the nodes its allocation allows."""
    foreign: int = 0

    @property
    def to_allocate(self) -> list[JsonObject]:
        return [c for c in self.ours if not is_allocated(c)]

    @property
    def allocated(self) -> list[JsonObject]:
        return [c for c in self.ours if is_allocated(c)]

    def allows(self, node: str) -> bool:
        """Whether every allocated claim of the pod allows ``node``."""
        return all(node in nodes for nodes in self.pinned)


def sort_claims(
    dra: Sequence[JsonObject], shadow: Sequence[JsonObject], *, classes: ClassLookup
) -> PodClaims:
    result = PodClaims()
    seen: set[str] = set()
    shadow_uids = {uid_of(c) for c in shadow}
    for claim in [*dra, *shadow]:
        uid = uid_of(claim)
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
        if is_allocated(claim):
            nodes = frozenset(claim_node_names(claim))
            if nodes:
                result.pinned.append(nodes)
    return result
