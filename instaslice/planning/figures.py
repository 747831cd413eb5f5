"""What a replay measures and reports: the figures of one policy, and the counters behind them.

Both modes of a replay — requests rejected when they do not fit (``replay``) and requests waiting
for room (``queued``) — measure memory-slice use the same way and report one ``ReplayResult``; the
queue mode adds waits, preemptions and reservations, per priority.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Timeline:
    """Sampled at every arrival: time, memory slices in use, rejections so far."""

    t: tuple[float, ...]
    used_slices: tuple[int, ...]
    rejected: tuple[int, ...]
    capacity: int


@dataclass(frozen=True, slots=True)
class PriorityFigures:
    """The requests of one priority in a queued replay."""

    priority: int
    requests: int
    admitted: int
    """Requests placed at least once."""
    rejected: int
    """Requests that never fit, not even on empty GPUs (or still waited when the replay ended)."""
    preempted: int
    """Evictions of running requests of this priority (one request may be evicted more than
    once)."""
    wait_p50_s: float
    wait_p99_s: float
    """Waits of the admitted requests: the time each spent waiting, all its waits together."""


@dataclass(frozen=True, slots=True)
class ReplayResult:
    policy: str
    requests: int
    accepted: int
    rejected: int
    stranded: int
    mean_utilization: float
    peak_utilization: float
    wall_s: float
    queued: int = 0
    """Requests that had to wait when they arrived (``queue=True`` only)."""
    wait_p50_s: float | None = None
    wait_p99_s: float | None = None
    defrag_moves: int = 0
    """The most running requests moved to admit one rejected request (0: defragmentation off)."""
    defrag_whole_gpu_below: float | None = None
    """Whole-GPU requests defragment only below this fraction of memory slices in use (None:
    always)."""
    defrag_whole_gpu_reserve: float | None = None
    """Whole-GPU requests defragment only if the slices left free hold the smaller requests' recent
    demand over this many mean request lifetimes (None: always)."""
    defragged: int = 0
    """Requests admitted thanks to a defragmentation plan (counted in ``accepted``)."""
    moves: int = 0
    """Running requests moved by those plans, in total."""
    defrag_searched: int = 0
    """Rejections for which ``plan_defrag`` was asked (the others had no room to free at all)."""
    defrag_budget_hit: int = 0
    """Searches that stopped at ``plan_defrag``'s budget (a plan found without proof it is the
    smallest, or none found)."""
    defrag_search_budget: int = 0
    """Search steps the replay's plan searches could spend together (0: defragmentation off)."""
    defrag_search_steps: int = 0
    """Search steps they spent (at most ``defrag_search_budget``)."""
    defrag_budget_spent: bool = False
    """The budget ran out: the last search was cut short or used the last step, and later
    rejections were not searched."""
    defrag_unsearched: int = 0
    """Rejections that would have been searched, rejected without a search because the budget was
    spent (the figures are then what a replay with a smaller budget gives)."""
    preemption: bool = False
    """Waiting requests preempted lower priorities (``queue=True`` only)."""
    starvation_after_s: float | None = None
    """Requests waiting longer than this reserved a GPU (None: no reservations)."""
    preempted: int = 0
    """Evictions of running requests to place higher priorities, in all."""
    reservations: int = 0
    """GPUs reserved for requests that waited past ``starvation_after_s``, in all."""
    by_priority: tuple[PriorityFigures, ...] = ()
    """Per priority of the trace, highest first (``queue=True`` only)."""
    largest_profile: str | None = None
    """The trace's profile that takes the most memory slices (``queue=True`` only)."""
    largest_wait_p50_s: float | None = None
    largest_wait_p99_s: float | None = None
    """Waits of the admitted requests of ``largest_profile``."""
    timeline: Timeline | None = field(default=None, compare=False, repr=False)


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of already sorted values (0.0 when there are none)."""
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, math.ceil(fraction * len(sorted_values)) - 1))
    return float(sorted_values[index])


class Utilization:
    """Time-weighted memory-slice use between the first and the last arrival."""

    def __init__(self, capacity: int, start: float) -> None:
        self.capacity = capacity
        self.used = 0
        self.peak = 0
        self.area = 0.0
        self.last = start
        self.start = start

    def advance(self, now: float) -> None:
        if now > self.last:
            self.area += self.used * (now - self.last)
            self.last = now

    def take(self, slices: int) -> None:
        used = self.used = self.used + slices
        if used > self.peak:  # noqa: PLR1730 - ``max`` is a call per placement
            self.peak = used

    def give(self, slices: int) -> None:
        self.used -= slices  # the peak cannot rise

    def mean(self, end: float) -> float:
        span = end - self.start
        if span <= 0 or not self.capacity:
            return self.used / self.capacity if self.capacity else 0.0
        return self.area / span / self.capacity

    def peak_share(self) -> float:
        return self.peak / self.capacity if self.capacity else 0.0


class TimelineSamples:
    """The samples of :class:`Timeline`, one per arrival."""

    def __init__(self) -> None:
        self.t: list[float] = []
        self.used: list[int] = []
        self.rejected: list[int] = []

    def sample(self, now: float, *, used: int, rejected: int) -> None:
        self.t.append(now)
        self.used.append(used)
        self.rejected.append(rejected)

    def freeze(self, capacity: int) -> Timeline:
        return Timeline(
            t=tuple(self.t),
            used_slices=tuple(self.used),
            rejected=tuple(self.rejected),
            capacity=capacity,
        )
