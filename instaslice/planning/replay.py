"""Replaying a request trace on a fleet with the product's own placement engine.

Each request becomes the pod request the controller would build for a classic pod asking ``count``
slices of one profile (all on one GPU), and goes through ``Engine.place`` / ``commit`` exactly as in
the controller; its slices are released at placement time + ``duration``. Releases due at or before
an arrival happen first. A request that does not fit is rejected and dropped; with ``queue=True``
it waits instead (``instaslice.planning.queued``: served by priority, with preemption and
reservations against starvation when asked for).

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

The plan searches of one replay share a budget of search steps (``defrag_search_steps``, by default
``MAX_DEFRAG_SEARCH_STEPS_PER_REPLAY``): each search gets what the earlier ones left, and once it is
spent later rejections stand without a search. A replay thus takes bounded time however much it
rejects, and the same trace gives the same figures every run (steps are counted, not seconds).

Figures per run: accepted / rejected, *stranded* (rejected although one GPU of a model offering the
profile had enough free memory slices — counted without placement rules: the fragmentation a policy
leaves behind), with defragmentation the requests admitted thanks to a plan and the requests moved,
memory-slice utilization (time-weighted mean and peak between the first and the last
arrival), and optionally a timeline for plots.
"""

from __future__ import annotations

import heapq
import math
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from driver.errors import ConfigError
from driver.placement import Engine, NoFit, Placed, PodRequest, Policy
from instaslice.planning import limits
from instaslice.planning.defrag import NoPlan, plan_defrag
from instaslice.planning.figures import ReplayResult, TimelineSamples, Utilization
from instaslice.planning.fleet import Fleet
from instaslice.planning.queued import QueuedReplay, check_queue_rules
from instaslice.planning.running import RunningRequests, check_running
from instaslice.planning.trace import Need, TraceRequest, check_trace

DEMAND_WINDOW_LIFETIMES = 0.4
"""``defrag_whole_gpu_reserve`` measures the smaller requests' demand over this many mean request
lifetimes of trace time before each arrival (120 s on traces of 300 s jobs)."""

LIFETIME_SAMPLE = 1_000
"""The mean request lifetime is the mean duration of this many latest departures."""


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
    defrag_search_steps: int | None = None,
    preemption: bool = False,
    starvation_after: float | None = None,
    check_invariants: bool = False,
) -> ReplayResult:
    """Replay ``trace`` on an empty ``fleet`` with ``policy``; see the module docstring (and
    ``instaslice.planning.queued`` for ``queue=True``, ``preemption`` and ``starvation_after``).

    ``defrag_search_steps`` is the replay's budget of search steps for its plan searches (None:
    ``limits.MAX_DEFRAG_SEARCH_STEPS_PER_REPLAY``, read at each call).

    ``check_invariants`` (for tests) compares the engine's occupancy with the running requests'
    placements after every arrival, and checks that the engine is empty once every request still
    running at the end has departed; ``AssertionError`` naming the differences otherwise."""
    _check_defrag_moves(defrag_moves, queue=queue)
    check_queue_rules(queue=queue, preemption=preemption, starvation_after=starvation_after)
    _check_whole_gpu_below(defrag_whole_gpu_below, defrag_moves=defrag_moves)
    _check_whole_gpu_reserve(defrag_whole_gpu_reserve, defrag_moves=defrag_moves)
    if defrag_search_steps is None:
        defrag_search_steps = limits.MAX_DEFRAG_SEARCH_STEPS_PER_REPLAY
    if defrag_search_steps < 0:
        raise ConfigError(f"defrag_search_steps must be at least 0, got {defrag_search_steps}")
    if queue:
        queued = QueuedReplay(
            trace,
            fleet,
            policy=policy,
            timeline=timeline,
            preemption=preemption,
            starvation_after=starvation_after,
            check_invariants=check_invariants,
        )
        for request in trace:
            queued.arrive(request)
        return queued.finish()
    run = _Replay(
        trace,
        fleet,
        policy=policy,
        timeline=timeline,
        defrag_moves=defrag_moves,
        defrag_whole_gpu_below=defrag_whole_gpu_below,
        defrag_whole_gpu_reserve=defrag_whole_gpu_reserve,
        defrag_search_steps=defrag_search_steps if defrag_moves else 0,
        check_invariants=check_invariants,
    )
    for request in trace:
        run.arrive(request)
    return run.finish()


class _Replay:
    """One replay in progress that rejects what does not fit: the engine, the running requests,
    defragmentation on rejection, and the counters.

    :meth:`arrive` takes the trace's requests in order; :meth:`finish` returns the figures."""

    def __init__(
        self,
        trace: Sequence[TraceRequest],
        fleet: Fleet,
        *,
        policy: str | Policy,
        timeline: bool,
        defrag_moves: int,
        defrag_whole_gpu_below: float | None,
        defrag_whole_gpu_reserve: float | None,
        defrag_search_steps: int,
        check_invariants: bool,
    ) -> None:
        self.trace, self.fleet = trace, fleet
        self.defrag_moves, self.check_invariants = defrag_moves, check_invariants
        self.defrag_whole_gpu_below = defrag_whole_gpu_below
        self.defrag_whole_gpu_reserve = defrag_whole_gpu_reserve
        self.needs = needs = check_trace(trace, fleet)
        gpu_slices = {group.model.name: group.model.memory_slices for group in fleet.groups}
        # (profile, count) of the requests that take a whole GPU on every model that offers them.
        whole_gpu = frozenset(
            key for key, need in needs.items() if all(n >= gpu_slices[m] for m, n in need)
        )
        self.admission = _WholeGpuAdmission(
            fleet.memory_slices,
            needs,
            whole_gpu,
            below=defrag_whole_gpu_below,
            reserve=defrag_whole_gpu_reserve,
        )
        # Requests of a profile several GPU models offer may change model when they move.
        self.mobile = frozenset(profile for (profile, _), need in needs.items() if len(need) > 1)
        self.started = time.perf_counter()
        self.engine = fleet.engine(policy)
        self.pods: dict[tuple[str, int], PodRequest] = {
            key: PodRequest.single(key[0], count=key[1], one_gpu=key[1] > 1) for key in needs
        }
        # What could not be placed even on an empty fleet is rejected at once.
        empty = fleet.engine("firstfit")  # feasibility does not depend on the policy
        self.impossible = {k for k, pod in self.pods.items() if isinstance(empty.place(pod), NoFit)}
        self.last_arrival = trace[-1].t if trace else 0.0
        self.use = Utilization(fleet.memory_slices, trace[0].t if trace else 0.0)
        # Departure time, sequence number and duration; ``running`` says where the request is
        # when it departs.
        self.departures: list[tuple[float, int, float]] = []
        self.running = RunningRequests()
        self.sequence = 0
        self.accepted = self.rejected = self.stranded = 0
        self.defragged = self.moves = self.searched = self.budget_hit = 0
        self.search_budget = defrag_search_steps
        self.search_steps = self.unsearched = 0
        self.search_cut_short = False
        self.timeline = TimelineSamples() if timeline else None

    def arrive(self, request: TraceRequest) -> None:
        """Releases due by the arrival, then ``request`` placed, defragmented for or rejected."""
        now = request.t
        self._release_until(now)
        self.use.advance(now)
        key = (request.profile, request.count)
        self.admission.arrive(now, key)
        if key in self.impossible:
            self.rejected += 1
        elif isinstance(self._try_place(request, now), NoFit) and not (
            self.defrag_moves and self._defragment(request, self.needs[key])
        ):
            self.rejected += 1
            self.stranded += _stranded(self.engine, self.needs[key])
        if self.check_invariants:
            check_running(self.engine, self.running, when=f"after the arrival at t={now}")
        if self.timeline is not None:
            self.timeline.sample(now, used=self.use.used, rejected=self.rejected)

    def finish(self) -> ReplayResult:
        """The figures, utilization up to the last arrival."""
        mean = self.use.mean(self.last_arrival)
        capacity = self.fleet.memory_slices
        if self.check_invariants:
            while self.departures:
                self._release_until(self.departures[0][0])
            check_running(self.engine, self.running, when="once every request has departed")
        return ReplayResult(
            policy=self.engine.policy.name,
            requests=len(self.trace),
            accepted=self.accepted,
            rejected=self.rejected,
            stranded=self.stranded,
            mean_utilization=round(mean, 4),
            peak_utilization=round(self.use.peak_share(), 4),
            wall_s=round(time.perf_counter() - self.started, 3),
            defrag_moves=self.defrag_moves,
            defrag_whole_gpu_below=self.defrag_whole_gpu_below,
            defrag_whole_gpu_reserve=self.defrag_whole_gpu_reserve,
            defragged=self.defragged,
            moves=self.moves,
            defrag_searched=self.searched,
            defrag_budget_hit=self.budget_hit,
            defrag_search_budget=self.search_budget,
            defrag_search_steps=self.search_steps,
            defrag_budget_spent=self._search_budget_spent(),
            defrag_unsearched=self.unsearched,
            timeline=self.timeline.freeze(capacity) if self.timeline is not None else None,
        )

    def _admit(self, request: TraceRequest, placed: Placed, now: float) -> None:
        """Count ``placed`` (already committed) as running until ``now + duration``."""
        assignments = placed.assignments
        slices = assignments[0].size if len(assignments) == 1 else sum(a.size for a in assignments)
        self.use.take(slices)
        self.sequence += 1
        self.running.add(self.sequence, placed, slices)
        heapq.heappush(self.departures, (now + request.duration, self.sequence, request.duration))
        self.accepted += 1

    def _try_place(self, request: TraceRequest, now: float) -> Placed | NoFit:
        result = self.engine.place(self.pods[(request.profile, request.count)])
        if isinstance(result, Placed):
            self.engine.commit(result)
            self._admit(request, result, now)
        return result

    def _defragment(self, request: TraceRequest, need: Need) -> bool:
        """Admit ``request`` by moving at most ``defrag_moves`` running requests, if a plan does."""
        engine, running, use = self.engine, self.running, self.use
        if not self.admission.allows((request.profile, request.count), use.used, request.t):
            return False
        if not running.could_make_room(
            engine, need, self.mobile
        ):  # reads every GPU: after the rule
            return False
        if self._search_budget_spent():
            self.unsearched += 1
            return False
        self.searched += 1
        plan = plan_defrag(
            engine,
            running.units(),
            profile=request.profile,
            count=request.count,
            max_units=self.defrag_moves,
            one_gpu=request.count > 1,
            max_search_steps=self.search_budget - self.search_steps,
        )
        self.search_steps += plan.search_steps
        if isinstance(plan, NoPlan):
            self.search_cut_short = plan.allowance_spent
            # A search cut short by the replay's budget did not stop at its own.
            self.budget_hit += plan.budget_exhausted and not plan.allowance_spent
            return False
        self.budget_hit += not plan.proven_minimal
        if not plan.moves:
            # The engine refused a placement the plan search finds free: a rule the search does
            # not model (such as a profile's max_count) stands, and the request is rejected.
            return False
        target, delta = running.apply(engine, plan)
        if delta > 0:  # moved to a model where its profile takes more memory slices
            use.take(delta)
        else:
            use.give(-delta)
        self._admit(request, target, request.t)
        self.defragged += 1
        self.moves += len(plan.moves)
        return True

    def _search_budget_spent(self) -> bool:
        """The replay's search steps are spent: a search was cut short, or none is left."""
        return self.search_cut_short or (
            self.defrag_moves > 0 and self.search_steps >= self.search_budget
        )

    def _release_until(self, now: float) -> None:
        departures = self.departures
        while departures and departures[0][0] <= now:
            end, departing, duration = heapq.heappop(departures)
            self.admission.depart(duration)
            self.use.advance(min(end, self.last_arrival))
            placed, slices = self.running.pop(departing)
            self.engine.release_placed(placed)
            self.use.give(slices)


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
    at all). Where several models could take it, the one with the most free slices does. Every
    request that fits when it arrives is admitted, so while the fleet keeps up no real policy
    rejects fewer: its rejections are the floor the policies are measured against. Under overload
    it is not a bound — admitting a request greedily can crowd out several later ones, and a
    policy that happened to reject the first can accept them (as can ``--queue``).
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
