"""Which running requests a waiting request preempts, chosen the way kube-scheduler chooses victims.

A request that fits nowhere may evict running requests of strictly lower priority, never of equal
or higher priority. Its slices share one GPU, so every GPU is a candidate of its own: on a GPU the
candidates are the sets of lower-priority requests running there whose eviction lets the request
fit. Of all of them the one with the smallest :data:`VictimKey` is chosen — the highest victim
priority, then the sum of the victims' priorities, then how many there are, then the latest start
among the victims of the highest priority, latest first (the least work lost) — and ties go to the
GPU first in the fleet's order: kube-scheduler's criteria for picking a node among preemption
candidates, as the controller applies them to GPUs (``controller.allocation.preemption``). As
there, each priority counts ``2**31`` more in the sum, so that a set's key is always above the key
of any set it contains: the chosen set is *minimal* (keeping any one of it, the request would not
fit).

Whether a request fits once some are evicted is asked of the GPU's placement table, which holds the
engine's own rules (published placements, ``max_count``, the one ``+me`` engine), so candidates are
weighed without changing the engine. The occupants of a GPU are assumed disjoint, as the engine
keeps them when every slice is placed through it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from driver.placement import DeviceAssignment, Engine
from driver.placement.state import GpuState
from driver.placement.tables import Signature, signature_of

GpuKey = tuple[str, int]
"""A GPU of the fleet: (node name, GPU index)."""

VictimKey = tuple[int, int, int, float]
"""(highest victim priority, sum of victim priorities each plus ``2**31``, number of victims, minus
the latest start among the victims of the highest priority): smaller is preferred."""

_INT32_SPAN = 2**31


@dataclass(frozen=True, slots=True)
class Holder:
    """A running request as preemption and reservations see it."""

    sequence: int
    priority: int
    started: float
    assignments: tuple[DeviceAssignment, ...]

    @property
    def gpu(self) -> GpuKey:
        first = self.assignments[0]
        return (first.node, first.gpu_index)


@dataclass(frozen=True, slots=True)
class Victims:
    """The running requests to evict, all on ``gpu``, so that the preempting request fits there."""

    gpu: GpuKey
    sequences: tuple[int, ...]
    key: VictimKey


def victim_key(holders: Collection[Holder]) -> VictimKey:
    """The key a set of victims is ranked by (see the module docstring)."""
    highest = max(h.priority for h in holders)
    return (
        highest,
        sum(h.priority + _INT32_SPAN for h in holders),
        len(holders),
        -max(h.started for h in holders if h.priority == highest),
    )


class RunningByGpu:
    """The running requests of each GPU, with their priority and start."""

    def __init__(self) -> None:
        self._on: dict[GpuKey, dict[int, Holder]] = {}
        self._gpu_of: dict[int, GpuKey] = {}

    def add(self, holder: Holder) -> None:
        """Count a request that starts now (no earlier than every request added before it)."""
        gpu = holder.gpu
        self._on.setdefault(gpu, {})[holder.sequence] = holder
        self._gpu_of[holder.sequence] = gpu

    def remove(self, sequence: int) -> Holder:
        """The request's record, forgotten (it departs or is evicted)."""
        gpu = self._gpu_of.pop(sequence)
        return self._on[gpu].pop(sequence)

    def on(self, gpu: GpuKey) -> Collection[Holder]:
        found = self._on.get(gpu)
        return found.values() if found else ()

    def rank(self, gpu: GpuKey) -> tuple[int, float] | None:
        """(running requests, latest start) of a GPU running any; requests are added in the
        order they start, so the latest is the last one kept."""
        found = self._on.get(gpu)
        if not found:
            return None
        return (len(found), next(reversed(found.values())).started)


def choose_victims(
    engine: Engine,
    running: RunningByGpu,
    *,
    profile: str,
    count: int,
    priority: int,
    gpus: Iterable[GpuKey],
) -> Victims | None:
    """The victims for ``count`` x ``profile`` at ``priority`` among ``gpus`` (taken in the
    fleet's order, which breaks ties); None when evicting lower priorities makes room on none."""
    signature = signature_of([(profile, count)])
    inventory = engine.inventory
    best: Victims | None = None
    for gpu in gpus:
        lower = [h for h in running.on(gpu) if h.priority < priority]
        if not lower:
            continue
        found = _best_on(
            inventory.gpu(*gpu), lower, signature, bound=best.key if best is not None else None
        )
        if found is not None:
            key, chosen = found
            best = Victims(gpu=gpu, sequences=tuple(sorted(h.sequence for h in chosen)), key=key)
    return best


def _best_on(
    gpu: GpuState, lower: list[Holder], signature: Signature, *, bound: VictimKey | None
) -> tuple[VictimKey, list[Holder]] | None:
    """The victim set of smallest key on one GPU, if its key is below ``bound``."""
    if bound is not None and min(h.priority for h in lower) > bound[0]:
        return None
    fits = _Fit(gpu, lower, signature)
    size = 1 << len(lower)
    if not fits(size - 1):
        return None
    # The keys of every subset (a GPU holds at most 7 instances: at most 127 of them), each from
    # the subset without its lowest member, as ``victim_key`` computes them.
    top = [-_INT32_SPAN] * size
    total = [0] * size
    members = [0] * size
    latest = [-math.inf] * size
    ranked = []
    for subset in range(1, size):
        low = subset & -subset
        rest = subset ^ low
        holder = lower[low.bit_length() - 1]
        priority, started = holder.priority, holder.started
        if not rest or priority > top[rest]:
            top[subset], latest[subset] = priority, started
        elif priority == top[rest]:
            top[subset], latest[subset] = priority, max(latest[rest], started)
        else:
            top[subset], latest[subset] = top[rest], latest[rest]
        total[subset] = total[rest] + priority + _INT32_SPAN
        members[subset] = members[rest] + 1
        ranked.append(((top[subset], total[subset], members[subset], -latest[subset]), subset))
    ranked.sort()
    for key, subset in ranked:
        if bound is not None and key >= bound:
            return None
        if fits(subset):
            return key, [h for i, h in enumerate(lower) if subset >> i & 1]
    return None  # unreachable: the whole set fits


def fits_without(gpu: GpuState, leaving: Sequence[Holder], signature: Signature) -> bool:
    """Whether ``signature`` fits ``gpu`` once the requests ``leaving`` (running there) are gone."""
    return _Fit(gpu, list(leaving), signature)((1 << len(leaving)) - 1)


class _Fit:
    """Whether the request fits one GPU once a subset (a bit mask over ``lower``) is evicted."""

    def __init__(self, gpu: GpuState, lower: list[Holder], signature: Signature) -> None:
        self.gpu, self.signature = gpu, signature
        table = gpu.table
        self.masks: list[int] = []
        self.media: list[bool] = []
        self.profiles: list[list[int]] = []
        for holder in lower:
            mask, media, profiles = 0, False, []
            for a in holder.assignments:
                mask |= ((1 << a.size) - 1) << a.start
                media = media or a.media or a.profile in table.media_names
                known = table.profile_by_name.get(a.profile)
                if known is not None:
                    profiles.append(known.index)
            self.masks.append(mask)
            self.media.append(media)
            self.profiles.append(profiles)

    def __call__(self, subset: int) -> bool:
        gpu = self.gpu
        mask, media = gpu.mask, gpu.media_taken
        counts = list(gpu.counts)
        for i in range(len(self.masks)):
            if subset >> i & 1:
                mask &= ~self.masks[i]
                media = media and not self.media[i]
                for index in self.profiles[i]:
                    counts[index] -= 1
        return gpu.table.fits(self.signature, mask=mask, media_taken=media, counts=tuple(counts))
