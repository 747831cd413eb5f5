"""One gated pod, one pass: collect its claims, place them, write, check, ungate.

The steps, each safe to repeat after a crash or a lost race:

1. Collect the pod's claims (``podclaims``); classic requests get their shadow claims (``classic``).
   A pod none of whose claims is ours is ungated at once (the webhook gates pods whose claims do
   not exist yet; see ``admission``).
2. Decide under the state lock: every unallocated claim of ours at once, on one node that every
   already allocated claim allows and that passes the node filter. The decision is reserved in the
   occupancy (*assumed*) before the lock is released.
3. Write each claim's finalizer and allocation (``writes``); a lost race is never forced.
4. Check the allocations for overlaps with ones committed before them (``writes``): what two
   racing allocators wrote, the later one withdraws.
5. Classic pods get a ``nodeSelector`` for the node (allowed while gated); then the gate is lifted.

A DRA pod that waits for capacity longer than ``SyncConfig.handoff_after``, or that we placed and
kube-scheduler cannot bind for that long, is handed to kube-scheduler; in scheduler mode every gated
pod is (``handoff``).

Every write first checks ``is_leader()``: a replica that lost its lease stops at once. The pod is
looked at again after ``SyncConfig.not_leader_retry``: ``is_leader()`` is also False for a moment
when a lease renew is late, and leadership then comes back without a new term, so nothing else
would requeue it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from api import wire
from api.names import CLASSIC_RESOURCE_PREFIX, DRIVER_NAME, SCHEDULING_GATE, classic_resource_name
from controller.allocation import handoff
from controller.allocation.arbiter import Arbiter, NoPreemption, Preemption
from controller.allocation.conditions import ConditionReporter, PlacementProblem, Reason
from controller.allocation.holds import Hold, HoldKind
from controller.allocation.nodefilter import HOSTNAME_LABEL, pod_usage
from controller.allocation.outcome import NotLeaderError, Outcome, Result, SyncConfig
from controller.allocation.podclaims import NotReady, PodClaims, dra_claims, sort_claims
from controller.allocation.preempting import Preempting
from controller.allocation.priority import PodOrder
from controller.allocation.requests import (
    Alternative,
    beyond_every_node,
    build_alternatives,
    pod_request,
)
from controller.allocation.results import allocations
from controller.allocation.state import AllocationState
from controller.allocation.waiting import Waiter
from controller.allocation.writes import AllocationWriter, Written
from controller.classic import shadow
from controller.informers import ClusterInformers
from controller.metrics import ControllerMetrics
from driver.cluster import ops
from driver.cluster.clock import Clock
from driver.cluster.port import ClusterApi, JsonObject, as_json
from driver.cluster.views import Allocation, ClaimView, PodView
from driver.errors import ApiNotFoundError, ClusterError, ConflictError, ForbiddenError
from driver.mig.catalog import CATALOG
from driver.placement import NoFit, Placed

__all__ = ["Outcome", "PodSync", "Result", "SyncConfig"]

logger = logging.getLogger(__name__)

_REMEMBERED_UNGATES = 10_000


@dataclass(slots=True)
class _Decision:
    node: str
    allocations: list[wire.AllocationResult]
    generation: int


class NoRoom(PlacementProblem):
    """No room now (``NoCapacity``), with what the arbiter decided for the pod meanwhile."""

    def __init__(
        self,
        message: str,
        *,
        preemption: Preemption | None = None,
        held: Hold | None = None,
        held_left: int = 0,
        reserve_in: float | None = None,
    ) -> None:
        super().__init__(Reason.NO_CAPACITY, message)
        self.reserve_in = reserve_in
        """Seconds until the starvation bound: the pod is looked at again then, capacity
        event or not."""
        self.preemption = preemption
        self.held = held
        """A reservation or preemption hold the pod waits on."""
        self.held_left = held_left
        """Claims still holding slices on the held GPUs."""


class PodSync:
    def __init__(
        self,
        *,
        api: ClusterApi,
        informers: ClusterInformers,
        state: AllocationState,
        reporter: ConditionReporter,
        metrics: ControllerMetrics,
        clock: Clock,
        is_leader: Callable[[], bool],
        latency: Callable[[PodView], float | None],
        config: SyncConfig | None = None,
        rng: random.Random | None = None,
        wake_keys: Callable[[list[str]], None] = lambda keys: None,
        wake_waiting: Callable[[], None] = lambda: None,
    ) -> None:
        self._api = api
        self._wake_keys = wake_keys
        self._wake_waiting = wake_waiting
        """Enqueue pods woken by a decision (held for), and every pod waiting for capacity
        (room held for someone was released)."""
        self._informers = informers
        self._state = state
        self._reporter = reporter
        self._metrics = metrics
        self._clock = clock
        self._is_leader = is_leader
        self._latency = latency
        self.config = config or SyncConfig()
        self._writer = AllocationWriter(
            api=api,
            informers=informers,
            state=state,
            metrics=metrics,
            clock=clock,
            is_leader=is_leader,
            config=self.config,
            rng=rng or random.Random(),  # noqa: S311 - jitter, not security
        )
        self._arbiter = Arbiter(state=state, informers=informers, config=self.config, now=clock.now)
        self._preempting = Preempting(
            api=api,
            state=state,
            reporter=reporter,
            metrics=metrics,
            clock=clock,
            config=self.config,
            check_leader=self._check_leader,
            nominate=self._nominate,
            wake_waiting=wake_waiting,
        )
        self._ungated_lock = threading.Lock()
        self._ungated: OrderedDict[str, None] = OrderedDict()
        """UIDs of pods we ungated recently: the cache may still show their gate for a moment."""
        self._unbound_seen: OrderedDict[str, float] = OrderedDict()
        """Pod UID → when we first saw it ungated, unbound and unschedulable (monotonic)."""
        self._profiles: tuple[tuple[int, int], dict[str, str]] = ((0, -1), {})
        self._beyond: tuple[object, int, dict[object, str | None]] = (None, -1, {})
        """``beyond_every_node`` answers for one inventory version (state lock held): it walks
        every node's GPUs, and a burst asks it the same question for each pod."""

    # -- lookups -------------------------------------------------------------------------------

    def _claim(self, namespace: str, name: str) -> JsonObject | None:
        return self._informers.claims.get(name, namespace=namespace)

    def _class(self, name: str) -> JsonObject | None:
        return self._informers.classes.get(name)

    def _classic_profiles(self) -> dict[str, str]:
        """Classic resource name → profile, for every published or catalogued profile."""
        with self._state.lock:
            version = (id(self._state.inventory), self._state.inventory.version)
            if self._profiles[0] != version:
                names = set(self._state.inventory.profile_names())
                names.update(p for model in CATALOG.values() for p in model.profile_names)
                self._profiles = (version, {classic_resource_name(p): p for p in names})
            return self._profiles[1]

    def _classic_requests(self, pod: PodView) -> list[shadow.ClassicRequest]:
        """``shadow.classic_requests``; a pod that asks for no classic resource has none whatever
        the profiles, and is answered without ``_classic_profiles`` (the state lock, which the
        workers' decisions hold)."""
        if not shadow.asks_classic(pod):
            return []
        return shadow.classic_requests(pod, profiles=self._classic_profiles())

    def _check_leader(self) -> None:
        if not self._is_leader():
            raise NotLeaderError("not the leader")

    def _not_leader(self) -> Result:
        """A pass stopped by ``NotLeaderError``: look again soon. Waiting for an event instead
        would lose the pod when leadership comes back without a new term (a late renew)."""
        return Result(Outcome.RETRY_AFTER, self.config.not_leader_retry)

    # -- the pass ------------------------------------------------------------------------------

    def sync(self, pod: PodView) -> Result:
        with self._ungated_lock:
            stale = pod.uid in self._ungated
        if stale:
            return Result(Outcome.DONE)  # a stale copy from before our own ungate
        requests: list[shadow.ClassicRequest] = []
        try:
            if self.config.scheduler_mode:
                return self._hand_over_in_scheduler_mode(pod)
            dra = dra_claims(pod, claims=self._claim)
            requests = self._classic_requests(pod)
            self._check_leader()
            return self._allocate(pod, dra, requests)
        except NotReady as exc:
            logger.debug("pod %s/%s waits: %s", pod.namespace, pod.name, exc)
            return Result(Outcome.WAIT)
        except PlacementProblem as problem:
            self._metrics.problem(str(problem.reason))
            if problem.reason is Reason.NO_CAPACITY:
                return self._no_capacity(pod, problem, classic_pod=bool(requests))
            self._reporter.problem(pod, problem)
            return Result(Outcome.WAIT_CHANGE)
        except NotLeaderError:
            return self._not_leader()
        except ForbiddenError as exc:
            if not exc.quota_exceeded:
                logger.warning("pod %s/%s: API refused: %s", pod.namespace, pod.name, exc)
                return Result(Outcome.RETRY)
            return self._over_quota(pod, exc)
        except ApiNotFoundError as exc:
            logger.info("pod %s/%s: %s; retrying", pod.namespace, pod.name, exc)
            return Result(Outcome.RETRY)
        except ConflictError as exc:
            self._metrics.conflict("write")
            logger.debug("pod %s/%s lost a write race: %s", pod.namespace, pod.name, exc)
            return Result(Outcome.RETRY)
        except ClusterError as exc:
            logger.warning("pod %s/%s: API error: %s", pod.namespace, pod.name, exc)
            return Result(Outcome.RETRY)

    def _allocate(
        self, pod: PodView, dra: list[ClaimView], requests: list[shadow.ClassicRequest]
    ) -> Result:
        """The pod's claims (its DRA claims and the shadow claims of its classic ``requests``)
        decided, written and checked, then the pod ungated. What stops it raises, and
        :meth:`sync` turns that into the outcome."""
        # 1. collect
        shadow_claims = (
            [
                ClaimView.of(c)
                for c in shadow.ensure_shadow_claims(self._api, pod, requests, cached=self._claim)
            ]
            if requests
            else []
        )
        claims = sort_claims(dra, shadow_claims, classes=self._class)
        if not claims.ours:
            logger.info("pod %s/%s needs no MIG slice; ungating", pod.namespace, pod.name)
            self._ungate(pod, node=None, classic=False)
            return Result(Outcome.DONE)
        written = Written()
        node: str | None = None
        if claims.pinned and not set.intersection(*(set(n) for n in claims.pinned)):
            return self._writer.split(pod, claims)
        if claims.to_allocate:
            decision = self._decide(pod, claims)  # 2. decide
            node = decision.node
            # 3. write
            written = self._writer.write(pod, claims, decision.allocations, node=decision.node)
        verdict = self._writer.verify(pod, claims, written)  # 4. check
        if verdict is not None:
            return verdict
        # 5. ungate
        node = node or self._node_of(claims)
        self._ungate(pod, node=node, classic=bool(claims.shadow))
        return Result(Outcome.DONE)

    # -- hand-offs to kube-scheduler (``handoff``) ----------------------------------------------

    def _waited(self, since: datetime | None) -> float:
        if since is None:
            return 0.0
        return max(0.0, (self._clock.now() - since).total_seconds())

    def _no_capacity(self, pod: PodView, problem: PlacementProblem, *, classic_pod: bool) -> Result:
        """Wait for capacity; past ``handoff_after`` a DRA pod goes to kube-scheduler instead,
        unless room is held for it here (a preemption or a reservation)."""
        if isinstance(problem, NoRoom):
            if problem.preemption is not None:
                return self._preempting.preempt(pod, problem.preemption)
            if problem.held is not None:
                return self._preempting.wait_held(pod, problem.held, problem.held_left)
        reserve_in = problem.reserve_in if isinstance(problem, NoRoom) else None
        limit = self.config.handoff_after
        if limit is None or classic_pod:
            self._reporter.problem(pod, problem)
            return Result(Outcome.WAIT_CAPACITY, reserve_in or 0.0)
        waited = self._waited(handoff.unplaced_since(pod))
        if waited < limit:
            self._reporter.problem(pod, problem)
            return Result(Outcome.WAIT_CAPACITY, min(limit - waited, reserve_in or limit))
        try:
            self._check_leader()
            ops.remove_scheduling_gate(self._api, pod=pod.raw)
        except NotLeaderError:
            return self._not_leader()
        except ApiNotFoundError:
            return Result(Outcome.DONE)
        except ClusterError as exc:
            logger.info("pod %s/%s: hand-off failed: %s", pod.namespace, pod.name, exc)
            return Result(Outcome.RETRY)
        self._remember_ungated(pod)
        self._metrics.handed_off("no-capacity")
        self._reporter.handed_off(
            pod,
            message=f"no capacity for {waited:.0f}s (--handoff-after {limit:g}s): handed to "
            f"kube-scheduler, which allocates when capacity appears and reports the pod "
            f"Unschedulable until then (cluster autoscalers act on that); {problem.message}",
        )
        logger.info(
            "pod %s/%s: no capacity for %.0fs; handed to kube-scheduler",
            pod.namespace,
            pod.name,
            waited,
        )
        return Result(Outcome.DONE)

    def _over_quota(self, pod: PodView, exc: ForbiddenError) -> Result:
        """A ResourceQuota refused a shadow claim of the pod: it waits, with the quota's words
        on it. Quota frees up when claims in the namespace go (a release wakes the waiting
        pods) or when the quota is raised, which nothing watches: hence the periodic look."""
        self._metrics.problem(str(Reason.QUOTA_EXCEEDED))
        self._reporter.problem(
            pod,
            PlacementProblem(
                Reason.QUOTA_EXCEEDED,
                f"the shadow claim of its classic request is refused by a ResourceQuota: {exc}",
            ),
        )
        return Result(Outcome.WAIT_CAPACITY, self.config.quota_retry)

    def _hand_over_in_scheduler_mode(self, pod: PodView) -> Result:
        """Scheduler mode: release a classic pod's unused shadow claims, then lift the gate."""
        requests = self._classic_requests(pod)
        namespace = pod.namespace or "default"
        shadows = []
        for request in requests:
            claim = self._claim(namespace, shadow.shadow_claim_name(pod, request))
            if claim is not None and shadow.is_shadow_of(claim, pod):
                shadows.append(ClaimView.of(claim))
        self._check_leader()
        handoff.release_shadow_claims(self._api, pod, shadows)
        self._check_leader()
        ops.remove_scheduling_gate(self._api, pod=pod.raw)
        self._remember_ungated(pod)
        self._metrics.handed_off("scheduler-mode")
        self._reporter.handed_off(
            pod,
            message="the controller runs with --allocation-mode scheduler: kube-scheduler "
            "allocates this pod's MIG slices",
        )
        return Result(Outcome.DONE)

    def preempt_for_scheduler(self, pod: PodView) -> Result:
        """Scheduler mode: kube-scheduler reports the pod unschedulable and cannot preempt for
        DRA devices; if our devices are what it lacks (it fits nowhere on the free slices), evict
        lower-priority victims as in controller mode. kube-scheduler allocates once they are gone
        (its queue retries the pod on claim changes, higher priorities first)."""
        try:
            claims = sort_claims(
                dra_claims(pod, claims=self._claim),
                self._intended_classic_claims(pod),
                classes=self._class,
            )
            if not claims.to_allocate:
                return Result(Outcome.DONE)
            state = self._state
            with state.lock:
                state.refresh()
                state.holds.expire(self._clock.now())
                if state.holds.get(pod.uid, HoldKind.PREEMPTION) is not None:
                    return Result(Outcome.DONE)  # under way; looked at again when it is over
                order = state.order_of(pod)
                # kube-scheduler serves classic requests through DRA here: no node lists them
                usage = {
                    name: value
                    for name, value in pod_usage(pod).items()
                    if not name.startswith(CLASSIC_RESOURCE_PREFIX)
                }

                def node_ok(node: str) -> bool:
                    return claims.allows(node) and (
                        state.nodes.why_not(pod, node, usage=usage) is None
                    )

                alternatives = build_alternatives(
                    claims.to_allocate, classes=self._class, cache=state.candidates
                )
                with state.holds.lifted_for(order):
                    found, _, permanent = self._first_fit(alternatives, node_ok)
                if found is not None or permanent:
                    return Result(Outcome.DONE)  # not our devices that it lacks

                decided = self._arbiter.preempt(
                    pod,
                    order,
                    node_ok=self._node_ok_without_lower(pod, claims, usage=usage),
                    place_on=self._place_without(pod, claims, alternatives, usage=usage),
                    min_slices=self._min_slices(alternatives),
                )
        except (NotReady, PlacementProblem, ApiNotFoundError):
            return Result(Outcome.DONE)
        if not isinstance(decided, Preemption):
            return Result(Outcome.DONE)
        result = self._preempting.preempt(pod, decided)
        if result.outcome is Outcome.WAIT_CAPACITY:  # looked at again when the hold ends
            return Result(Outcome.RETRY_AFTER, max(result.delay, self.config.preemption_retry))
        return result

    def _intended_classic_claims(self, pod: PodView) -> list[ClaimView]:
        """Scheduler mode: the claims kube-scheduler would make for a pod's classic requests
        (``extendedResourceName``) — our shadow claims' shape, never written — so that what
        the pod needs can be weighed before any claim of it exists."""
        claims = []
        for index, request in enumerate(self._classic_requests(pod)):
            body = shadow.shadow_claim(pod, request)
            body["metadata"]["uid"] = f"{pod.uid}-classic-{index}"
            claims.append(ClaimView.of(as_json(body)))
        return claims

    def unbound(self, pod: PodView) -> Result:
        """A pod we ungated that kube-scheduler has not bound: past ``handoff_after``, withdraw our
        unreserved allocations of its DRA claims so that kube-scheduler may allocate elsewhere."""
        limit = self.config.handoff_after
        since = handoff.unbound_since(pod)
        if limit is None or self.config.scheduler_mode or since is None:
            return Result(Outcome.DONE)
        if self._classic_requests(pod):
            return Result(Outcome.DONE)  # pinned by our nodeSelector for good (``handoff``)
        now = time.monotonic()
        with self._ungated_lock:
            first_seen = self._unbound_seen.setdefault(pod.uid, now)
            while len(self._unbound_seen) > _REMEMBERED_UNGATES:
                self._unbound_seen.popitem(last=False)
        waited = min(self._waited(since), now - first_seen)
        if waited < limit:
            return Result(Outcome.RETRY_AFTER, limit - waited)
        try:
            claims = sort_claims(dra_claims(pod, claims=self._claim), [], classes=self._class)
            mine = [c for c in claims.allocated if handoff.unreserved(c, pod)]
            if not mine:
                return Result(Outcome.DONE)
            nodes = sorted({n for c in mine for n in c.node_names()})
            for claim in mine:
                self._check_leader()
                ops.clear_claim_allocation(self._api, claim=claim.raw)
        except (NotReady, PlacementProblem, ApiNotFoundError):
            return Result(Outcome.DONE)
        except NotLeaderError:
            return self._not_leader()
        except ConflictError:
            return Result(Outcome.RETRY)  # reserved or changed meanwhile: look again
        except ClusterError as exc:
            logger.warning("pod %s/%s: API error: %s", pod.namespace, pod.name, exc)
            return Result(Outcome.RETRY)
        self._metrics.handed_off("not-bound")
        self._reporter.handed_off(
            pod,
            message=f"placed on {', '.join(nodes)} but not bound for {waited:.0f}s "
            f"(--handoff-after {limit:g}s): allocation of {len(mine)} claim(s) withdrawn; "
            "kube-scheduler allocates it instead",
        )
        logger.info(
            "pod %s/%s: not bound for %.0fs; %d allocation(s) withdrawn, kube-scheduler owns it",
            pod.namespace,
            pod.name,
            waited,
            len(mine),
        )
        return Result(Outcome.DONE)

    # -- 2. decide -----------------------------------------------------------------------------

    def _decide(self, pod: PodView, claims: PodClaims) -> _Decision:
        """Place the pod's unallocated claims, in serving order (``arbiter``); the answer is
        reserved in the occupancy before the lock is released. Raises ``PlacementProblem``
        (``NoRoom`` when the pod waits for capacity)."""
        woken: list[str] = []
        released = False
        try:
            with self._state.lock:
                started = time.perf_counter()
                try:
                    decision, woken, released = self._decide_locked(pod, claims)
                finally:
                    self._metrics.decided(time.perf_counter() - started)
        finally:
            if woken:
                self._metrics.served_ahead(len(woken))
                self._wake_keys(woken)
            if released:
                self._wake_waiting()
        return decision

    def _decide_locked(self, pod: PodView, claims: PodClaims) -> tuple[_Decision, list[str], bool]:
        """The decision, the pods ahead that were given the room first, and whether room held
        for someone was released (its waiting pods need a look)."""
        state = self._state
        to_allocate = claims.to_allocate
        state.refresh()
        for claim in to_allocate:
            if state.occupancy.known_allocated(claim.uid):
                raise ConflictError(f"claim {claim.name} was allocated meanwhile")
        released = bool(state.holds.expire(self._clock.now()))
        if released:
            state.waiting.capacity_changed()
        state.holds.drop(pod.uid, HoldKind.NEXT)  # deciding for real now
        order = state.order_of(pod)
        fits = state.nodes.for_pod(pod)

        def node_ok(node: str) -> bool:
            return claims.allows(node) and fits(node)

        alternatives = build_alternatives(to_allocate, classes=self._class, cache=state.candidates)

        def place_self() -> tuple[Alternative, Placed] | None:
            with state.holds.lifted_for(order):
                return self._first_fit(alternatives, node_ok)[0]

        with state.holds.lifted_for(order):
            found, first, permanent = self._first_fit(alternatives, node_ok)
        woken: list[str] = []
        if found is not None:
            found, woken = self._arbiter.serve_ahead(
                order, found, place_self=place_self, dry_run=self._dry_run
            )
            if found is None:
                first = NoFit(
                    reason="the room it fits is given to a pod ahead of it in the serving "
                    "order (higher priority, or as high and waiting longer)",
                    permanent=False,
                )
        if found is not None:
            decision = self._reserve_decision(pod, to_allocate, found)
            if state.holds.drop(pod.uid):  # what it held beyond its placement is free again
                state.waiting.capacity_changed()
                released = True
            return decision, woken, released
        assert first is not None
        if permanent:
            state.waiting.remove(pod.key)
            raise PlacementProblem(Reason.UNSATISFIABLE, first.reason)
        raise self._no_room(pod, claims, order, alternatives, node_ok, first.reason)

    def _reserve_decision(
        self, pod: PodView, to_allocate: list[ClaimView], found: tuple[Alternative, Placed]
    ) -> _Decision:
        """The answer assumed in the occupancy and the node filter (state lock held); the pod
        waits no more."""
        state = self._state
        alternative, result = found
        results = allocations(
            result, alternative, to_allocate, inventory=state.inventory, classes=self._class
        )
        for claim, allocation in zip(to_allocate, results, strict=True):
            state.occupancy.assume(
                uid=claim.uid,
                key=f"{claim.meta.namespace}/{claim.name}",
                devices=_devices(allocation),
            )
        state.nodes.assume(pod, result.node)
        waiter = state.waiting.remove(pod.key)
        if waiter is not None:
            self._metrics.waited(
                priority_class=pod.priority_class_name, seconds=time.monotonic() - waiter.since
            )
        return _Decision(node=result.node, allocations=results, generation=state.generation)

    def _first_fit(
        self, alternatives: list[Alternative], node_ok: Callable[[str], bool]
    ) -> tuple[tuple[Alternative, Placed] | None, NoFit | None, bool]:
        """The first alternative that places, or the first reason none does and whether every
        reason is permanent."""
        first: NoFit | None = None
        permanent = True
        for alternative in alternatives:
            beyond = self._beyond_every_node(alternative)
            if beyond is not None:
                first = first or NoFit(reason=beyond, permanent=True)
                continue
            result = self._place(alternative, node_ok)
            if isinstance(result, Placed):
                return (alternative, result), None, False
            first = first or result
            permanent = permanent and result.permanent
        return None, first, permanent

    def _place_on(
        self, alternatives: list[Alternative], node: str, node_ok: Callable[[str], bool]
    ) -> Placed | None:
        """The pod's placement on ``node`` alone (arbiter dry runs)."""

        def only(name: str) -> bool:
            return name == node and node_ok(name)

        for alternative in alternatives:
            if self._beyond_every_node(alternative) is not None:
                continue
            result = self._place(alternative, only)
            if isinstance(result, Placed):
                return result
        return None

    def _dry_run(self, waiter: Waiter) -> Placed | None:
        """Where a waiting pod would go now (its claims as last seen; nothing reserved)."""
        to_allocate = waiter.claims.to_allocate
        current = self._informers.pods.get_by_key(waiter.key)
        if (
            not to_allocate
            or current is None
            or PodView.of(current).uid != waiter.order.uid
            or not PodView.of(current).gated_by(SCHEDULING_GATE)
        ):
            self._state.waiting.remove(waiter.key)  # placed, handed off or gone meanwhile
            return None
        try:
            alternatives = build_alternatives(
                to_allocate, classes=self._class, cache=self._state.candidates
            )
        except PlacementProblem:
            return None
        fits = self._state.nodes.for_pod(waiter.pod)
        claims = waiter.claims

        def node_ok(node: str) -> bool:
            return claims.allows(node) and fits(node)

        found = self._first_fit(alternatives, node_ok)[0]
        return found[1] if found is not None else None

    def _no_room(
        self,
        pod: PodView,
        claims: PodClaims,
        order: PodOrder,
        alternatives: list[Alternative],
        node_ok: Callable[[str], bool],
        reason: str,
    ) -> NoRoom:
        """The pod fits nowhere now: it waits in order, and may preempt or get a reservation."""
        state = self._state
        profiles = frozenset(
            p for a in alternatives for slot in a.slots for p in slot.candidates.profiles
        )
        waiter = state.waiting.failed(
            pod, claims, order=order, now=time.monotonic(), profiles=profiles
        )

        def place_on(node: str) -> Placed | None:
            return self._place_on(alternatives, node, node_ok)

        preemption = self._arbiter.preempt(
            pod,
            order,
            node_ok=self._node_ok_without_lower(pod, claims),
            place_on=self._place_without(pod, claims, alternatives),
            min_slices=self._min_slices(alternatives),
        )
        if isinstance(preemption, Preemption):
            return NoRoom(reason, preemption=preemption, held=preemption.hold)
        if isinstance(preemption, NoPreemption):
            reason = f"{reason}; {preemption.reason}"
        held = next((h for h in state.holds.of(pod.uid) if h.kind is not HoldKind.NEXT), None)
        if held is None:
            held = self._arbiter.reserve(pod, order, waiter, node_ok=node_ok, place_on=place_on)
            if held is not None:
                self._metrics.reserved()
        if held is None:
            bound = self.config.starvation_after
            due = None if bound is None else max(0.1, bound - (time.monotonic() - waiter.since))
            return NoRoom(reason, reserve_in=due)
        return NoRoom(reason, held=held, held_left=self._arbiter.still_waiting_for(held))

    def _min_slices(self, alternatives: list[Alternative]) -> int:
        """The fewest memory slices any device of any alternative takes on any GPU model: a
        lower bound of what the pod needs on a GPU it is newly let into (state lock held)."""
        inventory = self._state.engine.inventory
        sizes = [
            inventory.profile_slices(profile)[0]
            for alternative in alternatives
            for slot in alternative.slots
            for profile in slot.candidates.profiles
        ]
        return max(1, min((s for s in sizes if s > 0), default=1))

    def _node_ok_without_lower(
        self, pod: PodView, claims: PodClaims, *, usage: dict[str, int] | None = None
    ) -> Callable[[str], bool]:
        """Whether the pod could go to a node once every pod of lower priority there is gone
        (what preemption may free; the state lock held)."""
        nodes = self._state.nodes
        usage = usage if usage is not None else pod_usage(pod)
        lower: list[str] = []
        listed = False

        def ok(node: str) -> bool:
            nonlocal listed
            if not listed:  # only once preemption gets this far: it reads every pod
                lower.extend(
                    p.uid
                    for p in (PodView.of(o) for o in self._informers.pods.list())
                    if p.priority < pod.priority
                )
                listed = True
            why = nodes.why_not(pod, node, usage=usage, without=lower)
            return claims.allows(node) and why is None

        return ok

    def _place_without(
        self,
        pod: PodView,
        claims: PodClaims,
        alternatives: list[Alternative],
        *,
        usage: dict[str, int] | None = None,
    ) -> Callable[[str, Sequence[str]], Placed | None]:
        """The pod's placement on a node with some pods' usage of it not counted (their MIG
        slices the arbiter releases itself)."""
        nodes = self._state.nodes
        usage = usage if usage is not None else pod_usage(pod)

        def place(node: str, without: Sequence[str]) -> Placed | None:
            def ok(name: str) -> bool:
                return claims.allows(name) and (
                    nodes.why_not(pod, name, usage=usage, without=without) is None
                )

            return self._place_on(alternatives, node, ok)

        return place

    def restore_hold(self, pod: PodView) -> Hold | None:
        """A new leader takes over the hold a gated pod's annotation records (``preempting``)."""
        return self._preempting.restore_hold(pod)

    def _beyond_every_node(self, alternative: Alternative) -> str | None:
        """``beyond_every_node``, remembered per inventory version (call with the state lock):
        its answer depends only on the counts and profiles of the counted slots."""
        inventory = self._state.inventory
        owner, version, answers = self._beyond
        if owner is not inventory or version != inventory.version:
            answers = {}
            self._beyond = (inventory, inventory.version, answers)
        key = tuple(
            (s.count, s.candidates.profiles) for s in alternative.slots if s.count is not None
        )
        if key not in answers:
            answers[key] = beyond_every_node(alternative, inventory)
        return answers[key]

    def _place(self, alternative: Alternative, node_ok: Callable[[str], bool]) -> Placed | NoFit:
        state = self._state
        if not alternative.has_all:
            request = pod_request(alternative, inventory=state.inventory, all_counts={})
            return state.engine.place(request, node_filter=node_ok)
        every = [s for s in alternative.slots if s.count is None]
        nodes = set.intersection(*(set(s.candidates.per_node) for s in every))
        for node in sorted(nodes):
            if not node_ok(node):
                continue
            counts = {s.engine_name: s.candidates.per_node[node] for s in every}
            request = pod_request(alternative, inventory=state.inventory, all_counts=counts)
            result = state.engine.place(request, node_filter=_only(node))
            if isinstance(result, Placed):
                return result
        return NoFit(
            reason="allocationMode All: no node can hold every matching device at once",
            permanent=not nodes,
        )

    # -- 5. ungate (3. write and 4. check are ``AllocationWriter``'s, in ``writes``) -----------

    def _node_of(self, claims: PodClaims) -> str | None:
        if not claims.pinned:
            return None
        allowed = set.intersection(*(set(n) for n in claims.pinned))
        return min(allowed) if len(allowed) == 1 else None

    def _ungate(self, pod: PodView, *, node: str | None, classic: bool) -> None:
        self._check_leader()
        if classic and node is not None:
            hostname = self._state.nodes.hostname(node)
            if pod.node_selector.get(HOSTNAME_LABEL) != hostname:
                pod = PodView.of(
                    ops.set_pod_node_selector(
                        self._api, pod=pod.raw, node_selector={HOSTNAME_LABEL: hostname}
                    )
                )
        if node is not None:
            self._state.nodes.assume(pod, node)
            if self.config.nominate_node:
                self._nominate(pod, node)
        self._check_leader()
        ops.remove_scheduling_gate(self._api, pod=pod.raw)
        self._remember_ungated(pod)
        self._metrics.ungated(latency_seconds=self._latency(pod))
        if node is not None:
            self._reporter.placed(pod, node=node)
        logger.debug("pod %s/%s ungated for node %s", pod.namespace, pod.name, node)

    def _nominate(self, pod: PodView, node: str) -> None:
        """Name the node in ``status.nominatedNodeName`` before the gate goes (docs/design.md
        F24): a hint, so a failure is logged and the pod ungated all the same."""
        self._check_leader()
        try:
            ops.nominate_node(self._api, pod=pod.raw, node=node)
        except ApiNotFoundError:
            raise
        except ClusterError as exc:
            self._metrics.nomination_failed()
            logger.info(
                "pod %s/%s: cannot nominate node %s: %s", pod.namespace, pod.name, node, exc
            )

    def _remember_ungated(self, pod: PodView) -> None:
        with self._ungated_lock:
            self._ungated[pod.uid] = None
            while len(self._ungated) > _REMEMBERED_UNGATES:
                self._ungated.popitem(last=False)


def _devices(allocation: wire.AllocationResult) -> tuple[tuple[str, str], ...]:
    """(pool, device) of the results of an allocation we are about to write."""
    parsed = Allocation.parse(allocation)
    return parsed.devices_of(DRIVER_NAME) if parsed is not None else ()


def _only(node: str) -> Callable[[str], bool]:
    return lambda name: name == node
