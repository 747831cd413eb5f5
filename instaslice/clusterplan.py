"""A cluster's occupancy as the planning tools need it: a placement engine and the pods that could move.

The engine is filled by the controller's own code — ``SliceInventory`` turns the published
ResourceSlices into engine nodes, ``ClaimOccupancy`` marks every allocated claim's devices as taken —
so ``simulate --from-cluster`` and ``defrag`` see exactly what the allocator would see. The pods that
hold each claim come from the slice map (``instaslice.status``): claims that share a pod move together, and
a claim no existing pod holds (finished, deleted, never started) cannot be moved by evicting anyone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from api import names
from controller.allocation.inventory import SliceInventory
from controller.allocation.occupancy import ClaimOccupancy
from driver.cluster.port import ClusterApi, JsonObject
from driver.placement import Engine
from instaslice.planning.defrag import Unit, UnitSlice
from instaslice.status import PodRef, allocated_claims, build_view, read_objects

EVICTABLE_PHASES = frozenset({"Pending", "Running"})


@dataclass(frozen=True, slots=True)
class PinnedClaim:
    """An allocated claim whose slices stay where they are, and why."""

    claim: str
    reason: str


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    engine: Engine
    units: tuple[Unit, ...]
    pods: dict[str, tuple[PodRef, ...]]
    """Unit key → the pods to evict to move it."""
    pinned: tuple[PinnedClaim, ...]


def snapshot_of(
    *,
    resource_slices: Iterable[JsonObject],
    claims: Iterable[JsonObject],
    pods: Iterable[JsonObject],
    policy: str,
) -> ClusterSnapshot:
    slices = list(resource_slices)
    ours = allocated_claims(claims, driver=names.DRIVER_NAME)
    engine = Engine(policy=policy)
    inventory = SliceInventory(engine)
    for obj in slices:
        inventory.slice_changed(obj)
    inventory.refresh()
    occupancy = ClaimOccupancy(engine=engine, inventory=inventory)
    for claim in ours:
        occupancy.observe(claim)
    view = build_view(resource_slices=slices, claims=ours, pods=pods)
    pods_of_claim: dict[str, tuple[PodRef, ...]] = {}
    for gpu in view.gpus:
        for taken in gpu.taken:
            pods_of_claim[taken.claim_uid] = taken.pods
    return _units(occupancy, pods_of_claim, engine)


def _units(
    occupancy: ClaimOccupancy, pods_of_claim: dict[str, tuple[PodRef, ...]], engine: Engine
) -> ClusterSnapshot:
    records = [r for r in occupancy.records() if r.resolved]
    pinned: list[PinnedClaim] = []
    movable = []
    for record in records:
        refs = pods_of_claim.get(record.uid, ())
        live = [p for p in refs if p.phase in EVICTABLE_PHASES]
        if not refs:
            pinned.append(PinnedClaim(claim=record.key, reason="no pod holds it"))
        elif len(live) != len(refs):
            gone = ", ".join(f"{p.key} ({p.phase})" for p in refs if p not in live)
            pinned.append(PinnedClaim(claim=record.key, reason=f"its pods are not running: {gone}"))
        else:
            movable.append((record, tuple(live)))
    # Claims that share a pod move together: union them by pod.
    parent = list(range(len(movable)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_with_pod: dict[str, int] = {}
    for i, (_, refs) in enumerate(movable):
        for pod in refs:
            j = first_with_pod.setdefault(pod.key, i)
            parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(movable)):
        groups.setdefault(find(i), []).append(i)
    units: list[Unit] = []
    pods: dict[str, tuple[PodRef, ...]] = {}
    for members in groups.values():
        refs = tuple(
            sorted(
                {p.key: p for i in members for p in movable[i][1]}.values(),
                key=lambda p: p.key,
            )
        )
        key = " + ".join(p.key for p in refs)
        slices = tuple(
            UnitSlice(
                node=slot.node,
                gpu_index=slot.gpu_index,
                profile=slot.profile or "",
                start=slot.start,
                size=slot.size,
                media=slot.media,
            )
            for i in members
            for slot in movable[i][0].slots
        )
        units.append(Unit(key=key, slices=slices))
        pods[key] = refs
    units.sort(key=lambda u: u.key)
    pinned.sort(key=lambda p: p.claim)
    return ClusterSnapshot(engine=engine, units=tuple(units), pods=pods, pinned=tuple(pinned))


def read_snapshot(
    api: ClusterApi, *, policy: str, driver: str = names.DRIVER_NAME
) -> ClusterSnapshot:
    """The cluster now: our ResourceSlices, our allocated claims, the pods of their namespaces."""
    objects = read_objects(api, driver=driver)
    return snapshot_of(
        resource_slices=objects.resource_slices,
        claims=objects.claims,
        pods=objects.pods,
        policy=policy,
    )
