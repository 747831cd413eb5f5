"""The queue mode of a replay: requests wait for room instead of being rejected, served by pod
priority, with preemption and reservations against starvation when asked for — the rules of the
controller's queue of gated pods (``docs/design.md`` D8).

Whenever slices free, the waiting requests are tried in the order of ``waitqueue`` (priority, then
the time they entered the queue) and every one that fits is placed: a request that does not fit
does not hold back those behind it. An arriving request is placed at once if it fits (nothing that
waits fit before it arrived). Releases due at or before an arrival happen first.

With ``preemption``, a request that fits nowhere, unless its ``preemptionPolicy`` is ``Never``,
evicts running requests of strictly lower priority when that makes room, chosen by
``preemption.choose_victims``, and is placed on that GPU at once. An evicted request goes back to
the queue as its pod is re-created: it enters the queue at the eviction and, once placed again,
runs its whole duration (the work it had done is lost).

With ``starvation_after=S``, a request that has waited S seconds since it entered the queue and
still fits nowhere may reserve a GPU (``reservations``); it is placed there as soon as it fits
there, and gives the reservation back wherever it is placed.

A request's wait is all the time it spent in the queue, before its first placement and after each
eviction. A request that did not fit is not tried again until a GPU that lost an occupant or a
reservation since could hold it (a log of such GPUs), so a long queue costs a try per group of
interchangeable requests per release, and a preemption search after a failed one reads only the
GPUs changed since.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Sequence

from driver.errors import ConfigError
from driver.placement import DeviceRequest, NoFit, Placed, PodRequest, Policy, same_gpu
from driver.placement.request import DeviceRef
from driver.placement.tables import signature_of
from instaslice.planning.figures import (
    PriorityFigures,
    ReplayResult,
    TimelineSamples,
    Utilization,
    percentile,
)
from instaslice.planning.fleet import Fleet
from instaslice.planning.limits import MAX_TRACE_SECONDS
from instaslice.planning.preemption import GpuKey, Holder, RunningByGpu, choose_victims
from instaslice.planning.reservations import Reservations
from instaslice.planning.running import RunningRequests, check_running
from instaslice.planning.trace import TraceRequest, check_trace
from instaslice.planning.waitqueue import NOTHING_BLOCKED, GroupKey, Waiting, WaitQueue

Key = tuple[str, int]
"""(profile, count) of a request."""

Memo = tuple[Key, int]
"""What a failed try depends on besides the GPUs: (profile, count) and priority."""

_POD_CACHE_LIMIT = 1024


def check_queue_rules(*, queue: bool, preemption: bool, starvation_after: float | None) -> None:
    """``ConfigError`` for preemption or reservations without the queue, or a bad bound."""
    if preemption and not queue:
        raise ConfigError("preemption needs the queue: without it nothing waits to preempt")
    if starvation_after is None:
        return
    if not queue:
        raise ConfigError("starvation_after needs the queue: without it nothing waits")
    if not 0 < starvation_after <= MAX_TRACE_SECONDS:  # also refuses nan
        raise ConfigError(
            f"starvation_after is seconds of waiting, more than 0 and at most "
            f"{MAX_TRACE_SECONDS:g}, got {starvation_after}"
        )


class _NotOn:
    """A device predicate: not on the given GPUs."""

    def __init__(self, gpus: frozenset[GpuKey]) -> None:
        self.gpus = gpus

    def __call__(self, ref: DeviceRef) -> bool:
        return (ref.node, ref.gpu_index) not in self.gpus


class _On:
    """A device predicate: on the given GPU only."""

    def __init__(self, gpu: GpuKey) -> None:
        self.gpu = gpu

    def __call__(self, ref: DeviceRef) -> bool:
        return (ref.node, ref.gpu_index) == self.gpu


def _pod(key: Key, predicate: _NotOn | _On | None) -> PodRequest:
    profile, count = key
    return PodRequest(
        requests=(
            DeviceRequest(
                name="mig", profiles=frozenset({profile}), count=count, predicate=predicate
            ),
        ),
        constraints=(same_gpu("mig"),) if count > 1 else (),
    )


class QueuedReplay:
    """One queued replay in progress: the engine, the running and waiting requests, and the
    counters. :meth:`arrive` takes the trace's requests in order; :meth:`finish` lets what still
    waits run and returns the figures."""

    def __init__(
        self,
        trace: Sequence[TraceRequest],
        fleet: Fleet,
        *,
        policy: str | Policy,
        timeline: bool,
        preemption: bool,
        starvation_after: float | None,
        check_invariants: bool,
    ) -> None:
        self.trace, self.fleet = trace, fleet
        self.preemption, self.starvation_after = preemption, starvation_after
        self.check_invariants = check_invariants
        self.started = time.perf_counter()
        needs = check_trace(trace, fleet)
        self.engine = fleet.engine(policy)
        self.pods: dict[tuple[Key, frozenset[GpuKey]], PodRequest] = {
            (key, NOTHING_BLOCKED): _pod(key, None) for key in needs
        }
        self.signatures = {key: signature_of([key]) for key in needs}
        # What could not be placed even on an empty fleet is rejected at once, never queued.
        empty = fleet.engine("firstfit")  # feasibility does not depend on the policy
        self.impossible = {
            k for k in needs if isinstance(empty.place(self.pods[(k, NOTHING_BLOCKED)]), NoFit)
        }
        self.gpus: tuple[GpuKey, ...] = tuple(
            (node.name, gpu.index) for node in fleet.nodes for gpu in node.gpus
        )
        self.last_arrival = trace[-1].t if trace else 0.0
        self.use = Utilization(fleet.memory_slices, trace[0].t if trace else 0.0)
        self.departures: list[tuple[float, int]] = []
        """(departure, sequence number); an evicted request's entry is skipped."""
        self.deadlines: list[tuple[float, int]] = []
        """(when its wait passes ``starvation_after``, trace index)."""
        self.running = RunningRequests()
        self.holders = RunningByGpu()
        self.index_of: dict[int, int] = {}
        """Sequence number of a running request → its place in the trace."""
        self.queue = WaitQueue()
        self.reservations = Reservations(self.engine, self.gpus, self.holders, self.queue)
        self.changed: list[GpuKey] = []
        """GPUs that lost an occupant or a reservation, in order: a try that failed is not
        repeated until one of them could hold the request."""
        self.unplaceable: dict[Memo, int] = {}
        self.unpreemptable: dict[Memo, int] = {}
        """Where a try failed last: the length of ``changed`` then."""
        self.level_seen: dict[int, int] = {}
        """Per priority: the length of ``changed`` when its requests were last all tried."""
        self.untried: set[int] = set()
        """Priorities with requests never tried (evicted ones)."""
        self.waited: dict[int, float] = {}
        """Trace index of every request placed at least once → its time waiting so far."""
        self.preempted: Counter[int] = Counter()
        self.turned_away: Counter[int] = Counter()
        self.sequence = self.arrived = 0
        self.accepted = self.rejected = self.queued = 0
        self.timeline = TimelineSamples() if timeline else None

    # ----------------------------------------------------------------------------- the events

    def arrive(self, request: TraceRequest) -> None:
        """Releases and deadlines due by the arrival, then ``request`` placed or queued."""
        now = request.t
        self._advance(now)
        self.use.advance(now)
        index = self.arrived
        self.arrived += 1
        if (request.profile, request.count) in self.impossible:
            self.rejected += 1
            self.turned_away[request.priority] += 1
        else:
            waiting = Waiting(index=index, request=request, since=now)
            if not self._try(waiting, now):
                self._enqueue(waiting, now)
                self.queued += 1
            elif self.untried:  # it preempted: the evicted may fit elsewhere
                self._drain(now)
        if self.check_invariants:
            check_running(self.engine, self.running, when=f"after the arrival at t={now}")
        if self.timeline is not None:
            self.timeline.sample(now, used=self.use.used, rejected=self.rejected)

    def finish(self) -> ReplayResult:
        """Utilization up to the last arrival; then the cluster runs on until everyone waiting is
        placed (releases free everything)."""
        mean = self.use.mean(self.last_arrival)
        while self.queue and self.departures:
            self._advance(self.departures[0][0])
        for waiting in self.queue:  # nothing left to release: they could never be placed
            self.rejected += 1
            self.turned_away[waiting.request.priority] += 1
        if self.check_invariants:
            while self.departures:
                self._advance(self.departures[0][0])
            check_running(self.engine, self.running, when="once every request has departed")
        return self._result(mean)

    def _advance(self, now: float) -> None:
        """Departures and starvation deadlines due by ``now``, in time order (at one time,
        departures first)."""
        departures, deadlines = self.departures, self.deadlines
        while True:
            departure = departures[0][0] if departures else math.inf
            deadline = deadlines[0][0] if deadlines else math.inf
            if departure <= deadline and departure <= now:
                _, sequence = heapq.heappop(departures)
                if self.index_of.pop(sequence, None) is not None:  # not evicted meanwhile
                    self.use.advance(min(departure, self.last_arrival))
                    self._stop(sequence)
                    self._drain(departure)
            elif deadline <= now:
                _, index = heapq.heappop(deadlines)
                self._starve(deadline, index)
            else:
                return

    def _starve(self, deadline: float, index: int) -> None:
        """``index`` has waited ``starvation_after``, if it still waits since then."""
        waiting = self.queue.get(index)
        if waiting is None or waiting.reserved is not None:
            return
        assert self.starvation_after is not None  # deadlines exist only then
        if waiting.since + self.starvation_after == deadline:  # else evicted since: a new wait
            self.reservations.starve(waiting)

    # --------------------------------------------------------------------------------- placing

    def _drain(self, now: float) -> None:
        """Every waiting request that fits now placed, in serving order; then reservations for
        the starving."""
        queue = self.queue
        level = queue.levels_below(None)
        while level is not None:
            self._drain_level(level, now)
            level = queue.levels_below(level)
        if self.reservations:
            self.reservations.settle()

    def _drain_level(self, priority: int, now: float) -> None:
        """Every request of ``priority`` that fits now placed: first the holders whose reserved
        GPU changed, there; then the first of each group, the earliest first, until every group
        has failed since the last change. The groups are skipped when every GPU changed since
        they were last tried is reserved for their priority or higher."""
        changed, queue = self.changed, self.queue
        seen = self.level_seen.get(priority)
        fresh = None if seen is None else set(changed[seen:])
        everyone = fresh is None or priority in self.untried or not fresh <= queue.blocked(priority)
        for holder in queue.holders(priority, on=fresh):
            if self._try_reserved(holder, now):
                everyone = True  # its GPU is given back: the others may use what is left
        if everyone:
            self._drain_groups(priority, now)
        self.level_seen[priority] = len(changed)
        self.untried.discard(priority)

    def _drain_groups(self, priority: int, now: float) -> None:
        queue = self.queue
        heads = queue.heads(priority)
        heapq.heapify(heads)
        tried: list[tuple[float, int, GroupKey]] = []
        while heads:
            entry = heapq.heappop(heads)
            waiting = queue.head(priority, entry[2])
            if waiting is None:
                continue
            if waiting.index != entry[1]:  # the group's head changed since
                heapq.heappush(heads, (waiting.since, waiting.index, entry[2]))
                continue
            stamp = len(self.changed)
            if not self._try(waiting, now):
                tried.append(entry)
                continue
            following = queue.head(priority, entry[2])
            if following is not None:
                heapq.heappush(heads, (following.since, following.index, entry[2]))
            if len(self.changed) != stamp:  # slices or a reservation given back: try them again
                for earlier in tried:
                    heapq.heappush(heads, earlier)
                tried.clear()

    def _try(self, waiting: Waiting, now: float) -> bool:
        """Place ``waiting`` on a GPU not reserved for its priority or higher, else by
        preemption if allowed; whether it was placed."""
        request = waiting.request
        key = (request.profile, request.count)
        memo = (key, request.priority)
        blocked = self.queue.blocked(request.priority)
        nodes = self._fitting_nodes(memo, blocked)
        if nodes is not None:
            pod = self.pods.get((key, blocked))
            if pod is None:
                if len(self.pods) >= _POD_CACHE_LIMIT:
                    self.pods = {k: p for k, p in self.pods.items() if not k[1]}
                pod = self.pods[(key, blocked)] = _pod(key, _NotOn(blocked))
            result = self.engine.place(pod, node_filter=nodes.__contains__ if nodes else None)
            if isinstance(result, Placed):
                self.unplaceable.pop(memo, None)
                self._start(waiting, result, now)
                return True
            self.unplaceable[memo] = len(self.changed)
        if not self.preemption or request.preemption_policy == "Never":
            return False
        stamp = len(self.changed)
        failed_at = self.unpreemptable.get(memo)
        if failed_at == stamp:
            return False
        # After a failed search only the GPUs changed since can have become candidates.
        gpus = self.gpus if failed_at is None else sorted(set(self.changed[failed_at:]))
        if self._preempt(waiting, [gpu for gpu in gpus if gpu not in blocked], now):
            return True
        self.unpreemptable[memo] = stamp
        return False

    def _fitting_nodes(self, memo: Memo, blocked: frozenset[GpuKey]) -> frozenset[str] | None:
        """Where a placement can succeed: None when nowhere, the empty set when no try failed
        yet (anywhere), else the nodes of the GPUs that changed since the last failure and hold
        the request now (every other GPU only took occupants since)."""
        failed_at = self.unplaceable.get(memo)
        if failed_at is None:
            return frozenset()
        changed = self.changed
        if failed_at == len(changed):
            return None
        signature = self.signatures[memo[0]]
        inventory = self.engine.inventory
        nodes = frozenset(
            gpu[0]
            for gpu in set(changed[failed_at:])
            if gpu not in blocked
            and (state := inventory.gpu(*gpu)).table.fits(
                signature, mask=state.mask, media_taken=state.media_taken, counts=state.counts
            )
        )
        if not nodes:
            self.unplaceable[memo] = len(changed)
            return None
        return nodes

    def _try_reserved(self, holder: Waiting, now: float) -> bool:
        """Place a holder on its reserved GPU, by preemption there if need be; whether it was."""
        gpu = holder.reserved
        assert gpu is not None  # a holder's
        request = holder.request
        state = self.engine.inventory.gpu(*gpu)
        if state.table.fits(
            self.signatures[(request.profile, request.count)],
            mask=state.mask,
            media_taken=state.media_taken,
            counts=state.counts,
        ):
            self._start(holder, self._place_on(gpu, request), now)
            return True
        preempts = self.preemption and request.preemption_policy != "Never"
        return preempts and self._preempt(holder, [gpu], now)

    def _preempt(self, waiting: Waiting, gpus: Sequence[GpuKey], now: float) -> bool:
        """Evict the victims ``choose_victims`` names among ``gpus`` (in the fleet's order) and
        place ``waiting`` on their GPU; whether there were any."""
        request = waiting.request
        victims = choose_victims(
            self.engine,
            self.holders,
            profile=request.profile,
            count=request.count,
            priority=request.priority,
            gpus=gpus,
        )
        if victims is None:
            return False
        for sequence in victims.sequences:
            self._evict(sequence, now)
        self._start(waiting, self._place_on(victims.gpu, request), now)
        return True

    def _place_on(self, gpu: GpuKey, request: TraceRequest) -> Placed:
        """Where on ``gpu`` the engine places ``request``, which fits there."""
        node = gpu[0]
        result = self.engine.place(
            _pod((request.profile, request.count), _On(gpu)), node_filter=node.__eq__
        )
        if not isinstance(result, Placed):
            raise AssertionError(f"{request} does not fit {gpu} as its table says: {result}")
        return result

    def _start(self, waiting: Waiting, placed: Placed, now: float) -> None:
        """Commit ``placed`` and run ``waiting`` there until ``now + duration``."""
        self.engine.commit(placed)
        assignments = placed.assignments
        slices = assignments[0].size if len(assignments) == 1 else sum(a.size for a in assignments)
        self.use.take(slices)
        self.sequence += 1
        request = waiting.request
        self.running.add(self.sequence, placed, slices)
        self.holders.add(Holder(self.sequence, request.priority, now, assignments))
        self.index_of[self.sequence] = waiting.index
        heapq.heappush(self.departures, (now + request.duration, self.sequence))
        if self.queue.get(waiting.index) is waiting:
            released = self.queue.remove(waiting)
            if released is not None:
                self.changed.append(released)
        before = self.waited.get(waiting.index)
        if before is None:
            self.accepted += 1
        self.waited[waiting.index] = (before or 0.0) + (now - waiting.since)

    def _stop(self, sequence: int) -> None:
        """Release the slices of a running request (it departs or is evicted)."""
        placed, slices = self.running.pop(sequence)
        self.engine.release_placed(placed)
        self.use.give(slices)
        self.changed.append(self.holders.remove(sequence).gpu)

    def _evict(self, sequence: int, now: float) -> None:
        """Preempt a running request: its pod is re-created, and waits from ``now``."""
        self._stop(sequence)
        index = self.index_of.pop(sequence)
        request = self.trace[index]
        self.preempted[request.priority] += 1
        self._enqueue(Waiting(index=index, request=request, since=now), now)
        self.untried.add(request.priority)

    def _enqueue(self, waiting: Waiting, now: float) -> None:
        self.queue.add(waiting)
        if self.starvation_after is not None:
            heapq.heappush(self.deadlines, (now + self.starvation_after, waiting.index))

    # --------------------------------------------------------------------------------- figures

    def _result(self, mean: float) -> ReplayResult:
        trace, waited = self.trace, self.waited
        requests = Counter(r.priority for r in trace)
        waits: dict[int, list[float]] = {p: [] for p in requests}
        for index, wait in waited.items():
            waits[trace[index].priority].append(wait)
        by_priority = tuple(
            _priority_figures(
                priority,
                requests=requests[priority],
                waits=waits[priority],
                rejected=self.turned_away[priority],
                preempted=self.preempted[priority],
            )
            for priority in sorted(requests, reverse=True)
        )
        largest = self._largest_profile()
        largest_waits = sorted(w for i, w in waited.items() if trace[i].profile == largest)
        every = sorted(waited.values())
        return ReplayResult(
            policy=self.engine.policy.name,
            requests=len(trace),
            accepted=self.accepted,
            rejected=self.rejected,
            stranded=0,
            mean_utilization=round(mean, 4),
            peak_utilization=round(self.use.peak_share(), 4),
            wall_s=round(time.perf_counter() - self.started, 3),
            queued=self.queued,
            wait_p50_s=round(percentile(every, 0.50), 3),
            wait_p99_s=round(percentile(every, 0.99), 3),
            preemption=self.preemption,
            starvation_after_s=self.starvation_after,
            preempted=sum(self.preempted.values()),
            reservations=self.reservations.made,
            by_priority=by_priority,
            largest_profile=largest,
            largest_wait_p50_s=round(percentile(largest_waits, 0.50), 3),
            largest_wait_p99_s=round(percentile(largest_waits, 0.99), 3),
            timeline=self.timeline.freeze(self.fleet.memory_slices) if self.timeline else None,
        )

    def _largest_profile(self) -> str | None:
        """The trace's profile taking the most memory slices (by name among equals)."""
        sizes = {r.profile: self.fleet.slices_of(r.profile) or 0 for r in self.trace}
        return min(sizes, key=lambda p: (-sizes[p], p), default=None)


def _priority_figures(
    priority: int, *, requests: int, waits: list[float], rejected: int, preempted: int
) -> PriorityFigures:
    waits.sort()
    return PriorityFigures(
        priority=priority,
        requests=requests,
        admitted=len(waits),
        rejected=rejected,
        preempted=preempted,
        wait_p50_s=round(percentile(waits, 0.50), 3),
        wait_p99_s=round(percentile(waits, 0.99), 3),
    )
