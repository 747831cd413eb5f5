"""Replaying a request trace on a fleet with the product's own placement engine.

Each request becomes the pod request the controller would build for a classic pod asking ``count``
slices of one profile (all on one GPU), and goes through ``Engine.place`` / ``commit`` exactly as in
the controller; its slices are released at placement time + ``duration``. Releases due at or before
an arrival happen first. By default a request that does not fit is rejected and dropped; with
``queue=True`` it waits in one FIFO queue (the head blocks those behind it, as a fair scheduler
would) and is placed as soon as releases make room for it.

With ``defrag_moves=K`` (not with the queue), a request that does not fit asks ``plan_defrag`` for
the fewest running requests, at most K, to move so that it fits; if there is such a plan, the moved
requests take their new places (in a cluster: their pods are evicted and restart there, keeping their
departure times) and the request is admitted at the plan's target. Requests of several slices get
targets on one GPU, as the engine places them. With ``defrag_whole_gpu_below=U`` as well, a request
that takes every memory slice of a GPU (such as 7g.40gb) may defragment only while less than the
fraction U of the fleet's memory slices is in use; smaller requests always may (at 95% load, plans
that admit whole-GPU requests hold memory several later small requests needed). With
``defrag_whole_gpu_reserve=F``, a whole-GPU request may defragment only if the memory slices still
free once it is admitted would hold the smaller requests' recent demand over F mean request
lifetimes: the memory slices they asked for (admitted or not) per second over the last
``DEMAND_WINDOW_LIFETIMES`` mean lifetimes, times F mean lifetimes. The mean lifetime is what the
replay has seen so far: the mean duration of the last ``LIFETIME_SAMPLE`` requests to depart
(before the first departure the rule allows). Every time in the rule is a multiple of that mean,
so a trace whose times and durations are all scaled by one factor gets the same decisions: the
rule is relative to the fleet's own traffic, not a fixed use level, and to its request lifetimes,
not a number of seconds that fits only one job length.

Figures per run: accepted / rejected, *stranded* (rejected although one GPU of a model offering the
profile had enough free memory slices — counted without placement rules: the fragmentation a policy
leaves behind), with defragmentation the requests admitted thanks to a plan and the requests moved,
memory-slice utilization (time-weighted mean and peak between the first and the last
arrival), queue waits, and optionally a timeline for plots.
"""

from __future__ import annotations

import heapq
import math
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from driver.errors import ConfigError
from driver.placement import Engine, NoFit, Placed, PodRequest, Policy
from instaslice.planning.defrag import NoPlan, plan_defrag
from instaslice.planning.fleet import Fleet
from instaslice.planning.running import RunningRequests, occupancy_problems
from instaslice.planning.trace import TraceRequest

Need = tuple[tuple[str, int], ...]
"""Per GPU model offering the request's profile: (model name, memory slices it needs there)."""

DEMAND_WINDOW_LIFETIMES = 0.4
"""``defrag_whole_gpu_reserve`` measures the smaller requests' demand over this many mean request
lifetimes of trace time before each arrival (120 s on traces of 300 s jobs)."""

LIFETIME_SAMPLE = 1_000
"""The mean request lifetime is the mean duration of this many latest departures."""


@dataclass(frozen=True, slots=True)
class Timeline:
    """Sampled at every arrival: time, memory slices in use, rejections so far."""

    t: tuple[float, ...]
    used_slices: tuple[int, ...]
    rejected: tuple[int, ...]
    capacity: int


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
    """Requests that had to wait (``queue=True`` only)."""
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
    timeline: Timeline | None = field(default=None, compare=False, repr=False)


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of already sorted values (0.0 when there are none)."""
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, math.ceil(fraction * len(sorted_values)) - 1))
    return float(sorted_values[index])


def needs_for(fleet: Fleet, request: TraceRequest, *, source: str = "trace") -> Need:
    """Where the request could go at all; ``ConfigError`` naming its line if nowhere is offered."""
    needs = []
    for model in fleet.models:
        for profile in model.profiles:
            if profile.name == request.profile:
                needs.append((model.name, profile.memory_slices * request.count))
    if not needs:
        where = f"{source} line {request.line}: " if request.line else ""
        raise ConfigError(
            f"{where}profile {request.profile!r} is not offered by any GPU of the fleet "
            f"{fleet.text} (offered: {', '.join(fleet.profile_names())})"
        )
    return tuple(needs)


def check_trace(
    trace: Sequence[TraceRequest], fleet: Fleet, *, source: str = "trace"
) -> dict[tuple[str, int], Need]:
    """The needs of every distinct (profile, count) of the trace; ``ConfigError`` on the first
    request whose profile the fleet does not offer."""
    needs: dict[tuple[str, int], Need] = {}
    for request in trace:
        key = (request.profile, request.count)
        if key not in needs:
            needs[key] = needs_for(fleet, request, source=source)
    return needs


def _stranded(engine: Engine, need: Need) -> bool:
    """Some GPU of a model offering the profile has enough free memory slices, rules aside.

    Asked only on a rejection (rare), so it reads the engine's GPUs instead of tracking them."""
    wanted = dict(need)
    for node in engine.inventory.nodes():
        for gpu in node.gpus:
            slices = wanted.get(gpu.spec.model.name)
            if slices is not None and gpu.table.slices - gpu.used >= slices:
                return True
    return False


class _Utilization:
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


class _WholeGpuAdmission:
    """May a rejected whole-GPU request defragment? ``defrag_whole_gpu_below`` and
    ``defrag_whole_gpu_reserve`` (both must allow it when both are given); other requests may."""

    def __init__(
        self,
        capacity: int,
        needs: dict[tuple[str, int], Need],
        whole_gpu: frozenset[tuple[str, int]],
        *,
        below: float | None,
        reserve: float | None,
    ) -> None:
        self.capacity = capacity
        self.whole_gpu = whole_gpu
        self.limit = math.inf if below is None else below * capacity
        self.reserve = reserve
        # Memory slices per (profile, count): the fewest any GPU model offering it needs.
        self.slices = {key: min(n for _, n in need) for key, need in needs.items()}
        # The smaller requests' arrivals (admitted or not): their times and the running sum of
        # their memory slices (``asked[i]``: the slices of the first i), so that the demand over
        # any window, which moves with the lifetime estimate, is two bisections away.
        self.times: list[float] = []
        self.asked: list[int] = [0]
        # Durations of the latest departures (at most LIFETIME_SAMPLE) and their sum.
        self.lifetimes: deque[float] = deque()
        self.lifetime_sum = 0.0

    def arrive(self, now: float, key: tuple[str, int]) -> None:
        """Count an arrival in the smaller requests' demand (kept only with ``reserve``)."""
        if self.reserve is None or key in self.whole_gpu:
            return
        self.times.append(now)
        self.asked.append(self.asked[-1] + self.slices[key])

    def depart(self, duration: float) -> None:
        """Count a departure's duration in the lifetime estimate (kept only with ``reserve``)."""
        if self.reserve is None:
            return
        lifetimes = self.lifetimes
        lifetimes.append(duration)
        self.lifetime_sum += duration
        if len(lifetimes) > LIFETIME_SAMPLE:
            self.lifetime_sum -= lifetimes.popleft()

    def allows(self, key: tuple[str, int], used: int, now: float) -> bool:
        if key not in self.whole_gpu:
            return True
        if used >= self.limit:
            return False
        if self.reserve is None or not self.lifetimes:
            return True  # no departure yet: no lifetime to measure the reserve in
        lifetime = self.lifetime_sum / len(self.lifetimes)
        window = DEMAND_WINDOW_LIFETIMES * lifetime
        if window <= 0:  # every departure so far lasted no time at all
            return True
        demand = self.asked[-1] - self.asked[bisect_left(self.times, now - window)]
        free_after = self.capacity - used - self.slices[key]
        return free_after >= self.reserve * lifetime * demand / window


def replay(
    trace: Sequence[TraceRequest],
    fleet: Fleet,
    *,
    policy: str | Policy,
    queue: bool = False,
    timeline: bool = False,
    defrag_moves: int = 0,
    defrag_whole_gpu_below: float | None = None,
    defrag_whole_gpu_reserve: float | None = None,
    check_invariants: bool = False,
) -> ReplayResult:
    """Replay ``trace`` on an empty ``fleet`` with ``policy``; see the module docstring.

    ``check_invariants`` (for tests) compares the engine's occupancy with the running requests'
    placements after every arrival, and checks that the engine is empty once every request still
    running at the end has departed; ``AssertionError`` naming the differences otherwise."""
    _check_defrag_moves(defrag_moves, queue=queue)
    _check_whole_gpu_below(defrag_whole_gpu_below, defrag_moves=defrag_moves)
    _check_whole_gpu_reserve(defrag_whole_gpu_reserve, defrag_moves=defrag_moves)
    needs = check_trace(trace, fleet)
    gpu_slices = {group.model.name: group.model.memory_slices for group in fleet.groups}
    # (profile, count) of the requests that take a whole GPU on every model that offers them.
    whole_gpu = frozenset(
        key for key, need in needs.items() if all(n >= gpu_slices[m] for m, n in need)
    )
    admission = _WholeGpuAdmission(
        fleet.memory_slices,
        needs,
        whole_gpu,
        below=defrag_whole_gpu_below,
        reserve=defrag_whole_gpu_reserve,
    )
    # Requests of a profile several GPU models offer may change model when they move.
    mobile = frozenset(profile for (profile, _), need in needs.items() if len(need) > 1)
    started = time.perf_counter()
    engine = Engine(policy=policy)
    for node in fleet.nodes:
        engine.set_node(node)
    pods: dict[tuple[str, int], PodRequest] = {
        key: PodRequest.single(key[0], count=key[1], one_gpu=key[1] > 1) for key in needs
    }
    # What could not be placed even on an empty fleet is rejected at once, never queued.
    empty = Engine(policy="firstfit")  # feasibility does not depend on the policy
    for node in fleet.nodes:
        empty.set_node(node)
    impossible = {key for key, pod in pods.items() if isinstance(empty.place(pod), NoFit)}
    first = trace[0].t if trace else 0.0
    last_arrival = trace[-1].t if trace else 0.0
    use = _Utilization(fleet.memory_slices, first)
    # Departure time, sequence number and duration; ``running`` says where the request is when it
    # departs.
    departures: list[tuple[float, int, float]] = []
    running = RunningRequests()
    waiting: deque[TraceRequest] = deque()
    waits: list[float] = []
    sequence = 0
    accepted = rejected = stranded = queued = 0
    defragged = moves = searched = budget_hit = 0
    samples_t: list[float] = []
    samples_used: list[int] = []
    samples_rejected: list[int] = []

    def admit(request: TraceRequest, placed: Placed, now: float) -> None:
        """Count ``placed`` (already committed) as running until ``now + duration``."""
        nonlocal sequence, accepted
        assignments = placed.assignments
        slices = assignments[0].size if len(assignments) == 1 else sum(a.size for a in assignments)
        use.take(slices)
        sequence += 1
        running.add(sequence, placed, slices)
        heapq.heappush(departures, (now + request.duration, sequence, request.duration))
        accepted += 1

    def try_place(request: TraceRequest, now: float) -> Placed | NoFit:
        result = engine.place(pods[(request.profile, request.count)])
        if isinstance(result, Placed):
            engine.commit(result)
            admit(request, result, now)
        return result

    def defragment(request: TraceRequest, need: Need) -> bool:
        """Admit ``request`` by moving at most ``defrag_moves`` running requests, if a plan does."""
        nonlocal defragged, moves, searched, budget_hit
        if not admission.allows((request.profile, request.count), use.used, request.t):
            return False
        if not running.could_make_room(engine, need, mobile):  # reads every GPU: after the rule
            return False
        searched += 1
        plan = plan_defrag(
            engine,
            running.units(),
            profile=request.profile,
            count=request.count,
            max_units=defrag_moves,
            one_gpu=request.count > 1,
        )
        if isinstance(plan, NoPlan):
            budget_hit += plan.budget_exhausted
            return False
        budget_hit += not plan.proven_minimal
        if not plan.moves:
            # The engine refused a placement the plan search finds free: a rule the search does
            # not model (such as a profile's max_count) stands, and the request is rejected.
            return False
        target, delta = running.apply(engine, plan)
        if delta > 0:  # moved to a model where its profile takes more memory slices
            use.take(delta)
        else:
            use.give(-delta)
        admit(request, target, request.t)
        defragged += 1
        moves += len(plan.moves)
        return True

    def after_arrival(now: float) -> None:
        if check_invariants:
            _check(engine, running, when=f"after the arrival at t={now}")
        if timeline:
            samples_t.append(now)
            samples_used.append(use.used)
            samples_rejected.append(rejected)

    def drain(now: float) -> None:
        while waiting:
            head = waiting[0]
            if isinstance(try_place(head, now), NoFit):
                return
            waiting.popleft()
            waits.append(now - head.t)

    def release_until(now: float) -> None:
        while departures and departures[0][0] <= now:
            end, departing, duration = heapq.heappop(departures)
            admission.depart(duration)
            use.advance(min(end, last_arrival))
            placed, slices = running.pop(departing)
            engine.release_placed(placed)
            use.give(slices)
            if queue:
                drain(end)

    for request in trace:
        release_until(request.t)
        use.advance(request.t)
        key = (request.profile, request.count)
        admission.arrive(request.t, key)
        if key in impossible:
            rejected += 1
        elif queue and waiting:
            waiting.append(request)
            queued += 1
        else:
            result = try_place(request, request.t)
            if isinstance(result, NoFit):
                if queue:
                    waiting.append(request)
                    queued += 1
                elif not (defrag_moves and defragment(request, needs[key])):
                    rejected += 1
                    stranded += _stranded(engine, needs[key])
            elif queue:
                waits.append(0.0)
        after_arrival(request.t)
    mean = use.mean(last_arrival)
    peak = use.peak / fleet.memory_slices if fleet.memory_slices else 0.0
    if queue:
        # Let the cluster run on until everyone waiting is placed (releases free everything).
        while waiting and departures:
            release_until(departures[0][0])
        rejected += len(waiting)
    if check_invariants:
        while departures:
            release_until(departures[0][0])
        _check(engine, running, when="once every request has departed")
    waits.sort()
    return ReplayResult(
        policy=engine.policy.name,
        requests=len(trace),
        accepted=accepted,
        rejected=rejected,
        stranded=stranded,
        mean_utilization=round(mean, 4),
        peak_utilization=round(peak, 4),
        wall_s=round(time.perf_counter() - started, 3),
        queued=queued,
        wait_p50_s=round(percentile(waits, 0.50), 3) if queue else None,
        wait_p99_s=round(percentile(waits, 0.99), 3) if queue else None,
        defrag_moves=defrag_moves,
        defrag_whole_gpu_below=defrag_whole_gpu_below,
        defrag_whole_gpu_reserve=defrag_whole_gpu_reserve,
        defragged=defragged,
        moves=moves,
        defrag_searched=searched,
        defrag_budget_hit=budget_hit,
        timeline=Timeline(
            t=tuple(samples_t),
            used_slices=tuple(samples_used),
            rejected=tuple(samples_rejected),
            capacity=fleet.memory_slices,
        )
        if timeline
        else None,
    )


def _check_defrag_moves(defrag_moves: int, *, queue: bool) -> None:
    if defrag_moves < 0:
        raise ConfigError(f"defrag_moves must be at least 0, got {defrag_moves}")
    if defrag_moves and queue:
        raise ConfigError(
            "defragmentation on rejection and the queue do not combine: with the queue a request "
            "that does not fit waits instead of being rejected"
        )


def _check_whole_gpu_below(below: float | None, *, defrag_moves: int) -> None:
    if below is None:
        return
    if not defrag_moves:
        raise ConfigError("defrag_whole_gpu_below needs defragmentation on (defrag_moves ≥ 1)")
    if not 0 < below <= 1:
        raise ConfigError(
            f"defrag_whole_gpu_below is a fraction of the fleet's memory slices in use, more than "
            f"0 and at most 1, got {below}"
        )


def _check_whole_gpu_reserve(reserve: float | None, *, defrag_moves: int) -> None:
    if reserve is None:
        return
    if not defrag_moves:
        raise ConfigError("defrag_whole_gpu_reserve needs defragmentation on (defrag_moves ≥ 1)")
    if not 0 < reserve <= 1:  # also refuses nan
        raise ConfigError(
            f"defrag_whole_gpu_reserve is a share of the mean request lifetime, more than 0 and "
            f"at most 1, got {reserve}"
        )


def _check(engine: Engine, running: RunningRequests, *, when: str) -> None:
    problems = occupancy_problems(engine, (placed for placed, _ in running.placed.values()))
    # Every request is one pod whose slices share a GPU, wherever it was placed or moved.
    problems += [
        f"request {sequence} is spread over GPUs: {placed.assignments}"
        for sequence, (placed, _) in running.placed.items()
        if len({(a.node, a.gpu_index) for a in placed.assignments}) > 1
    ]
    if problems:
        raise AssertionError(f"replay occupancy {when}: " + "; ".join(problems[:10]))


# ------------------------------------------------------------------------------ the floor


@dataclass(frozen=True, slots=True)
class FloorResult:
    """Rejections of a *fluid* fleet on the same trace (every request that fits in the total of
    free memory slices is admitted): what placement rules add is measured against it. Only a
    policy that turns requests away, such as ``defrag_whole_gpu_below``, can reject fewer."""

    requests: int
    rejected: int


def fluid_floor(trace: Sequence[TraceRequest], fleet: Fleet) -> FloorResult:
    """Replay ``trace`` on a fleet where only each model's total of free memory slices counts.

    No placement starts, no GPU boundaries, no ``max_count``: a request fits when some model that
    offers its profile has that many memory slices free anywhere (and one GPU of it is large enough
    at all). Where several models could take it, the one with the most free slices does. Perfect
    packing can only accept more than any real policy, so its rejections are the floor the
    policies are measured against.
    """
    needs = check_trace(trace, fleet)
    free: dict[str, int] = {}
    size: dict[str, int] = {}
    for group in fleet.groups:
        name = group.model.name
        free[name] = (
            free.get(name, 0) + group.nodes * group.gpus_per_node * group.model.memory_slices
        )
        size[name] = group.model.memory_slices
    departures: list[tuple[float, int, str, int]] = []
    rejected = 0
    for sequence, request in enumerate(trace):
        while departures and departures[0][0] <= request.t:
            _, _, model, slices = heapq.heappop(departures)
            free[model] += slices
        chosen = None
        for model, slices in needs[(request.profile, request.count)]:
            fits = slices <= size[model] and slices <= free[model]
            if fits and (chosen is None or free[model] > free[chosen[0]]):
                chosen = (model, slices)
        if chosen is None:
            rejected += 1
            continue
        free[chosen[0]] -= chosen[1]
        heapq.heappush(departures, (request.t + request.duration, sequence, *chosen))
    return FloorResult(requests=len(trace), rejected=rejected)
