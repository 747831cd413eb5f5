"""One gated pod, one pass: collect its claims, place them, write, check, ungate.

The steps, each safe to repeat after a crash or a lost race:

1. Collect the pod's claims (``podclaims``); classic requests get their shadow claims (``classic``).
   A pod none of whose claims is ours is ungated at once (the webhook gates pods whose claims do
   not exist yet; see ``admission``).
2. Decide under the state lock: every unallocated claim of ours at once, on one node that every
   already allocated claim allows and that passes the node filter. The decision is reserved in the
   occupancy (*assumed*) before the lock is released.
3. Write, per claim: the delete-protection finalizer (an update), then ``status.allocation`` with
   its timestamp (a resourceVersion-checked status update; shadow claims also get ``reservedFor``).
   A write that loses a race is never forced: reservations are dropped, written allocations of
   this attempt are withdrawn, and the pod is tried again from fresh caches.
4. Check: wait until the claim informer has seen our last write — and so every allocation
   committed before it — then look for overlaps. An allocation of ours that overlaps one committed
   *earlier* is withdrawn (the other allocator got there first); one that overlaps only *later*
   allocations stays (their writers withdraw). So when two allocators race, at most the earliest of
   overlapping allocations survives, and a pod is ungated only after a check that saw no earlier
   overlap. Claims allocated by someone else are ungated only once no overlap is seen.
5. Classic pods get a ``nodeSelector`` for the node (allowed while gated); then the gate is lifted.

Every write first checks ``is_leader()``: a replica that lost its lease stops at once.
"""

from __future__ import annotations

import enum
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from api.names import SCHEDULING_GATE, classic_resource_name
from controller import classic
from controller.conditions import ConditionReporter, PlacementProblem, Reason
from controller.informers import ClusterInformers
from controller.metrics import ControllerMetrics
from controller.nodefilter import HOSTNAME_LABEL
from controller.occupancy import allocated_devices, parse_rv
from controller.podclaims import NotReady, PodClaims, dra_claims, sort_claims
from controller.requests import (
    Alternative,
    allocations,
    beyond_every_node,
    build_alternatives,
    pod_request,
)
from controller.state import AllocationState
from driver.cluster import ops
from driver.cluster.clock import Clock
from driver.cluster.port import (
    PODS,
    ClusterApi,
    JsonObject,
    gate_names,
    name_of,
    namespace_of,
    uid_of,
)
from driver.errors import ApiNotFoundError, ClusterError, ConflictError, DriverError
from driver.mig.catalog import CATALOG
from driver.placement import NoFit, Placed

logger = logging.getLogger(__name__)


_REMEMBERED_UNGATES = 10_000


class Outcome(enum.Enum):
    DONE = "done"
    WAIT = "wait"
    """Woken by an event about the pod or its claims."""
    WAIT_CAPACITY = "wait-capacity"
    """Woken when slices are freed or the inventory changes."""
    WAIT_CHANGE = "wait-change"
    """Woken when the inventory or the DeviceClasses change."""
    RETRY_AFTER = "retry-after"
    RETRY = "retry"
    """Requeued with the work queue's per-key backoff."""


@dataclass(frozen=True, slots=True)
class Result:
    outcome: Outcome
    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class SyncConfig:
    verify_timeout: float = 5.0
    """How long to wait for the claim informer to see our write before checking it; past it
    the writer no longer withdraws (it retries instead)."""
    adopt_grace: float = 6.0
    """How long an allocation we did not write is left to its writer's check before we ungate
    for it ourselves (longer than ``verify_timeout``)."""
    overlap_grace: float = 5.0
    """How long an overlap between allocations we did not write may last before the gated
    pod's claim is withdrawn (their writers may have died before checking)."""
    yield_delay: tuple[float, float] = (0.01, 0.2)
    """Random delay before retrying a pod whose allocation was withdrawn."""


class NotLeaderError(DriverError):
    """This replica is not the leader (any more): stop writing."""


@dataclass(slots=True)
class _Decision:
    node: str
    allocations: list[JsonObject]
    generation: int


@dataclass(slots=True)
class _Written:
    rvs: dict[str, int] = field(default_factory=dict)
    claims: list[JsonObject] = field(default_factory=list)
    """The claims as our allocation writes returned them."""
    relists: int = 0
    started: float = 0.0


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
        latency: Callable[[JsonObject], float | None],
        config: SyncConfig | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._api = api
        self._informers = informers
        self._state = state
        self._reporter = reporter
        self._metrics = metrics
        self._clock = clock
        self._is_leader = is_leader
        self._latency = latency
        self.config = config or SyncConfig()
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not security
        self._overlap_since: dict[str, float] = {}
        self._ungated_lock = threading.Lock()
        self._ungated: OrderedDict[str, None] = OrderedDict()
        """UIDs of pods we ungated recently: the cache may still show their gate for a moment."""
        self._profiles: tuple[int, dict[str, str]] = (-1, {})

    # -- lookups -------------------------------------------------------------------------------

    def _claim(self, namespace: str, name: str) -> JsonObject | None:
        return self._informers.claims.get(name, namespace=namespace)

    def _class(self, name: str) -> JsonObject | None:
        return self._informers.classes.get(name)

    def _classic_profiles(self) -> dict[str, str]:
        """Classic resource name → profile, for every published or catalogued profile."""
        with self._state.lock:
            version = self._state.inventory.version
            if self._profiles[0] != version:
                names = set(self._state.inventory.profile_names())
                names.update(p for model in CATALOG.values() for p in model.profile_names)
                self._profiles = (version, {classic_resource_name(p): p for p in names})
            return self._profiles[1]

    def _check_leader(self) -> None:
        if not self._is_leader():
            raise NotLeaderError("not the leader")

    # -- the pass ------------------------------------------------------------------------------

    def sync(self, pod: JsonObject) -> Result:
        with self._ungated_lock:
            stale = uid_of(pod) in self._ungated
        if stale:
            return Result(Outcome.DONE)  # a stale copy from before our own ungate
        try:
            dra = dra_claims(pod, claims=self._claim)
            requests = classic.classic_requests(pod, profiles=self._classic_profiles())
            self._check_leader()
            shadow = (
                classic.ensure_shadow_claims(self._api, pod, requests, cached=self._claim)
                if requests
                else []
            )
            claims = sort_claims(dra, shadow, classes=self._class)
            if not claims.ours:
                logger.info(
                    "pod %s/%s needs no MIG slice; ungating", namespace_of(pod), name_of(pod)
                )
                self._ungate(pod, node=None, classic=False)
                return Result(Outcome.DONE)
            written = _Written()
            node: str | None = None
            if claims.pinned and not set.intersection(*(set(n) for n in claims.pinned)):
                return self._split(pod, claims)
            if claims.to_allocate:
                decision = self._decide(pod, claims)
                node = decision.node
                written = self._write(pod, claims, decision)
            verdict = self._verify(pod, claims, written)
            if verdict is not None:
                return verdict
            node = node or self._node_of(claims)
            self._ungate(pod, node=node, classic=bool(claims.shadow))
            return Result(Outcome.DONE)
        except NotReady as exc:
            logger.debug("pod %s/%s waits: %s", namespace_of(pod), name_of(pod), exc)
            return Result(Outcome.WAIT)
        except PlacementProblem as problem:
            self._metrics.problem(str(problem.reason))
            self._reporter.problem(pod, problem)
            if problem.reason is Reason.NO_CAPACITY:
                return Result(Outcome.WAIT_CAPACITY)
            return Result(Outcome.WAIT_CHANGE)
        except NotLeaderError:
            return Result(Outcome.WAIT)
        except ApiNotFoundError as exc:
            logger.info("pod %s/%s: %s; retrying", namespace_of(pod), name_of(pod), exc)
            return Result(Outcome.RETRY)
        except ConflictError as exc:
            self._metrics.conflict("write")
            logger.debug("pod %s/%s lost a write race: %s", namespace_of(pod), name_of(pod), exc)
            return Result(Outcome.RETRY)
        except ClusterError as exc:
            logger.warning("pod %s/%s: API error: %s", namespace_of(pod), name_of(pod), exc)
            return Result(Outcome.RETRY)

    def _split(self, pod: JsonObject, claims: PodClaims) -> Result:
        """The pod's claims are allocated on different nodes (a crash between writes, or claims
        allocated for other pods): withdraw what only this gated pod holds and start over."""
        mine = [c for c in claims.allocated if _unreserved(c, pod)]
        if not mine:
            raise PlacementProblem(
                Reason.UNSATISFIABLE,
                "the pod's claims are already allocated on different nodes and are in use",
            )
        now = time.monotonic()
        with self._state.lock:
            records = [self._state.occupancy.record(uid_of(c)) for c in mine]
        youngest = min((now - r.first_seen for r in records if r is not None), default=0.0)
        if youngest < self.config.adopt_grace:
            return Result(Outcome.RETRY_AFTER, self.config.adopt_grace - youngest)
        if not self._still_gated(pod):
            return Result(Outcome.DONE)
        logger.info(
            "pod %s/%s: claims allocated on different nodes; withdrawing %d",
            namespace_of(pod),
            name_of(pod),
            len(mine),
        )
        self._withdraw(pod, mine)
        return Result(Outcome.RETRY_AFTER, self._rng.uniform(*self.config.yield_delay))

    # -- 2. decide -----------------------------------------------------------------------------

    def _decide(self, pod: JsonObject, claims: PodClaims) -> _Decision:
        state = self._state
        to_allocate = claims.to_allocate
        with state.lock:
            started = time.perf_counter()
            state.refresh()
            for claim in to_allocate:
                if state.occupancy.known_allocated(uid_of(claim)):
                    raise ConflictError(f"claim {name_of(claim)} was allocated meanwhile")
            fits = state.nodes.for_pod(pod)

            def node_ok(node: str) -> bool:
                return claims.allows(node) and fits(node)

            alternatives = build_alternatives(
                to_allocate, classes=self._class, cache=state.candidates
            )
            first: NoFit | None = None
            permanent = True
            for alternative in alternatives:
                beyond = beyond_every_node(alternative, state.inventory)
                if beyond is not None:
                    first = first or NoFit(reason=beyond, permanent=True)
                    continue
                result = self._place(alternative, node_ok)
                if isinstance(result, Placed):
                    results = allocations(
                        result,
                        alternative,
                        to_allocate,
                        inventory=state.inventory,
                        classes=self._class,
                    )
                    for claim, allocation in zip(to_allocate, results, strict=True):
                        state.occupancy.assume(
                            uid=uid_of(claim),
                            key=f"{namespace_of(claim)}/{name_of(claim)}",
                            devices=[
                                (r["pool"], r["device"]) for r in allocation["devices"]["results"]
                            ],
                        )
                    state.nodes.assume(pod, result.node)
                    self._metrics.decided(time.perf_counter() - started)
                    return _Decision(
                        node=result.node, allocations=results, generation=state.generation
                    )
                first = first or result
                permanent = permanent and result.permanent
            self._metrics.decided(time.perf_counter() - started)
        assert first is not None
        reason = Reason.UNSATISFIABLE if permanent else Reason.NO_CAPACITY
        raise PlacementProblem(reason, first.reason)

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

    # -- 3. write ------------------------------------------------------------------------------

    def _write(self, pod: JsonObject, claims: PodClaims, decision: _Decision) -> _Written:
        state = self._state
        written = _Written(relists=self._informers.claims.relists, started=time.monotonic())
        done: list[JsonObject] = []
        pending = list(zip(claims.to_allocate, decision.allocations, strict=True))
        try:
            for cached, allocation in pending:
                uid = uid_of(cached)
                self._check_leader()
                claim = ops.add_claim_finalizer(self._api, claim=cached)
                self._check_leader()
                shadow = uid in claims.shadow
                result = ops.write_claim_allocation(
                    self._api,
                    claim=claim,
                    allocation=allocation,
                    allocated_at=self._clock.now(),
                    reserved_for=[ops.pod_reference(pod)] if shadow else None,
                )
                rv = parse_rv(result)
                logger.debug(
                    "claim %s/%s: allocation %s written at rv %s",
                    namespace_of(claim),
                    name_of(claim),
                    [r["device"] for r in allocation["devices"]["results"]],
                    rv,
                )
                with state.lock:
                    state.occupancy.written(uid=uid, resource_version=rv)
                written.rvs[uid] = rv
                written.claims.append(result)
                done.append(result)
                self._metrics.claim_allocated(shadow=shadow)
        except (DriverError, ValueError):
            with state.lock:
                for claim, _ in pending:
                    if uid_of(claim) not in written.rvs:
                        state.occupancy.unassume(uid_of(claim))
                state.nodes.forget(pod)
            self._withdraw(pod, done)
            raise
        logger.debug(
            "pod %s/%s: %d claim(s) allocated on %s",
            namespace_of(pod),
            name_of(pod),
            len(done),
            decision.node,
        )
        return written

    def _withdraw(self, pod: JsonObject, claims: list[JsonObject]) -> None:
        """Best effort: clear allocations this attempt wrote, so the pod is not pinned by them."""
        for claim in claims:
            if not self._is_leader():
                return
            try:
                ops.clear_claim_allocation(self._api, claim=claim)
            except ClusterError as exc:
                logger.info("cannot withdraw allocation of claim %s: %s", name_of(claim), exc)

    # -- 4. check ------------------------------------------------------------------------------

    def _verify(self, pod: JsonObject, claims: PodClaims, written: _Written) -> Result | None:
        """``None`` if the pod may be ungated now, else what to do instead (see step 4)."""
        state = self._state
        adopted = claims.allocated
        allocated = adopted + written.claims
        target = max([*written.rvs.values(), *(parse_rv(c) for c in adopted)], default=0)
        if not state.wait_claims_seen(target, timeout=self.config.verify_timeout):
            logger.warning("claim informer has not caught up with rv %s; pod waits", target)
            return Result(Outcome.RETRY_AFTER, 1.0)
        relisted = self._informers.claims.relists != written.relists and bool(written.rvs)
        withdraw: list[JsonObject] = []
        wait = 0.0
        now = time.monotonic()
        with state.lock:
            for claim in allocated:
                uid = uid_of(claim)
                record = state.occupancy.record(uid)
                if (
                    record is None
                    or not record.resolved
                    or record.devices != allocated_devices(claim)
                ):
                    return Result(Outcome.RETRY_AFTER, 0.05)  # the claim changed since we read it
                overlaps = state.occupancy.overlapping(uid)
                mine = written.rvs.get(uid)
                if mine is not None:
                    committed = [o for o in overlaps if not (o.assumed and o.written_rv is None)]
                    if relisted or any(o.observed_rv < mine for o in committed):
                        withdraw.append(claim)
                    else:
                        record.verified = True
                    continue
                # Someone else's allocation (another replica, a crashed leader, a shared claim):
                # its writer may still be checking it, so leave it alone for a while.
                age = now - record.first_seen
                if age < self.config.adopt_grace and not record.verified:
                    wait = max(wait, self.config.adopt_grace - age)
                elif overlaps:
                    since = self._overlap_since.setdefault(uid, now)
                    if now - since >= self.config.overlap_grace and _unreserved(claim, pod):
                        withdraw.append(claim)
                        self._overlap_since.pop(uid, None)
                    wait = max(wait, 0.5)
                else:
                    self._overlap_since.pop(uid, None)
        if withdraw:
            late = written.rvs and now - written.started > self.config.verify_timeout
            if not late and self._still_gated(pod):
                logger.info(
                    "pod %s/%s: %d allocation(s) overlap others committed first; withdrawing",
                    namespace_of(pod),
                    name_of(pod),
                    len(withdraw),
                )
                for _ in withdraw:
                    self._metrics.conflict("overlap")
                self._withdraw(
                    pod, [state_claim for c in withdraw if (state_claim := self._fresh(c))]
                )
            return Result(Outcome.RETRY_AFTER, self._rng.uniform(*self.config.yield_delay))
        if wait > 0:
            return Result(Outcome.RETRY_AFTER, wait)
        return None

    def _still_gated(self, pod: JsonObject) -> bool:
        """Read from the API, not the cache: withdrawing from an ungated pod would strand it."""
        try:
            current = self._api.get(PODS, name=name_of(pod), namespace=namespace_of(pod))
        except ApiNotFoundError:
            return False
        return uid_of(current) == uid_of(pod) and SCHEDULING_GATE in gate_names(current)

    def _fresh(self, claim: JsonObject) -> JsonObject | None:
        return self._claim(namespace_of(claim) or "default", name_of(claim))

    # -- 5. ungate -----------------------------------------------------------------------------

    def _node_of(self, claims: PodClaims) -> str | None:
        if not claims.pinned:
            return None
        allowed = set.intersection(*(set(n) for n in claims.pinned))
        return min(allowed) if len(allowed) == 1 else None

    def _ungate(self, pod: JsonObject, *, node: str | None, classic: bool) -> None:
        self._check_leader()
        if classic and node is not None:
            hostname = self._state.nodes.hostname(node)
            selector = (pod.get("spec") or {}).get("nodeSelector") or {}
            if selector.get(HOSTNAME_LABEL) != hostname:
                pod = ops.set_pod_node_selector(
                    self._api, pod=pod, node_selector={HOSTNAME_LABEL: hostname}
                )
        if node is not None:
            self._state.nodes.assume(pod, node)
        self._check_leader()
        ops.remove_scheduling_gate(self._api, pod=pod)
        with self._ungated_lock:
            self._ungated[uid_of(pod)] = None
            while len(self._ungated) > _REMEMBERED_UNGATES:
                self._ungated.popitem(last=False)
        self._metrics.ungated(latency_seconds=self._latency(pod))
        if node is not None:
            self._reporter.placed(pod, node=node)
        logger.debug("pod %s/%s ungated for node %s", namespace_of(pod), name_of(pod), node)


def _only(node: str) -> Callable[[str], bool]:
    return lambda name: name == node


def _unreserved(claim: JsonObject, pod: JsonObject) -> bool:
    """Nobody but this (gated) pod holds the claim: withdrawing its allocation hurts no one."""
    reserved = (claim.get("status") or {}).get("reservedFor") or []
    return all(r.get("uid") == uid_of(pod) for r in reserved)
