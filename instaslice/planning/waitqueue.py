"""The requests of a queued replay that wait for room, in the order they are served, and the GPUs
reserved for those that waited too long.

The order is the pod priority, highest first, then the time the request entered the queue (its
arrival; for a preempted request, its eviction: the pod is re-created then), then its place in the
trace. Requests of one priority, one (profile, count) and one preemption policy are interchangeable
to placement, so they are kept together as a *group*, in order, and only the first of a group is
tried on the GPUs nobody reserved for their priority or higher.

A reservation holds one GPU for one waiting request: no request of the holder's priority or lower
is placed there (higher priorities pass) but the holder, until the holder is placed, wherever that
is. A GPU holds at most one reservation; a holder stays in its group (elsewhere it is as any other
request of the group), and is tried on its reserved GPU on its own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from instaslice.planning.preemption import GpuKey
from instaslice.planning.trace import TraceRequest

GroupKey = tuple[str, int, bool]
"""(profile, count, may preempt): what makes waiting requests of one priority interchangeable."""

NOTHING_BLOCKED: frozenset[GpuKey] = frozenset()


@dataclass(slots=True, eq=False)
class Waiting:
    """A request in the queue: ``index`` is its place in the trace, ``since`` when it entered."""

    index: int
    request: TraceRequest
    since: float
    reserved: GpuKey | None = None

    @property
    def group(self) -> GroupKey:
        request = self.request
        preempts = request.preemption_policy != "Never"
        return (request.profile, request.count, preempts)

    @property
    def order(self) -> tuple[int, float, int]:
        """Served in increasing order of this."""
        return (-self.request.priority, self.since, self.index)


class WaitQueue:
    """Waiting requests by priority and group, and the reservations some of them hold."""

    def __init__(self) -> None:
        self._levels: dict[int, dict[GroupKey, deque[Waiting]]] = {}
        self._by_index: dict[int, Waiting] = {}
        self._reserved: dict[GpuKey, Waiting] = {}
        self._blocked: dict[int, frozenset[GpuKey]] = {}

    def __len__(self) -> int:
        return len(self._by_index)

    def __iter__(self) -> Iterator[Waiting]:
        return iter(self._by_index.values())

    def get(self, index: int) -> Waiting | None:
        """The waiting request from ``index`` of the trace (None: it is not waiting)."""
        return self._by_index.get(index)

    def add(self, waiting: Waiting) -> None:
        """Queue ``waiting``, which entered at or after every request queued before it."""
        level = self._levels.setdefault(waiting.request.priority, {})
        level.setdefault(waiting.group, deque()).append(waiting)
        self._by_index[waiting.index] = waiting

    def remove(self, waiting: Waiting) -> GpuKey | None:
        """Take ``waiting`` out (it is placed); returns the GPU its reservation held, if any."""
        del self._by_index[waiting.index]
        priority = waiting.request.priority
        level = self._levels[priority]
        group = level[waiting.group]
        if group[0] is waiting:
            group.popleft()
        else:
            group.remove(waiting)  # a holder placed on its GPU ahead of its group
        if not group:
            del level[waiting.group]
            if not level:
                del self._levels[priority]
        gpu = waiting.reserved
        if gpu is not None:
            del self._reserved[gpu]
            self._blocked.clear()
        return gpu

    def reserve(self, waiting: Waiting, gpu: GpuKey) -> None:
        """Hold ``gpu`` for ``waiting`` (which holds none, on a GPU nobody holds)."""
        waiting.reserved = gpu
        self._reserved[gpu] = waiting
        self._blocked.clear()

    @property
    def reserved(self) -> Mapping[GpuKey, Waiting]:
        return self._reserved

    def levels_below(self, priority: int | None) -> int | None:
        """The highest priority with requests waiting, below ``priority`` (None: the highest of
        all); None when there is none."""
        below = [p for p in self._levels if priority is None or p < priority]
        return max(below) if below else None

    def heads(self, priority: int) -> list[tuple[float, int, GroupKey]]:
        """(entered, trace index, group) of the first request of each group of ``priority``."""
        return [
            (group[0].since, group[0].index, key)
            for key, group in self._levels.get(priority, {}).items()
        ]

    def head(self, priority: int, key: GroupKey) -> Waiting | None:
        """The first request of a group (None: the group is empty)."""
        group = self._levels.get(priority, {}).get(key)
        return group[0] if group else None

    def holders(self, priority: int, *, on: Iterable[GpuKey] | None) -> list[Waiting]:
        """The requests of ``priority`` that hold a reservation (on one of the GPUs ``on``, when
        given), in serving order."""
        reserved = self._reserved
        found = (
            reserved.values() if on is None else [reserved[gpu] for gpu in on if gpu in reserved]
        )
        return sorted((w for w in found if w.request.priority == priority), key=lambda w: w.order)

    def blocked(self, priority: int) -> frozenset[GpuKey]:
        """The GPUs reserved for requests of ``priority`` or higher: no request of ``priority`` is
        placed there but their holders."""
        found = self._blocked.get(priority)
        if found is None:
            found = frozenset(
                gpu for gpu, holder in self._reserved.items() if holder.request.priority >= priority
            )
            found = self._blocked[priority] = found or NOTHING_BLOCKED
        return found
