"""The controller's cluster-facing core, assembled: informers, allocator, leader election, metrics.

``__main__`` adds what a process needs around it (flags, logging, the webhook server and its
certificates, HTTP endpoints, signals); tests and benchmarks run this class in-process against the
local API server, several at once when they race.
"""

from __future__ import annotations

import logging
import threading

from api.names import SYSTEM_NAMESPACE
from controller.allocation.allocator import Allocator, AllocatorConfig
from controller.informers import ClusterInformers
from controller.metrics import NAMESPACE as METRICS_NAMESPACE
from controller.metrics import ControllerMetrics
from controller.webhook.context import CacheAdmissionContext
from driver.cluster.clock import Clock, SystemClock
from driver.cluster.events import EventRecorder
from driver.cluster.informer_metrics import InformerCollector
from driver.cluster.leader import LeaderElectionConfig, LeaderElector
from driver.cluster.port import ClusterApi

logger = logging.getLogger(__name__)

COMPONENT = "instaslice-controller"


class Controller:
    def __init__(
        self,
        *,
        api: ClusterApi,
        config: AllocatorConfig | None = None,
        leader_election: LeaderElectionConfig | None = None,
        identity: str = COMPONENT,
        clock: Clock | None = None,
    ) -> None:
        self.api = api
        self.identity = identity
        self._clock = clock or SystemClock()
        self._running = threading.Event()
        self.informers = ClusterInformers.create(
            api,
            name=identity,
            namespace=leader_election.namespace if leader_election else SYSTEM_NAMESPACE,
        )
        self.metrics = ControllerMetrics()
        self.events = EventRecorder(api=api, component=COMPONENT, instance=identity, clock=clock)
        self.elector: LeaderElector | None = None
        self.allocator = Allocator(
            api=api,
            informers=self.informers,
            events=self.events,
            metrics=self.metrics,
            is_leader=self.is_leader,
            config=config,
            clock=self._clock,
        )
        if leader_election is not None:
            self.elector = LeaderElector(
                api=api,
                config=leader_election,
                on_started_leading=self.allocator.start_leading,
                on_stopped_leading=self.allocator.stop_leading,
                clock=clock,
            )
        self.admission = CacheAdmissionContext(informers=self.informers, state=self.allocator.state)
        self.metrics.bind_state(
            pending=self.allocator.pending,
            free=self.allocator.state.free_per_profile,
            leader=self.allocator.is_acting,
            holds=self.allocator.state.hold_counts,
        )
        self.metrics.bind_wait_report(self.allocator.wait_report, leader=self.allocator.is_acting)
        self.metrics.registry.register(
            InformerCollector(namespace=METRICS_NAMESPACE, informers=self.informers.named)
        )

    def is_leader(self) -> bool:
        if not self._running.is_set():
            return False
        return self.elector.is_leader() if self.elector is not None else True

    def start(self) -> None:
        """Start informers and workers, then campaign (or, without election, lead at once)."""
        self._running.set()
        self.informers.start()
        self.allocator.start_workers()
        if self.elector is not None:
            self.elector.start()
        else:
            self.allocator.start_leading()

    def stop(self, *, release_lease: bool = True) -> None:
        """Stop everything; ``release_lease=False`` leaves the lease as a crash would."""
        self._running.clear()
        self.allocator.stop_leading()
        if self.elector is not None:
            self.elector.stop(release=release_lease)
        self.allocator.stop()
        self.informers.stop()

    def healthy(self) -> bool:
        """Liveness: the process runs its loops (an API outage is not a reason to restart)."""
        return self._running.is_set()

    def ready(self) -> bool:
        """Readiness: caches synced, and — while leading — the state rebuilt and allocating."""
        if not self._running.is_set() or not self.informers.has_synced():
            return False
        return not self.is_leader() or self.allocator.leading_ready
