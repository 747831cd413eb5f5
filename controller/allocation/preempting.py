"""The API side of holds and preemption: what the arbiter decided under the lock, carried out.

- a pod waiting on room held for it gets the ``Preempting`` or ``Reserved`` condition, and the
  hold is written on it (``instaslice.dev/hold``) so that a new leader restores it;
- a preemption writes that record *first*, names the node in ``status.nominatedNodeName``, then
  evicts each victim through the Eviction API (PodDisruptionBudgets and grace periods honoured)
  with a ``Preempted`` event on it. A leader that dies in between leaves a successor that knows
  the victims and never evicts a second set for the same pod; a 429 (a budget the status had not
  shown yet) or an API error drops the hold and the pod looks again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from api.names import HOLD_ANNOTATION
from controller.allocation.arbiter import Preemption
from controller.allocation.conditions import ConditionReporter, PlacementProblem, Reason
from controller.allocation.holds import Hold, HoldKind, parse_persisted, whole_gpus
from controller.allocation.outcome import NotLeaderError, Outcome, Result, SyncConfig
from controller.allocation.preemption import Plan
from controller.allocation.state import AllocationState
from controller.metrics import ControllerMetrics
from driver.cluster import ops
from driver.cluster.clock import Clock
from driver.cluster.port import ClusterApi, format_time
from driver.cluster.views import PodView
from driver.errors import ApiNotFoundError, ClusterError, ConflictError, TooManyRequestsError

logger = logging.getLogger(__name__)


class Preempting:
    def __init__(
        self,
        *,
        api: ClusterApi,
        state: AllocationState,
        reporter: ConditionReporter,
        metrics: ControllerMetrics,
        clock: Clock,
        config: SyncConfig,
        check_leader: Callable[[], None],
        nominate: Callable[[PodView, str], None],
        wake_waiting: Callable[[], None],
    ) -> None:
        self._api = api
        self._state = state
        self._reporter = reporter
        self._metrics = metrics
        self._clock = clock
        self._config = config
        self._check_leader = check_leader
        self._nominate = nominate
        self._wake_waiting = wake_waiting

    def _not_leader(self) -> Result:
        return Result(Outcome.RETRY_AFTER, self._config.not_leader_retry)

    def wait_held(self, pod: PodView, hold: Hold, left: int) -> Result:
        """The pod waits on room held for it: say which, and look again when the hold ends."""
        if hold.kind is HoldKind.PREEMPTION:
            reason = Reason.PREEMPTING
            message = (
                f"waiting for {len(hold.victims)} preempted pod(s) to go "
                f"({', '.join(hold.victims)}); {hold.describe()} held for this pod"
            )
        else:
            reason = Reason.RESERVED
            message = (
                f"waited past the starvation bound ({self._config.starvation_after:g}s): "
                f"{hold.describe()} reserved for this pod since {format_time(hold.since)}; "
                f"{left} claim(s) still hold slices there"
            )
        if pod.meta.annotations.get(HOLD_ANNOTATION) != hold.persisted():
            try:
                self._check_leader()
                ops.set_pod_annotation(
                    self._api, pod=pod.raw, key=HOLD_ANNOTATION, value=hold.persisted()
                )
            except NotLeaderError:
                return self._not_leader()
            except ApiNotFoundError:
                return Result(Outcome.DONE)
            except ClusterError as exc:  # the hold works without it until a leader change
                logger.info("pod %s: cannot record its hold: %s", pod.key, exc)
        self._reporter.waiting(pod, reason=reason, message=message)
        if hold.expires is None:
            return Result(Outcome.WAIT_CAPACITY)
        left_s = (hold.expires - self._clock.now()).total_seconds()
        return Result(Outcome.WAIT_CAPACITY, max(0.1, left_s))

    def drop_hold(self, pod: PodView, kind: HoldKind) -> None:
        with self._state.lock:
            released = bool(self._state.holds.drop(pod.uid, kind))
            if released:
                self._state.waiting.capacity_changed()
        if released:
            self._wake_waiting()

    def preempt(self, pod: PodView, preemption: Preemption) -> Result:
        """Record the hold on the preemptor, then evict the victims (module docstring)."""
        plan, hold = preemption.plan, preemption.hold
        try:
            self._check_leader()
            raw = ops.set_pod_annotation(
                self._api, pod=pod.raw, key=HOLD_ANNOTATION, value=hold.persisted()
            )
            if self._config.nominate_node:
                self._nominate(PodView.of(raw), plan.node)
        except NotLeaderError:
            self.drop_hold(pod, HoldKind.PREEMPTION)
            return self._not_leader()
        except ApiNotFoundError:
            self.drop_hold(pod, HoldKind.PREEMPTION)
            return Result(Outcome.DONE)
        except ClusterError as exc:
            self.drop_hold(pod, HoldKind.PREEMPTION)
            self._metrics.preemption("failed")
            logger.info("pod %s: preemption not started: %s", pod.key, exc)
            return Result(Outcome.RETRY)
        stopped = self._evict(pod, plan)
        if stopped is not None:
            return stopped
        return self.wait_held(pod, hold, len(plan.victims))

    def _evict(self, pod: PodView, plan: Plan) -> Result | None:
        """Each victim evicted, with its event; the result when it stopped short, else None."""
        evicted = 0
        for victim in plan.victims:
            target = victim.pod
            try:
                self._check_leader()
                self._api.evict(
                    name=target.name, namespace=target.namespace or "default", uid=target.uid
                )
            except (ApiNotFoundError, ConflictError):
                continue  # gone, or replaced by a new pod of that name: nothing to evict
            except TooManyRequestsError as exc:
                self.drop_hold(pod, HoldKind.PREEMPTION)
                self._metrics.preemption("refused", victims=evicted)
                self._reporter.problem(
                    pod,
                    PlacementProblem(
                        Reason.NO_CAPACITY,
                        f"preemption stopped: the eviction of {target.key} was refused "
                        f"({exc}); looking again",
                    ),
                )
                return Result(Outcome.RETRY_AFTER, self._config.preemption_retry)
            except NotLeaderError:
                return self._not_leader()  # the hold is recorded: the next leader carries on
            except ClusterError as exc:
                self.drop_hold(pod, HoldKind.PREEMPTION)
                self._metrics.preemption("failed", victims=evicted)
                logger.info("pod %s: eviction of %s failed: %s", pod.key, target.key, exc)
                return Result(Outcome.RETRY)
            evicted += 1
            self._reporter.preempted(
                target,
                message=f"evicted by InstaSlice for pod {pod.key} (priority {pod.priority}; "
                f"this pod's priority {target.priority}), which needs MIG slices on node "
                f"{plan.node}",
            )
        self._metrics.preemption("started", victims=evicted)
        return None

    def restore_hold(self, pod: PodView) -> Hold | None:
        """A new leader takes over the hold a gated pod's annotation records (if still due)."""
        text = pod.meta.annotations.get(HOLD_ANNOTATION)
        persisted = parse_persisted(text) if text else None
        if persisted is None:
            return None
        now = self._clock.now()
        if persisted.expires is not None and persisted.expires <= now:
            return None
        state = self._state
        with state.lock:
            hold = Hold(
                pod_key=pod.key,
                pod_uid=pod.uid,
                order=state.order_of(pod),
                kind=persisted.kind,
                slots=whole_gpus(state.engine, persisted.node, persisted.gpus),
                since=persisted.since,
                expires=persisted.expires,
                victims=persisted.victims,
            )
            if not hold.slots:
                return None
            state.holds.add(hold)
        logger.info("pod %s: %s restored (%s)", pod.key, hold.kind, hold.describe())
        return hold
