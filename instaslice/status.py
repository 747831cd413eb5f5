"""Who holds which MIG slice: the cluster's slice map, derived from the API objects alone.

Every MIG slice is one allocated ResourceClaim of our driver (docs/design.md D1), so the map
of a cluster is a pure function of three lists: the published ResourceSlices (what *could* exist,
per node and GPU), our allocated claims (what is taken, by whom) and the pods those claims serve.
``instaslice status`` feeds it from any cluster, the demo from the local one; the end-to-end tests
use it to check that no two allocations overlap.

Three parts, one concept: ``build_view`` is the pure map; ``read_view`` fetches its objects through
the ``ClusterApi`` port (and ``mig_uuids_from_checkpoints`` reads MIG UUIDs from kubelet-plugin
checkpoints when the caller can see them: on a node, in the demo); ``render_view`` draws it as text
in the spirit of ``nvidia-smi``'s MIG tables.

MIG UUIDs are not in the claim's allocation; they are shown when the claim's per-device status
carries one (``status.devices[].data``) or when the caller passes them in (the demo reads them from
the kubelet plugins' checkpoints).
"""

from __future__ import annotations

import logging
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from api import names
from controller.allocation.holds import parse_persisted
from driver.checkpoint import CheckpointStore
from driver.cluster.port import PODS, RESOURCE_CLAIMS, RESOURCE_SLICES, ClusterApi, JsonObject
from driver.cluster.views import ClaimView, PodView, SliceView
from driver.errors import CheckpointError
from driver.mig.model import Placement
from driver.resourceslices import PublishedDevice, parse_devices

logger = logging.getLogger(__name__)

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
class HeldGpus:
    """GPUs the controller holds for a waiting pod (the pod's ``instaslice.dev/hold``): a
    reservation against starvation, or the room its preemption is freeing."""

    pod_namespace: str
    pod_name: str
    kind: str
    node: str
    gpus: tuple[int, ...]
    since: str
    victims: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClusterView:
    gpus: tuple[GpuView, ...]
    strays: tuple[StrayAllocation, ...] = field(default=())
    holds: tuple[HeldGpus, ...] = field(default=())

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
    for obj in claims:
        claim = ClaimView.of(obj)
        holder = _holder(claim, pod_index)
        for result in claim.results_of(driver):
            pool, name = result.pool, result.device
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
            uuid = known_uuids.get((holder.uid, name)) or status_mig_uuid(
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
    return ClusterView(gpus=tuple(gpus), strays=tuple(strays), holds=_holds(pods))


def _holds(pods: Iterable[JsonObject]) -> tuple[HeldGpus, ...]:
    """The holds recorded on gated pods (a placed pod's record is history, not a hold)."""
    found = []
    for obj in pods:
        pod = PodView.of(obj)
        text = pod.meta.annotations.get(names.HOLD_ANNOTATION)
        if not text or not pod.gated_by(names.SCHEDULING_GATE):
            continue
        held = parse_persisted(text)
        if held is None:
            continue
        found.append(
            HeldGpus(
                pod_namespace=pod.namespace or "default",
                pod_name=pod.name,
                kind=str(held.kind),
                node=held.node,
                gpus=held.gpus,
                since=held.since.strftime("%Y-%m-%dT%H:%M:%SZ"),
                victims=held.victims,
            )
        )
    return tuple(sorted(found, key=lambda h: (h.node, h.gpus, h.pod_namespace, h.pod_name)))


def _published_devices(slices: Iterable[JsonObject], *, driver: str) -> list[PublishedDevice]:
    """Devices of each pool's newest generation (a pool mid-republication is still shown)."""
    by_pool: dict[str, list[SliceView]] = {}
    for obj in slices:
        view = SliceView.of(obj)
        if view.driver != driver or not view.pool:
            continue
        by_pool.setdefault(view.pool, []).append(view)
    devices: list[PublishedDevice] = []
    for pool_slices in by_pool.values():
        newest = max(v.pool_generation for v in pool_slices)
        devices += parse_devices(v.raw for v in pool_slices if v.pool_generation == newest)
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
        self._by_uid: dict[str, PodView] = {}
        self._by_name: dict[tuple[str, str], PodView] = {}
        for obj in pods:
            pod = PodView.of(obj)
            self._by_uid[pod.uid] = pod
            self._by_name[(pod.namespace, pod.name)] = pod

    def ref(self, *, namespace: str, name: str, uid: str) -> PodRef:
        pod = self._by_uid.get(uid) if uid else None
        if pod is None and not uid:
            pod = self._by_name.get((namespace, name))
        if pod is None:
            return PodRef(namespace=namespace, name=name, phase="Gone")
        return PodRef(
            namespace=pod.meta.namespace or namespace,
            name=pod.name or name,
            phase=pod.phase or "Pending",
            gated=bool(pod.scheduling_gates),
        )

    def by_uid(self, uid: str) -> PodView | None:
        return self._by_uid.get(uid)


def _holder(claim: ClaimView, pods: _PodIndex) -> _Holder:
    namespace, name = claim.namespace, claim.name
    refs = [
        pods.ref(namespace=namespace, name=consumer.name, uid=consumer.uid)
        for consumer in claim.reserved_for
        if consumer.is_pod
    ]
    if not refs:
        refs = [
            pods.ref(namespace=namespace, name=owner.name, uid=owner.uid)
            for owner in claim.meta.owners
            if owner.is_pod
        ]
    shadow_for = claim.meta.labels.get(names.SHADOW_CLAIM_LABEL)
    if not refs and shadow_for:
        pod = pods.by_uid(shadow_for)
        if pod is not None:
            refs.append(pods.ref(namespace=namespace, name=pod.name, uid=shadow_for))
    return _Holder(
        namespace=namespace,
        name=name,
        uid=claim.uid,
        shadow=shadow_for is not None,
        pods=tuple(refs),
    )


def status_mig_uuid(claim: ClaimView, *, driver: str, pool: str, device: str) -> str | None:
    """The MIG UUID a driver recorded for one allocated device in the claim's
    ``status.devices[].data`` (under any of ``MIG_UUID_DATA_KEYS``); ``None`` when not recorded."""
    for entry in claim.devices:
        if (entry.driver, entry.pool, entry.device) != (driver, pool, device):
            continue
        for key in MIG_UUID_DATA_KEYS:
            value = entry.data.get(key)
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


# ---------------------------------------------------------------------------------------------
# reading the map's objects from the cluster


def allocated_claims(claims: Iterable[JsonObject], *, driver: str) -> list[JsonObject]:
    """Claims with at least one allocation result of ``driver``."""
    return [claim for claim in claims if ClaimView.of(claim).results_of(driver)]


@dataclass(frozen=True, slots=True)
class StatusObjects:
    """What the slice map is built from: our ResourceSlices, our allocated claims, and the pods of
    the namespaces those claims live in."""

    resource_slices: list[JsonObject]
    claims: list[JsonObject]
    pods: list[JsonObject]


def read_objects(api: ClusterApi, *, driver: str = names.DRIVER_NAME) -> StatusObjects:
    """Our ResourceSlices, our allocated claims, and the pods of the namespaces that have claims
    (one list per namespace, not every pod of a large cluster)."""
    slices = api.list_objects(RESOURCE_SLICES, field_selector=f"spec.driver={driver}").items
    every_claim = api.list_objects(RESOURCE_CLAIMS).items
    claims = allocated_claims(every_claim, driver=driver)
    # pods waiting with a hold have claims too, not allocated yet
    namespaces = sorted({ClaimView.of(c).namespace for c in every_claim})
    pods: list[JsonObject] = []
    for namespace in namespaces:
        pods += api.list_objects(PODS, namespace=namespace).items
    return StatusObjects(resource_slices=slices, claims=claims, pods=pods)


def read_view(
    api: ClusterApi,
    *,
    mig_uuids: Mapping[MigUuidKey, str] | None = None,
    driver: str = names.DRIVER_NAME,
) -> ClusterView:
    """The cluster's slice map now (see ``read_objects``)."""
    objects = read_objects(api, driver=driver)
    return build_view(
        resource_slices=objects.resource_slices,
        claims=objects.claims,
        pods=objects.pods,
        mig_uuids=mig_uuids,
        driver=driver,
    )


def mig_uuids_from_checkpoints(paths: Iterable[Path]) -> dict[MigUuidKey, str]:
    """(claim UID, device) → MIG UUID from kubelet-plugin checkpoint files. A file that is missing
    or unreadable is skipped with a warning: the map then shows ``-`` for its slices."""
    found: dict[MigUuidKey, str] = {}
    for path in paths:
        try:
            checkpoint = CheckpointStore(path).load()
        except CheckpointError as exc:
            logger.warning("skipping checkpoint: %s", exc)
            continue
        for uid, claim in checkpoint.claims.items():
            for device in claim.devices:
                if device.mig_uuid:
                    found[(uid, device.device)] = device.mig_uuid
    return found


# ---------------------------------------------------------------------------------------------
# rendering as text


_RESET = "\x1b[0m"
_BOLD = "\x1b[1m"
_DIM = "\x1b[2m"
_RED = "\x1b[31m"
_LABEL_COLORS = ("\x1b[36m", "\x1b[33m", "\x1b[35m", "\x1b[32m", "\x1b[34m", "\x1b[96m")
_HEADERS = ("ID", "START", "SIZE", "PROFILE", "VIA", "CLAIM", "POD", "POD STATE", "MIG UUID")
SHORT_UUID_CHARS = 12


@dataclass(frozen=True, slots=True)
class Style:
    """How to draw: ``color`` adds ANSI escapes; ``short_uuids`` keeps lines narrow."""

    color: bool = False
    short_uuids: bool = False

    def paint(self, text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if self.color and code and text else text


def label_color(label: str) -> str:
    position = LABELS.find(label)
    return _LABEL_COLORS[max(position, 0) % len(_LABEL_COLORS)]


def render_view(view: ClusterView, *, style: Style | None = None) -> str:
    """The whole map; ends with a newline."""
    style = style or Style()
    if not view.gpus and not view.strays:
        return "No MIG-capable GPU published by mig.instaslice.dev (no ResourceSlices yet).\n"
    blocks = [render_gpu(gpu, style=style) for gpu in view.gpus]
    if view.holds:
        lines = [style.paint("Held for waiting pods:", _BOLD)]
        for h in view.holds:
            gpus = ", ".join(str(g) for g in h.gpus)
            victims = f"; evicted {', '.join(h.victims)}" if h.victims else ""
            lines.append(
                f"  {h.node} GPU {gpus}: {h.kind} for {h.pod_namespace}/{h.pod_name} "
                f"since {h.since}{victims}"
            )
        blocks.append("\n".join(lines) + "\n")
    if view.strays:
        lines = [style.paint("Allocations naming devices no ResourceSlice publishes:", _RED)]
        lines += [
            f"  {s.claim_namespace}/{s.claim_name} -> pool {s.pool}, device {s.device}"
            for s in view.strays
        ]
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def memory_bar(gpu: GpuView, *, style: Style) -> str:
    cells = []
    for char in gpu.memory_map():
        if char == FREE_MARK:
            cells.append(style.paint(char, _DIM))
        elif char == OVERLAP_MARK:
            cells.append(style.paint(char, _RED + _BOLD))
        elif char == " ":
            cells.append(char)
        else:
            cells.append(style.paint(char, label_color(char) + _BOLD))
    return "[" + "".join(cells) + "]"


def render_gpu(gpu: GpuView, *, style: Style) -> str:
    title = style.paint(f"{gpu.node}  GPU {gpu.index}", _BOLD)
    header = f"{title}  {gpu.product_name}  {_uuid(gpu.uuid, style)}"
    taken = gpu.memory_slices_taken
    summary = (
        f"memory {memory_bar(gpu, style=style)}  {taken}/{gpu.memory_slices} memory slices taken, "
        f"{len(gpu.taken)} MIG slice{'' if len(gpu.taken) == 1 else 's'}"
    )
    lines = [header, summary]
    if gpu.taken:
        lines += _table([_row(item, style) for item in gpu.taken], style=style)
    lines.append(_free_line(gpu))
    return "\n".join(lines) + "\n"


def _uuid(uuid: str | None, style: Style) -> str:
    if not uuid:
        return "-"
    if style.short_uuids and len(uuid) > SHORT_UUID_CHARS + 1:
        return uuid[:SHORT_UUID_CHARS] + "…"
    return uuid


@dataclass(frozen=True, slots=True)
class _Cell:
    text: str
    code: str = ""


def _row(item: TakenSlice, style: Style) -> list[_Cell]:
    pods = ", ".join(p.key for p in item.pods) or "-"
    states = ", ".join(p.phase + (" (gated)" if p.gated else "") for p in item.pods) or "-"
    if item.overlaps:
        states = f"{states} OVERLAPS"
    return [
        _Cell(item.label, label_color(item.label) + _BOLD),
        _Cell(str(item.placement.start)),
        _Cell(str(item.placement.size)),
        _Cell(item.profile),
        _Cell("classic" if item.shadow else "dra"),
        _Cell(item.claim_key),
        _Cell(pods),
        _Cell(states, _RED if item.overlaps else _phase_color(item)),
        _Cell(_uuid(item.mig_uuid, style)),
    ]


def _phase_color(item: TakenSlice) -> str:
    phases = {p.phase for p in item.pods}
    if phases == {"Running"}:
        return "\x1b[32m"
    if "Gone" in phases or "Failed" in phases:
        return _RED
    return "\x1b[33m"


def _table(rows: Sequence[list[_Cell]], *, style: Style) -> list[str]:
    widths = [len(h) for h in _HEADERS]
    for row in rows:
        widths = [max(w, len(cell.text)) for w, cell in zip(widths, row, strict=True)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells: Sequence[_Cell]) -> str:
        parts = [
            " " + style.paint(cell.text, cell.code) + " " * (w - len(cell.text) + 1)
            for cell, w in zip(cells, widths, strict=True)
        ]
        return "|" + "|".join(parts) + "|"

    header = line([_Cell(h, _BOLD) for h in _HEADERS])
    return [rule, header, rule, *(line(row) for row in rows), rule]


def _free_line(gpu: GpuView) -> str:
    parts = [f"{free.profile} {compact_starts(free.starts)}" for free in gpu.free if free.starts]
    if not parts:
        return "free placement starts: none (nothing more fits on this GPU)"
    return "free placement starts: " + " · ".join(parts)


def compact_starts(starts: Sequence[int]) -> str:
    """``0,1,2,3,5`` → ``0-3,5``; runs of three or more consecutive starts are folded."""
    runs: list[list[int]] = []
    for start in sorted(starts):
        if runs and start == runs[-1][-1] + 1:
            runs[-1].append(start)
        else:
            runs.append([start])
    return ",".join(
        f"{run[0]}-{run[-1]}" if len(run) >= 3 else ",".join(map(str, run)) for run in runs
    )
