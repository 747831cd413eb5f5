"""The allocation loop: informer events in, pod keys on a work queue, worker threads placing pods.

Handlers only update the shared state and enqueue keys:

- pods: a pod carrying our gate is enqueued on every change (it is acted on only when ours is its
  *only* gate — Kueue's and anyone else's are lifted first, so quota is decided before placement);
  a classic pod that finished is enqueued to release its shadow claims, a deleted one's UID is
  enqueued to release them once the API confirms it gone (``shadowrelease``);
- claims: occupancy is updated; the pods using the claim (by name, by owner, by shadow label) are
  enqueued; freed slices wake the pods waiting for capacity; a shadow claim whose pod the cache
  does not know has that pod's UID enqueued (``shadowrelease``);
- slices, DeviceClasses, nodes: the inventory / node filter changes; every waiting pod is woken.

Retries are event driven: a pod that cannot be placed now waits for one of those events, never for
a timer — except the hand-off deadline (``handoff``): a DRA pod waiting for capacity is also looked
at again when its ``handoff_after`` is up, and a pod we ungated that kube-scheduler reports
unschedulable is enqueued, and again at its deadline, to have our allocation withdrawn; and a pass
stopped because this replica could not prove it leads is retried (``SyncConfig.not_leader_retry``:
a late lease renew makes ``is_leader()`` False for a moment without ending the term, so no
``start_leading`` would requeue the pod). Workers take keys and run ``sync.PodSync`` (N of them,
so API writes of different pods go out concurrently; decisions are serialized by the state's lock).

Leadership: ``start_leading`` (on its own thread, after caches synced) rebuilds the state from the
informers' copies of the API, then lets workers act and enqueues every gated pod, every finished
classic pod and every pod UID that shadow claims name but the pod cache does not know;
``stop_leading`` stops them at once (and every write checks ``is_leader`` too). Whether the rebuild
may still start allocating is decided by the term (no ``stop_leading`` since its ``start_leading``),
not by ``is_leader()``, which is False for a moment whenever a renew is late.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from api.names import CLASSIC_RESOURCE_PREFIX, SCHEDULING_GATE
from controller.allocation.conditions import ConditionReporter
from controller.allocation.handoff import unbound_since
from controller.allocation.nodefilter import node_info
from controller.allocation.outcome import NotLeaderError
from controller.allocation.podclaims import is_our_class
from controller.allocation.priority import LAST, PodOrder, may_preempt
from controller.allocation.state import AllocationState
from controller.allocation.sync import Outcome, PodSync, Result, SyncConfig
from controller.allocation.waitreport import WaitReport, wait_report
from controller.classic.release import ShadowReleaser, gone_key, pod_uid_of_key
from controller.informers import BY_UID, ClusterInformers
from controller.metrics import ControllerMetrics
from driver.cluster.clock import Clock, SystemClock
from driver.cluster.events import EventRecorder
from driver.cluster.indexes import BY_CLAIM
from driver.cluster.port import ClusterApi, JsonObject
from driver.cluster.views import ClaimView, DeviceClassView, PodView
from driver.cluster.workqueue import RateLimit, WorkQueue
from driver.errors import ClusterError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AllocatorConfig:
    workers: int = 16
    policy: str = "firstfit"
    name: str = "allocator"
    """Prefix of the worker threads' names (several controllers in one process: tests)."""
    sync: SyncConfig = field(default_factory=SyncConfig)
    cache_sync_timeout: float = 60.0


def _is_classic_resource(name: str) -> bool:
    return name.startswith(CLASSIC_RESOURCE_PREFIX)


class Allocator:
    def __init__(
        self,
        *,
        api: ClusterApi,
        informers: ClusterInformers,
        events: EventRecorder,
        metrics: ControllerMetrics,
        is_leader: Callable[[], bool],
        config: AllocatorConfig | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = config or AllocatorConfig()
        self._api = api
        self._informers = informers
        self._metrics = metrics
        self._is_leader = is_leader
        self._clock = clock or SystemClock()
        self.state = AllocationState(policy=self.config.policy)
        self.queue: WorkQueue[str] = WorkQueue(
            name="pods",
            rate_limit=RateLimit(base_delay=0.01, max_delay=30.0, qps=0, burst=1),
            order=self._order_of_key,
        )
        self._reporter = ConditionReporter(api=api, events=events, clock=self._clock)
        self._active = threading.Event()
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._first_seen: dict[str, float] = {}
        self._waiting_capacity: set[str] = set()
        self._waiting_change: set[str] = set()
        self._workers: list[threading.Thread] = []
        self._leading_thread: threading.Thread | None = None
        self._term = 0
        """Bumped by ``start_leading`` and ``stop_leading``: a rebuild acts only for its own term."""
        self.sync = PodSync(
            api=api,
            informers=informers,
            state=self.state,
            reporter=self._reporter,
            metrics=metrics,
            clock=self._clock,
            is_leader=self.is_acting,
            latency=self._latency,
            config=self.config.sync,
            wake_keys=self._wake_keys,
            wake_waiting=lambda: self._wake(everyone=False),
        )
        self._shadows = ShadowReleaser(
            api=api, informers=informers, metrics=metrics, is_leader=self.is_acting
        )
        self._register()

    # -- state ---------------------------------------------------------------------------------

    def is_acting(self) -> bool:
        """Leader, state rebuilt, not stopped: allowed to write."""
        return self._active.is_set() and self._is_leader()

    def pending(self) -> int:
        """Pods carrying our gate (metric)."""
        return sum(
            1 for pod in self._informers.pods.list() if PodView.of(pod).gated_by(SCHEDULING_GATE)
        )

    def wait_report(self) -> WaitReport:
        """Why the pods wait and the stranded room, as of now (metrics; ``waitreport``)."""
        waiting, states = self.state.wait_inputs()
        return wait_report(
            (PodView.of(pod) for pod in self._informers.pods.list()),
            gate=SCHEDULING_GATE,
            waiting=waiting,
            reported=self._reporter.reported(),
            states=states,
            now=self._clock.now(),
        )

    def waiting(self) -> tuple[int, int]:
        """(pods waiting for capacity, pods waiting for the inventory or their claims to change)."""
        with self._lock:
            return len(self._waiting_capacity), len(self._waiting_change)

    def _order_of_key(self, key: str) -> PodOrder:
        """Pods are served by priority, then age (``priority``); other keys after them."""
        if pod_uid_of_key(key) is not None:
            return LAST
        obj = self._informers.pods.get_by_key(key)
        return self.state.order_of(PodView.of(obj)) if obj is not None else LAST

    def _wake_keys(self, keys: list[str]) -> None:
        for key in keys:
            self.queue.add(key)

    def _latency(self, pod: PodView) -> float | None:
        with self._lock:
            seen = self._first_seen.pop(pod.key, None)
        return None if seen is None else time.monotonic() - seen

    # -- handlers ------------------------------------------------------------------------------

    def _register(self) -> None:
        informers = self._informers
        informers.pods.add_handler(
            on_add=self._pod_added,
            on_update=lambda old, new: self._pod_updated(new),
            on_delete=self._pod_deleted,
        )
        informers.claims.add_handler(
            on_add=self._claim_changed,
            on_update=lambda old, new: self._claim_changed(new),
            on_delete=self._claim_deleted,
        )
        informers.slices.add_handler(
            on_add=self._slice_changed,
            on_update=lambda old, new: self._slice_changed(new),
            on_delete=self._slice_deleted,
        )
        informers.classes.add_handler(
            on_add=lambda obj: self._wake(everyone=True),
            on_update=lambda old, new: self._wake(everyone=True),
            on_delete=lambda obj: self._wake(everyone=True),
        )
        informers.nodes.add_handler(
            on_add=self._node_changed,
            on_update=self._node_updated,
            on_delete=self._node_deleted,
        )
        informers.shim_leases.add_handler(
            on_add=self._shim_lease_changed,
            on_update=lambda old, new: self._shim_lease_changed(new),
            on_delete=self._shim_lease_deleted,
        )

    def _pod_added(self, pod: JsonObject) -> None:
        view = PodView.of(pod)
        if view.gated_by(SCHEDULING_GATE):
            with self._lock:
                self._first_seen.setdefault(view.key, time.monotonic())
        self._pod_updated(pod)

    def _pod_updated(self, pod: JsonObject) -> None:
        if self.state.nodes.pod_changed(pod):
            self._wake(everyone=False)  # it finished: its CPU, memory, ... are free again
        pause = self.state.nodes.classic_admission(pod)
        view = PodView.of(pod)
        if pause is not None:
            self._classic_rejected(view, pause)
        if self._wanted(view):
            self.queue.add(view.key)

    def _wanted(self, pod: PodView) -> bool:
        """Gated, a finished classic pod, or (hand-off on) one kube-scheduler could not bind."""
        return (
            pod.gated_by(SCHEDULING_GATE)
            or (pod.terminal and pod.requests_resource(_is_classic_resource))
            or (self._handoff_unbound and unbound_since(pod) is not None)
            or (self._preempts_for_scheduler and self._unschedulable_preemptor(pod))
        )

    @property
    def _preempts_for_scheduler(self) -> bool:
        sync = self.config.sync
        return sync.scheduler_mode and sync.preemption

    @staticmethod
    def _unschedulable_preemptor(pod: PodView) -> bool:
        """Scheduler mode: a pod with claims or classic requests that kube-scheduler reports
        unschedulable and that may preempt."""
        if not may_preempt(pod):
            return False
        if unbound_since(pod) is not None:
            return True
        return (
            not pod.bound
            and not pod.terminal
            and not pod.meta.deleting
            and pod.requests_resource(_is_classic_resource)
            and any(
                c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
                for c in pod.conditions
            )
        )

    @property
    def _handoff_unbound(self) -> bool:
        sync = self.config.sync
        return sync.handoff_after is not None and not sync.scheduler_mode

    def _pod_deleted(self, pod: JsonObject) -> None:
        if self.state.nodes.pod_deleted(pod):
            self._wake(everyone=False)
        view = PodView.of(pod)
        key = view.key
        with self._lock:
            self._first_seen.pop(key, None)
            self._waiting_capacity.discard(key)
            self._waiting_change.discard(key)
        self._reporter.forget(view.uid)
        if self.state.forget_pod(key=key, uid=view.uid):
            self._wake(everyone=False)  # room held for it is free again
        if self._shadows.has_claims(view.uid):
            self.queue.add(gone_key(view.uid))

    def _claim_changed(self, claim: JsonObject) -> None:
        freed = self.state.claim_changed(claim)
        self._enqueue_users(claim)
        pod_uid = self._shadows.suspect(claim)
        if pod_uid is not None:
            self.queue.add(gone_key(pod_uid))
        if freed:
            self._wake(everyone=False)

    def _claim_deleted(self, claim: JsonObject) -> None:
        freed = self.state.claim_deleted(claim)
        self._enqueue_users(claim)
        if freed:
            self._wake(everyone=False)

    def _enqueue_users(self, claim: JsonObject) -> None:
        pods = self._informers.pods
        view = ClaimView.of(claim)
        users = list(pods.by_index(BY_CLAIM, view.key))
        for owner in view.meta.owners:
            if owner.kind == "Pod":
                users.extend(pods.by_index(BY_UID, owner.uid))
        for pod in users:
            user = PodView.of(pod)
            if user.gated_by(SCHEDULING_GATE):
                self.queue.add(user.key)

    def _slice_changed(self, slice_obj: JsonObject) -> None:
        self.state.slice_changed(slice_obj)
        self._wake(everyone=True)

    def _slice_deleted(self, slice_obj: JsonObject) -> None:
        self.state.slice_deleted(slice_obj)
        self._wake(everyone=True)

    def _node_changed(self, node: JsonObject) -> None:
        self.state.nodes.node_changed(node)
        self._wake(everyone=True)

    def _node_updated(self, old: JsonObject, new: JsonObject) -> None:
        self.state.nodes.node_changed(new)
        if node_info(old) != node_info(new):  # heartbeats change nothing that matters
            self._wake(everyone=True)

    def _node_deleted(self, node: JsonObject) -> None:
        self.state.nodes.node_deleted(node)

    def _shim_lease_changed(self, lease: JsonObject) -> None:
        if self.state.nodes.shim_lease_changed(lease):
            self._wake(everyone=True)

    def _shim_lease_deleted(self, lease: JsonObject) -> None:
        if self.state.nodes.shim_lease_deleted(lease):
            self._wake(everyone=True)

    def _classic_rejected(self, pod: PodView, pause: float) -> None:
        """The kubelet refused a classic pod (our shim did not answer): waiting classic pods
        avoid that node for ``pause`` seconds, then are tried again."""
        logger.warning(
            "the kubelet on node %s rejected classic pod %s at admission (%s); no classic pods "
            "go there for %.0fs",
            pod.node_name,
            pod.key,
            pod.message,
            pause,
        )
        timer = threading.Timer(pause, self._wake, kwargs={"everyone": True})
        timer.daemon = True
        timer.start()

    def _wake(self, *, everyone: bool) -> None:
        """Requeue waiting pods: those waiting for capacity, and with ``everyone`` all of them.
        The work queue hands them out by priority, then age."""
        self.state.capacity_changed()
        with self._lock:
            keys = set(self._waiting_capacity)
            self._waiting_capacity.clear()
            if everyone:
                keys |= self._waiting_change
                self._waiting_change.clear()
        for key in sorted(keys):
            self.queue.add(key)

    # -- workers -------------------------------------------------------------------------------

    def start_workers(self) -> None:
        for i in range(self.config.workers):
            thread = threading.Thread(
                target=self._work, name=f"{self.config.name}-{i}", daemon=True
            )
            thread.start()
            self._workers.append(thread)

    def _work(self) -> None:
        while True:
            key = self.queue.get()
            if key is None:
                return
            try:
                self._process(key)
            except Exception:
                logger.exception("pod %s: unexpected error", key)
                self.queue.add_rate_limited(key)
            finally:
                self.queue.done(key)

    def _process(self, key: str) -> None:
        if not self._active.is_set():
            return  # start_leading enqueues every gated pod again
        pod_uid = pod_uid_of_key(key)
        if pod_uid is not None:
            self._release_if_gone(key, pod_uid)
            return
        obj = self._informers.pods.get_by_key(key)
        with self._lock:
            self._waiting_capacity.discard(key)
            self._waiting_change.discard(key)
        if obj is None:
            self.queue.forget(key)
            return
        pod = PodView.of(obj)
        if pod.terminal:
            self._release_shadow_claims(pod)
            return
        result = self._pass(key, pod)
        if result is not None:
            self._requeue(key, result)

    def _pass(self, key: str, pod: PodView) -> Result | None:
        """The pass a live pod needs now; None when there is nothing to do for it."""
        gates = pod.scheduling_gates
        if self._handoff_unbound and unbound_since(pod) is not None:
            return self.sync.unbound(pod)
        if self._preempts_for_scheduler and self._unschedulable_preemptor(pod):
            return self.sync.preempt_for_scheduler(pod)
        if SCHEDULING_GATE not in gates or pod.meta.deleting:
            self.queue.forget(key)
            if self.state.forget_pod(key=key, uid=pod.uid):
                self._wake(everyone=False)
            return None
        if gates != (SCHEDULING_GATE,):
            return None  # someone else's gate first (Kueue): we are woken when it is lifted
        return self.sync.sync(pod)

    def _requeue(self, key: str, result: Result) -> None:
        outcome = result.outcome
        if outcome in (Outcome.DONE, Outcome.WAIT):
            self.queue.forget(key)
        elif outcome is Outcome.WAIT_CAPACITY or outcome is Outcome.WAIT_CHANGE:
            self.queue.forget(key)
            with self._lock:
                waiting = (
                    self._waiting_capacity
                    if outcome is Outcome.WAIT_CAPACITY
                    else self._waiting_change
                )
                waiting.add(key)
            if result.delay > 0:
                self.queue.add_after(key, result.delay)  # a deadline: hand-off, hold, bound
        elif outcome is Outcome.RETRY_AFTER:
            self.queue.add_after(key, result.delay)
        else:
            self.queue.add_rate_limited(key)

    def _release_shadow_claims(self, pod: PodView) -> None:
        key = pod.key
        try:
            self._shadows.release_finished(pod)
        except NotLeaderError:
            self.queue.add_after(key, self.config.sync.not_leader_retry)  # see PodSync._not_leader
            return
        except ClusterError as exc:
            logger.info("cannot release the shadow claims of pod %s yet: %s", key, exc)
            self.queue.add_rate_limited(key)
            return
        self.queue.forget(key)

    def _release_if_gone(self, key: str, pod_uid: str) -> None:
        try:
            self._shadows.release_if_gone(pod_uid)
        except NotLeaderError:
            self.queue.add_after(key, self.config.sync.not_leader_retry)
            return
        except ClusterError as exc:
            logger.info("cannot release the shadow claims of pod %s yet: %s", pod_uid, exc)
            self.queue.add_rate_limited(key)
            return
        self.queue.forget(key)

    # -- leadership ----------------------------------------------------------------------------

    def start_leading(self) -> None:
        """Called when the lease is won; returns at once (the rebuild runs on its own thread)."""
        with self._lock:
            self._term += 1
            term = self._term
        thread = threading.Thread(
            target=self._lead, args=(term,), name=f"{self.config.name}-lead", daemon=True
        )
        self._leading_thread = thread
        thread.start()

    def _term_over(self, term: int) -> bool:
        """``stop_leading`` (or ``stop``) was called since ``term`` started. Not ``is_leader()``:
        that is also False for a moment while a renew is late, and the term goes on once it lands
        (no new ``start_leading`` would come to rebuild)."""
        with self._lock:
            return self._stopped.is_set() or self._term != term

    def _lead(self, term: int) -> None:
        if not self._informers.wait_for_sync(timeout=self.config.cache_sync_timeout):
            logger.error(
                "caches did not sync within %.0fs; not allocating", self.config.cache_sync_timeout
            )
            return
        if self._term_over(term):
            return
        informers = self._informers
        self.state.rebuild(slices=informers.slices.list, claims=informers.claims.list)
        self.state.warm(
            c for c in informers.classes.list() if is_our_class(DeviceClassView.of(c).name, c)
        )
        for obj in informers.pods.list():  # before any decision: the holds a leader left
            pod = PodView.of(obj)
            if pod.gated_by(SCHEDULING_GATE) and not pod.meta.deleting:
                self.sync.restore_hold(pod)
        with self._lock:  # so that a stop_leading meanwhile is not undone
            if self._stopped.is_set() or self._term != term:
                logger.info("leadership ended while the state was rebuilt; not allocating")
                return
            self._active.set()
        logger.info("allocating as leader")
        for obj in informers.pods.list():
            pod = PodView.of(obj)
            if self._wanted(pod):
                self.queue.add(pod.key)
        for pod_uid in sorted(self._shadows.suspects()):
            self.queue.add(gone_key(pod_uid))

    def stop_leading(self) -> None:
        with self._lock:
            self._term += 1
            if self._active.is_set():
                logger.info("stopped allocating (no longer leader)")
            self._active.clear()

    @property
    def leading_ready(self) -> bool:
        """State rebuilt and allocating."""
        return self._active.is_set()

    def stop(self, *, timeout: float = 10.0) -> None:
        with self._lock:
            self._stopped.set()
            self._active.clear()
        self.queue.shutdown()
        deadline = time.monotonic() + timeout
        for thread in self._workers:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._leading_thread is not None:
            self._leading_thread.join(max(0.0, deadline - time.monotonic()))
