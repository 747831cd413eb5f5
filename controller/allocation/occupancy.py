"""Which published slices are taken: every allocated claim of our driver, whoever allocated it.

Occupancy is derived from the API server only (docs/design.md D1: no second bookkeeping object): the claim
informer's adds, updates and deletes feed it, claims allocated by kube-scheduler or another
controller count like ours, and a deallocated or deleted claim frees its slices. The leader's
occupancy therefore is the API's as soon as the claim informer has synced.

Our own decisions enter as *assumed* records (kube-scheduler's assume cache): reserved in the engine
before the allocation is written, so the next pod does not take the same slices, and kept until the
informer shows the write. An informer event older than our write (a claim seen without the
allocation because the watch lags) does not drop the assumption; a failed write does.

Every record remembers the resourceVersion at which its allocation was first observed. The
informer sees changes in commit order, so once it has caught up with our own write it has seen
every allocation committed before it; ``overlapping`` then tells whether another allocation that
overlaps ours exists, and ``earlier`` whether it was committed before ours — what the allocator's
post-write check needs when two allocators race (see ``allocator``).

Not thread-safe: the allocator holds its lock around every call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from api.names import DRIVER_NAME
from controller.allocation.inventory import SliceInventory
from driver.cluster.port import JsonObject
from driver.cluster.views import ClaimView
from driver.placement import Engine

logger = logging.getLogger(__name__)

DeviceKey = tuple[str, str]
"""(pool = node, device name), as an allocation result names a device."""


@dataclass(frozen=True, slots=True)
class Slot:
    """One taken GPU instance in the engine's terms."""

    node: str
    gpu_index: int
    start: int
    size: int
    media: bool
    profile: str

    def overlaps(self, other: Slot) -> bool:
        if (self.node, self.gpu_index) != (other.node, other.gpu_index):
            return False
        if self.media and other.media:
            return True
        return self.start < other.start + other.size and other.start < self.start + self.size


@dataclass(slots=True)
class ClaimRecord:
    uid: str
    key: str
    """``namespace/name`` of the claim."""
    devices: tuple[DeviceKey, ...]
    slots: tuple[Slot, ...] = ()
    resolved: bool = False
    assumed: bool = False
    written_rv: int | None = None
    """resourceVersion our allocation write returned; informer events older than it are stale."""
    observed_rv: int = -1
    """resourceVersion at which this allocation was first seen (or written by us)."""
    gpus: set[tuple[str, int]] = field(default_factory=set)
    first_seen: float = field(default_factory=time.monotonic)
    """Monotonic time this allocation was first known here."""
    verified: bool = False
    """Our own write of it passed the post-write overlap check."""


def parse_rv(claim: ClaimView) -> int:
    """resourceVersion as an integer (etcd revisions); 0 when it is not one."""
    try:
        return int(claim.meta.resource_version)
    except ValueError:
        return 0


class ClaimOccupancy:
    def __init__(self, *, engine: Engine, inventory: SliceInventory) -> None:
        self._engine = engine
        self._inventory = inventory
        self._records: dict[str, ClaimRecord] = {}
        self._pending: dict[str, set[str]] = {}
        """node → uids of records with a device on that node not resolved yet."""
        self._by_gpu: dict[tuple[str, int], set[str]] = {}

    # -- informer side -------------------------------------------------------------------------

    def observe(self, claim: JsonObject) -> bool:
        """A claim was added or changed; True if slices were freed."""
        view = ClaimView.of(claim)
        uid = view.uid
        devices = view.devices_of(DRIVER_NAME)
        record = self._records.get(uid)
        rv = parse_rv(view)
        if devices:
            if record is not None and record.devices == devices:
                if record.assumed:
                    record.assumed = False
                    if record.observed_rv < 0:  # the watch beat our write's response
                        record.observed_rv = rv
                return False
            freed = self._drop(uid)
            self._add(ClaimRecord(uid=uid, key=view.key, devices=devices, observed_rv=rv))
            return freed
        if record is None:
            return False
        if record.assumed and (record.written_rv is None or rv < record.written_rv):
            return False  # our write is in flight, or this event predates it
        return self._drop(uid)

    def forget(self, claim: JsonObject) -> bool:
        """A claim was deleted; True if slices were freed."""
        return self._drop(ClaimView.of(claim).uid)

    def node_refreshed(self, node: str) -> None:
        """The node's published devices changed: resolve records that waited for them."""
        for uid in sorted(self._pending.pop(node, set())):
            record = self._records.get(uid)
            if record is not None and not record.resolved:
                self._resolve(record)

    # -- allocator side ------------------------------------------------------------------------

    def known_allocated(self, uid: str) -> bool:
        """Whether the informer has shown an allocation of this claim (ours or anyone's)."""
        record = self._records.get(uid)
        return record is not None and not record.assumed

    def assume(self, *, uid: str, key: str, devices: Iterable[DeviceKey]) -> ClaimRecord:
        """Reserve the devices of an allocation we are about to write.

        Callers check ``known_allocated`` first: an allocation the informer has shown is never
        replaced by an assumption (the claim was allocated by someone else meanwhile).
        """
        if self.known_allocated(uid):
            raise ValueError(f"claim {key} is allocated already")
        self._drop(uid)
        record = ClaimRecord(uid=uid, key=key, devices=tuple(devices), assumed=True)
        self._add(record)
        return record

    def written(self, *, uid: str, resource_version: int) -> None:
        """Our allocation write succeeded at ``resource_version``."""
        record = self._records.get(uid)
        if record is not None and record.assumed:
            record.written_rv = resource_version
            record.observed_rv = resource_version

    def unassume(self, uid: str) -> bool:
        """Our write failed: drop the reservation unless the informer has confirmed it meanwhile."""
        record = self._records.get(uid)
        if record is not None and record.assumed and record.written_rv is None:
            return self._drop(uid)
        return False

    def record(self, uid: str) -> ClaimRecord | None:
        return self._records.get(uid)

    def overlapping(self, uid: str) -> list[ClaimRecord]:
        """Other claims whose slices overlap this claim's (both resolved)."""
        record = self._records.get(uid)
        if record is None:
            return []
        found: dict[str, ClaimRecord] = {}
        for gpu in record.gpus:
            for other_uid in self._by_gpu.get(gpu, ()):
                if other_uid == uid or other_uid in found:
                    continue
                other = self._records[other_uid]
                if any(a.overlaps(b) for a in record.slots for b in other.slots):
                    found[other_uid] = other
        return list(found.values())

    def on_gpus(self) -> dict[tuple[str, int], list[ClaimRecord]]:
        """The resolved records on each (node, GPU index) that has any."""
        return {
            gpu: [self._records[uid] for uid in sorted(uids)]
            for gpu, uids in self._by_gpu.items()
            if uids
        }

    def on_gpu(self, node: str, gpu_index: int) -> list[ClaimRecord]:
        return [self._records[uid] for uid in sorted(self._by_gpu.get((node, gpu_index), ()))]

    def records(self) -> list[ClaimRecord]:
        return list(self._records.values())

    def __len__(self) -> int:
        return len(self._records)

    # -- bookkeeping ---------------------------------------------------------------------------

    def _add(self, record: ClaimRecord) -> None:
        self._records[record.uid] = record
        self._resolve(record)

    def _resolve(self, record: ClaimRecord) -> None:
        slots: list[Slot] = []
        missing: set[str] = set()
        for node, name in record.devices:
            device = self._inventory.device(node, name)
            if device is None:
                missing.add(node)
                continue
            slots.append(
                Slot(
                    node=node,
                    gpu_index=device.gpu_index,
                    start=device.placement.start,
                    size=device.placement.size,
                    media=device.media_extensions,
                    profile=device.profile,
                )
            )
        if missing:
            for node in missing:
                self._pending.setdefault(node, set()).add(record.uid)
            logger.debug("claim %s: devices on %s not published yet", record.key, sorted(missing))
            return
        record.slots = tuple(slots)
        record.resolved = True
        for slot in slots:
            self._engine.occupy(
                slot.node,
                slot.gpu_index,
                start=slot.start,
                size=slot.size,
                media=slot.media,
                profile=slot.profile,
            )
            gpu = (slot.node, slot.gpu_index)
            record.gpus.add(gpu)
            self._by_gpu.setdefault(gpu, set()).add(record.uid)

    def _drop(self, uid: str) -> bool:
        record = self._records.pop(uid, None)
        if record is None:
            return False
        for node, _ in record.devices:
            waiting = self._pending.get(node)
            if waiting is not None:
                waiting.discard(uid)
        if not record.resolved:
            return False
        for slot in record.slots:
            self._engine.release(
                slot.node,
                slot.gpu_index,
                start=slot.start,
                size=slot.size,
                media=slot.media,
                profile=slot.profile,
            )
        for gpu in record.gpus:
            holders = self._by_gpu.get(gpu)
            if holders is not None:
                holders.discard(uid)
                if not holders:
                    del self._by_gpu[gpu]
        return True
