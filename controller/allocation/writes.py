"""Writing allocations and checking them before a pod is let go (steps 3 and 4 of ``sync``).

Write, per claim: the delete-protection finalizer (an update), then ``status.allocation`` with its
timestamp and ``reservedFor`` the pod (a resourceVersion-checked status update). A
write that loses a race is never forced: reservations are dropped, allocations this attempt wrote
are withdrawn, and the pod is tried again from fresh caches.

Check: wait until the claim informer has seen our last write — and so every allocation committed
before it — then look for overlaps. An allocation of ours overlapping one committed *earlier* is
withdrawn (another allocator got there first); one overlapping only *later* allocations stays
(their writers withdraw). So when allocators race, the earliest of overlapping allocations
survives and a pod is ungated only after a check that saw no earlier overlap. An allocation we did
not write is left to its writer's check for ``adopt_grace`` (longer than any writer checks), then
ungated for if nothing overlaps it; an overlap nobody resolves within ``overlap_grace`` has the
gated pod's claim withdrawn. Withdrawing always re-reads the pod from the API first: a pod that is
already ungated keeps its allocation.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from api.names import DRIVER_NAME, SCHEDULING_GATE
from api.wire import AllocationResult
from controller.allocation.conditions import PlacementProblem, Reason
from controller.allocation.handoff import unreserved
from controller.allocation.occupancy import parse_rv
from controller.allocation.outcome import NotLeaderError, Outcome, Result, SyncConfig
from controller.allocation.podclaims import PodClaims
from controller.allocation.state import AllocationState
from controller.informers import ClusterInformers
from controller.metrics import ControllerMetrics
from driver.cluster import ops
from driver.cluster.clock import Clock
from driver.cluster.port import PODS, ClusterApi
from driver.cluster.views import ClaimView, PodView
from driver.errors import ApiNotFoundError, ClusterError, DriverError

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Written:
    """What one attempt wrote."""

    rvs: dict[str, int] = field(default_factory=dict)
    """claim UID → resourceVersion of our allocation write."""
    claims: list[ClaimView] = field(default_factory=list)
    """The claims as our allocation writes returned them."""
    relists: int = 0
    """The claim informer's relist count before the writes (a relist blurs commit order)."""
    started: float = 0.0


class AllocationWriter:
    def __init__(
        self,
        *,
        api: ClusterApi,
        informers: ClusterInformers,
        state: AllocationState,
        metrics: ControllerMetrics,
        clock: Clock,
        is_leader: Callable[[], bool],
        config: SyncConfig,
        rng: random.Random,
    ) -> None:
        self._api = api
        self._informers = informers
        self._state = state
        self._metrics = metrics
        self._clock = clock
        self._is_leader = is_leader
        self.config = config
        self._rng = rng
        self._overlap_since: dict[str, float] = {}

    def _check_leader(self) -> None:
        if not self._is_leader():
            raise NotLeaderError("not the leader")

    def write(
        self, pod: PodView, claims: PodClaims, allocations: list[AllocationResult], *, node: str
    ) -> Written:
        """Finalizer, then allocation, claim by claim; on any failure nothing of this attempt
        stays reserved or written (as far as we can withdraw it)."""
        state = self._state
        written = Written(relists=self._informers.claims.relists, started=time.monotonic())
        done: list[ClaimView] = []
        pending = list(zip(claims.to_allocate, allocations, strict=True))
        try:
            for cached, allocation in pending:
                uid = cached.uid
                self._check_leader()
                claim = ops.add_claim_finalizer(self._api, claim=cached.raw)
                self._check_leader()
                shadow = uid in claims.shadow
                result = ops.write_claim_allocation(
                    self._api,
                    claim=claim,
                    allocation=allocation,
                    allocated_at=self._clock.now(),
                    # reserved for the pod as we allocate: kube-scheduler's PreBind then has
                    # nothing to write for the claim, only the binding (its API client is
                    # rate-limited, 50 requests/s by default: one write per pod fewer is ~2x
                    # the pods it binds per second)
                    reserved_for=[ops.pod_reference(pod.raw)],
                )
                view = ClaimView.of(result)
                rv = parse_rv(view)
                logger.debug(
                    "claim %s/%s: allocation %s written at rv %s",
                    view.namespace,
                    view.name,
                    [r.device for r in view.results_of(DRIVER_NAME)],
                    rv,
                )
                with state.lock:
                    state.occupancy.written(uid=uid, resource_version=rv)
                written.rvs[uid] = rv
                written.claims.append(view)
                done.append(view)
                self._metrics.claim_allocated(shadow=shadow)
        except (DriverError, ValueError):
            with state.lock:
                for pending_claim, _ in pending:
                    if pending_claim.uid not in written.rvs:
                        state.occupancy.unassume(pending_claim.uid)
                state.nodes.forget(pod)
            self.withdraw(done)
            raise
        logger.debug(
            "pod %s/%s: %d claim(s) allocated on %s",
            pod.namespace,
            pod.name,
            len(done),
            node,
        )
        return written

    def withdraw(self, claims: list[ClaimView]) -> None:
        """Best effort: clear allocations this attempt wrote, so the pod is not pinned by them."""
        for claim in claims:
            if not self._is_leader():
                return
            try:
                ops.clear_claim_allocation(self._api, claim=claim.raw)
            except ClusterError as exc:
                logger.info("cannot withdraw allocation of claim %s: %s", claim.name, exc)

    def verify(self, pod: PodView, claims: PodClaims, written: Written) -> Result | None:
        """``None`` if the pod may be ungated now, else what to do instead (see step 4)."""
        state = self._state
        adopted = claims.allocated
        allocated = adopted + written.claims
        target = max([*written.rvs.values(), *(parse_rv(c) for c in adopted)], default=0)
        if not state.wait_claims_seen(target, timeout=self.config.verify_timeout):
            logger.warning("claim informer has not caught up with rv %s; pod waits", target)
            return Result(Outcome.RETRY_AFTER, 1.0)
        relisted = self._informers.claims.relists != written.relists and bool(written.rvs)
        withdraw: list[ClaimView] = []
        wait = 0.0
        now = time.monotonic()
        with state.lock:
            for claim in allocated:
                uid = claim.uid
                record = state.occupancy.record(uid)
                if (
                    record is None
                    or not record.resolved
                    or record.devices != claim.devices_of(DRIVER_NAME)
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
                    if now - since >= self.config.overlap_grace and unreserved(claim, pod):
                        withdraw.append(claim)
                        self._overlap_since.pop(uid, None)
                    wait = max(wait, 0.5)
                else:
                    self._overlap_since.pop(uid, None)
        if withdraw:
            return self._withdraw_overlapping(pod, withdraw, written=written, now=now)
        if wait > 0:
            return Result(Outcome.RETRY_AFTER, wait)
        return None

    def _withdraw_overlapping(
        self, pod: PodView, withdraw: list[ClaimView], *, written: Written, now: float
    ) -> Result:
        """Withdraw the allocations that overlap others committed first (unless our writes are
        already too old, or the pod was ungated meanwhile), and retry after a random delay."""
        late = written.rvs and now - written.started > self.config.verify_timeout
        if not late and self.still_gated(pod):
            logger.info(
                "pod %s/%s: %d allocation(s) overlap others committed first; withdrawing",
                pod.namespace,
                pod.name,
                len(withdraw),
            )
            for _ in withdraw:
                self._metrics.conflict("overlap")
            self.withdraw([state_claim for c in withdraw if (state_claim := self._fresh(c))])
        return Result(Outcome.RETRY_AFTER, self._rng.uniform(*self.config.yield_delay))

    def still_gated(self, pod: PodView) -> bool:
        """Read from the API, not the cache: withdrawing from an ungated pod would strand it."""
        try:
            current = PodView.of(self._api.get(PODS, name=pod.name, namespace=pod.meta.namespace))
        except ApiNotFoundError:
            return False
        return current.uid == pod.uid and current.gated_by(SCHEDULING_GATE)

    def _fresh(self, claim: ClaimView) -> ClaimView | None:
        fresh = self._informers.claims.get(claim.name, namespace=claim.meta.namespace)
        return ClaimView.of(fresh) if fresh is not None else None

    def split(self, pod: PodView, claims: PodClaims) -> Result:
        """The pod's claims are allocated on different nodes (a crash between writes, or claims
        allocated for other pods): withdraw what only this gated pod holds and start over."""
        mine = [c for c in claims.allocated if unreserved(c, pod)]
        if not mine:
            raise PlacementProblem(
                Reason.UNSATISFIABLE,
                "the pod's claims are already allocated on different nodes and are in use",
            )
        now = time.monotonic()
        with self._state.lock:
            records = [self._state.occupancy.record(c.uid) for c in mine]
        youngest = min((now - r.first_seen for r in records if r is not None), default=0.0)
        if youngest < self.config.adopt_grace:
            return Result(Outcome.RETRY_AFTER, self.config.adopt_grace - youngest)
        if not self.still_gated(pod):
            return Result(Outcome.DONE)
        logger.info(
            "pod %s/%s: claims allocated on different nodes; withdrawing %d",
            pod.namespace,
            pod.name,
            len(mine),
        )
        self.withdraw(mine)
        return Result(Outcome.RETRY_AFTER, self._rng.uniform(*self.config.yield_delay))
