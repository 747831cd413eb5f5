"""Who holds which MIG slice: the cluster's slice map, derived from the API objects alone.

Every MIG slice is one allocated ResourceClaim of our driver (docs/design.md D1), so the map
of a cluster is a pure function of three lists: the published ResourceSlices (what *could* exist,
per node and GPU), our allocated claims (what is taken, by whom) and the pods those claims serve.
``instaslice status`` feeds it from any cluster, the demo from the local one; the end-to-end tests
use it to check that no two allocations overlap.

MIG UUIDs are not in the claim's allocation; they are shown when the claim's per-device status
carries one (``status.devices[].data``) or when the caller passes them in (the demo reads them from
the kubelet plugins' checkpoints).
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from api import names
from driver.mig.model import Placement
from driver.resourceslices import PublishedDevice, parse_devices

JsonObject = dict[str, Any]

LABELS = string.ascii_uppercase + string.ascii_lowercase + string.digits
"""Letters naming the taken slices of one GPU, in placement order (``A`` is the lowest start)."""

FREE_MARK = "_"
OVERLAP_MARK = "!"
MIG_UUID_DATA_KEYS = ("migUUID", "migUuid", "mig_uuid", "uuid")
"""Keys of ``status.devices[].data`` under which a MIG UUID may be recorded."""


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    phase: str
    """``status.phase`` (``Pending``, ``Running``…) or ``Gone`` when the pod no longer exists."""
    gated: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class TakenSlice:
    """One placement held by an allocated claim."""

    label: str
    device: str
    profile: str
    placement: Placement
    claim_namespace: str
    claim_name: str
    claim_uid: str
    shadow: bool
    """A shadow claim the controller made for a classic ``nvidia.com/mig-*`` pod."""
    pods: tuple[PodRef, ...]
    mig_uuid: str | None
    overlaps: bool = False
    """Shares a memory slice (or the media extensions) with another taken slice: must never be."""

    @property
    def claim_key(self) -> str:
        return f"{self.claim_namespace}/{self.claim_name}"


@dataclass(frozen=True, slots=True)
class FreeProfile:
    """Placements of one profile that could be created now on one GPU."""

    profile: str
    starts: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GpuView:
    node: str
    index: int
    uuid: str
    product_name: str
    memory_slices: int
    taken: tuple[TakenSlice, ...]
    free: tuple[FreeProfile, ...]
    """Every published profile, in publication order; ``starts`` is empty when none fits now."""

    @property
    def memory_slices_taken(self) -> int:
        covered: set[int] = set()
        for item in self.taken:
            covered.update(range(item.placement.start, item.placement.end))
        return len(covered)

    def memory_map(self) -> str:
        """One character per memory slice: the label of the slice covering it, ``_`` if free,
        ``!`` where two allocations overlap. Eight-slice GPUs are split 4+4 for reading."""
        cells: list[str] = []
        for index in range(self.memory_slices):
            holders = [t for t in self.taken if t.placement.start <= index < t.placement.end]
            if not holders:
                cells.append(FREE_MARK)
            elif len(holders) > 1:
                cells.append(OVERLAP_MARK)
            else:
                cells.append(holders[0].label)
        half = self.memory_slices // 2
        if self.memory_slices >= 8 and self.memory_slices % 2 == 0:
            return "".join(cells[:half]) + " " + "".join(cells[half:])
        return "".join(cells)


@dataclass(frozen=True, slots=True)
class StrayAllocation:
    """An allocation result of our driver naming a device no published slice offers (its node's
    pool is gone or not fully published yet)."""

    claim_namespace: str
    claim_name: str
    pool: str
    device: str


@dataclass(frozen=True, slots=True)
class ClusterView:
    gpus: tuple[GpuView, ...]
    strays: tuple[StrayAllocation, ...] = field(default=())

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(g.node for g in self.gpus))

    def overlapping(self) -> tuple[TakenSlice, ...]:
        return tuple(t for g in self.gpus for t in g.taken if t.overlaps)

    def slices_taken(self) -> int:
        return sum(len(g.taken) for g in self.gpus)


MigUuidKey = tuple[str, str]
"""(claim UID, device name)."""


def build_view(
    *,
    resource_slices: Iterable[JsonObject],
    claims: Iterable[JsonObject],
    pods: Iterable[JsonObject],
    mig_uuids: Mapping[MigUuidKey, str] | None = None,
    driver: str = names.DRIVER_NAME,
) -> ClusterView:
    """The slice map of every published GPU, nodes by name and GPUs by index."""
    devices = _published_devices(resource_slices, driver=driver)
    by_key = {(d.node, d.name): d for d in devices}
    pod_index = _PodIndex(pods)
    known_uuids = dict(mig_uuids or {})
    taken: dict[tuple[str, int], list[tuple[PublishedDevice, _Holder]]] = {}
    strays: list[StrayAllocation] = []
    for claim in claims:
        holder = _holder(claim, pod_index)
        for result in _results(claim, driver=driver):
            pool, name = str(result.get("pool", "")), str(result.get("device", ""))
            device = by_key.get((pool, name))
            if device is None:
                strays.append(
                    StrayAllocation(
                        claim_namespace=holder.namespace,
                        claim_name=holder.name,
                        pool=pool,
                        device=name,
                    )
                )
                continue
            uuid = known_uuids.get((holder.uid, name)) or _status_mig_uuid(
                claim, driver=driver, pool=pool, device=name
            )
            taken.setdefault((device.node, device.gpu_index), []).append(
                (device, holder.with_uuid(uuid))
            )
    gpus = [
        _gpu_view(gpu_devices, taken.get(key, []))
        for key, gpu_devices in sorted(_by_gpu(devices).items())
    ]
    strays.sort(key=lambda s: (s.pool, s.device, s.claim_namespace, s.claim_name))
    return ClusterView(gpus=tuple(gpus), strays=tuple(strays))


def _published_devices(slices: Iterable[JsonObject], *, driver: str) -> list[PublishedDevice]:
    """Devices of each pool's newest generation (a pool mid-republication is still shown)."""
    by_pool: dict[str, list[JsonObject]] = {}
    for obj in slices:
        spec = obj.get("spec") or {}
        if spec.get("driver") != driver or not isinstance(spec.get("pool"), dict):
            continue
        by_pool.setdefault(str(spec["pool"].get("name", "")), []).append(obj)
    devices: list[PublishedDevice] = []
    for objs in by_pool.values():
        newest = max(int(o["spec"]["pool"].get("generation", 0)) for o in objs)
        devices += parse_devices(
            o for o in objs if int(o["spec"]["pool"].get("generation", 0)) == newest
        )
    return devices


def _by_gpu(devices: Iterable[PublishedDevice]) -> dict[tuple[str, int], list[PublishedDevice]]:
    grouped: dict[tuple[str, int], list[PublishedDevice]] = {}
    for device in devices:
        grouped.setdefault((device.node, device.gpu_index), []).append(device)
    return grouped


@dataclass(frozen=True, slots=True)
class _Holder:
    namespace: str
    name: str
    uid: str
    shadow: bool
    pods: tuple[PodRef, ...]
    mig_uuid: str | None = None

    def with_uuid(self, uuid: str | None) -> _Holder:
        return _Holder(self.namespace, self.name, self.uid, self.shadow, self.pods, uuid)


class _PodIndex:
    def __init__(self, pods: Iterable[JsonObject]) -> None:
        self._by_uid: dict[str, JsonObject] = {}
        self._by_name: dict[tuple[str, str], JsonObject] = {}
        for pod in pods:
            meta = pod.get("metadata") or {}
            self._by_uid[str(meta.get("uid", ""))] = pod
            self._by_name[(str(meta.get("namespace", "")), str(meta.get("name", "")))] = pod

    def ref(self, *, namespace: str, name: str, uid: str) -> PodRef:
        pod = self._by_uid.get(uid) if uid else None
        if pod is None and not uid:
            pod = self._by_name.get((namespace, name))
        if pod is None:
            return PodRef(namespace=namespace, name=name, phase="Gone")
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        return PodRef(
            namespace=str(meta.get("namespace", namespace)),
            name=str(meta.get("name", name)),
            phase=str((pod.get("status") or {}).get("phase") or "Pending"),
            gated=bool(spec.get("schedulingGates")),
        )

    def by_uid(self, uid: str) -> JsonObject | None:
        return self._by_uid.get(uid)


def _holder(claim: JsonObject, pods: _PodIndex) -> _Holder:
    meta = claim.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    labels = meta.get("labels") or {}
    refs: list[PodRef] = []
    for consumer in (claim.get("status") or {}).get("reservedFor") or []:
        if consumer.get("resource") == "pods" and not consumer.get("apiGroup"):
            refs.append(
                pods.ref(
                    namespace=namespace,
                    name=str(consumer.get("name", "")),
                    uid=str(consumer.get("uid", "")),
                )
            )
    if not refs:
        for owner in meta.get("ownerReferences") or []:
            if owner.get("kind") == "Pod" and owner.get("apiVersion") == "v1":
                refs.append(
                    pods.ref(
                        namespace=namespace,
                        name=str(owner.get("name", "")),
                        uid=str(owner.get("uid", "")),
                    )
                )
    shadow_for = labels.get(names.SHADOW_CLAIM_LABEL)
    if not refs and shadow_for:
        pod = pods.by_uid(str(shadow_for))
        if pod is not None:
            pod_meta = pod.get("metadata") or {}
            refs.append(
                pods.ref(
                    namespace=namespace, name=str(pod_meta.get("name", "")), uid=str(shadow_for)
                )
            )
    return _Holder(
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid", "")),
        shadow=shadow_for is not None,
        pods=tuple(refs),
    )


def _results(claim: JsonObject, *, driver: str) -> list[JsonObject]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return [r for r in results if isinstance(r, dict) and r.get("driver") == driver]


def _status_mig_uuid(claim: JsonObject, *, driver: str, pool: str, device: str) -> str | None:
    for entry in (claim.get("status") or {}).get("devices") or []:
        if (entry.get("driver"), entry.get("pool"), entry.get("device")) != (driver, pool, device):
            continue
        data = entry.get("data")
        if isinstance(data, dict):
            for key in MIG_UUID_DATA_KEYS:
                value = data.get(key)
                if isinstance(value, str) and value:
                    return value
    return None


def _gpu_view(
    devices: list[PublishedDevice], taken: list[tuple[PublishedDevice, _Holder]]
) -> GpuView:
    first = devices[0]
    memory_slices = first.memory_slices_total or max(d.placement.end for d in devices)
    ordered = sorted(taken, key=lambda pair: (pair[0].placement.start, pair[0].name, pair[1].name))
    overlapping = _overlapping(ordered)
    slices = tuple(
        TakenSlice(
            label=LABELS[i % len(LABELS)],
            device=device.name,
            profile=device.profile,
            placement=device.placement,
            claim_namespace=holder.namespace,
            claim_name=holder.name,
            claim_uid=holder.uid,
            shadow=holder.shadow,
            pods=holder.pods,
            mig_uuid=holder.mig_uuid,
            overlaps=i in overlapping,
        )
        for i, (device, holder) in enumerate(ordered)
    )
    return GpuView(
        node=first.node,
        index=first.gpu_index,
        uuid=first.parent_uuid,
        product_name=first.product_name,
        memory_slices=memory_slices,
        taken=slices,
        free=_free(devices, [device for device, _ in ordered]),
    )


def _overlapping(taken: list[tuple[PublishedDevice, _Holder]]) -> set[int]:
    clashes: set[int] = set()
    for i, (a, _) in enumerate(taken):
        for j in range(i + 1, len(taken)):
            b = taken[j][0]
            if a.placement.overlaps(b.placement) or (a.media_extensions and b.media_extensions):
                clashes.update((i, j))
    return clashes


def _free(devices: list[PublishedDevice], taken: list[PublishedDevice]) -> tuple[FreeProfile, ...]:
    media_taken = any(t.media_extensions for t in taken)
    starts: dict[str, list[int]] = {}
    for device in devices:
        fits = not any(device.placement.overlaps(t.placement) for t in taken) and not (
            device.media_extensions and media_taken
        )
        entry = starts.setdefault(device.profile, [])
        if fits:
            entry.append(device.placement.start)
    return tuple(FreeProfile(profile=p, starts=tuple(sorted(s))) for p, s in starts.items())
