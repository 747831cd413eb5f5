"""One kubelet-plugin instance: its parts built from the chosen backend and API, started in order.

Start order: recover checkpoint ⇄ GPU ⇄ API first (so nothing is served from a stale checkpoint),
serve the DRA socket, then the registration socket (the kubelet dials the DRA endpoint as soon as
it sees the registration socket), publish the inventory once the kubelet has registered the plugin
(``registration_wait_seconds``), then ``/healthz`` and ``/metrics``, then the inventory poll and the
XID watch. Publishing waits for the registration because a device published before it can be
allocated, and its pod bound, while the kubelet cannot call us yet: the kubelet then fails the
pod's prepare ("DRA driver ... is not registered") and tries again only on its next resync of the
pod, about a minute later — what every pod landing on a new node within its first second got (seen
on real kubelets, whose plugin watcher registers a plugin up to a second after its socket appears). The DRA socket also
serves the resource-health stream (``health_stream``), fed by every inventory read (lost GPUs,
memory errors, critical XIDs). ``stop`` goes the other way: health streams ended first, and removes
both sockets. ``__main__`` and the tests (and the local demo) build the plugin through this class;
only the callers choose the backend and the API client.
"""

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import grpc

from api.names import DRIVER_NAME
from driver import cdi
from driver.cdi_common import NO_COMMON_EDITS, CommonEdits, write_common_spec
from driver.checkpoint import CHECKPOINT_FILE_NAME, CheckpointStore
from driver.cluster.events import EventRecorder
from driver.cluster.informer import Informer, ListWatch
from driver.cluster.informer_metrics import InformerCollector
from driver.cluster.port import RESOURCE_SLICES, ClusterApi, JsonObject
from driver.cluster.views import SliceView
from driver.daemon.http import HttpEndpoint, endpoints_by_address
from driver.errors import DriverError
from driver.gpu.backend import GpuBackend
from driver.taints import EFFECT_NO_SCHEDULE
from kubeletplugin.dra.registration import (
    REASON_NOT_REGISTERED,
    RegistrationServicer,
    RegistrationTracker,
    RegistrationWatchdog,
    add_registration_service,
    registration_socket_path,
)
from kubeletplugin.dra.service import add_dra_services
from kubeletplugin.health.liveness import HealthChecker
from kubeletplugin.health.settings import XidPolicy
from kubeletplugin.health.stream import DeviceHealthBoard, DraHealthServicer, add_health_service
from kubeletplugin.health.xid import XidHealth
from kubeletplugin.metrics import NAMESPACE, PluginMetrics
from kubeletplugin.node.events import NodeEvents, NodeWarning
from kubeletplugin.node.publisher import SlicePublisher
from kubeletplugin.node.waiting import backoff
from kubeletplugin.nodestatemetrics import NodeStateCollector
from kubeletplugin.slicemetrics import SliceCollector
from kubeletplugin.sliceusage import SliceUsageCache
from kubeletplugin.sockets import UnixGrpcServer, ensure_directory
from kubeletplugin.state.devicestate import DeviceState, StepHook, slices_in_use
from kubeletplugin.state.devicestatus import DeviceStatusWriter, RecordingPreparer
from kubeletplugin.state.journal import CheckpointJournal
from kubeletplugin.state.recovery import Recovery, RecoveryReport

logger = logging.getLogger(__name__)

DRA_SOCKET_NAME: Final = "dra.sock"
STATE_DIR_MODE: Final = 0o700


@dataclass(frozen=True, slots=True)
class PluginConfig:
    node_name: str
    plugin_registry_dir: Path
    plugin_dir: Path
    cdi_root: Path
    state_dir: Path
    emulated: bool
    """No host device nodes in CDI specs (docs/design.md F10)."""
    healthz_address: str = ""
    """``host:port``; empty: no health endpoint."""
    metrics_address: str = ""
    inventory_poll_seconds: float = 30.0
    driver_name: str = DRIVER_NAME
    unhealthy_taint_effect: str = EFFECT_NO_SCHEDULE
    xid_policy: XidPolicy = field(default_factory=XidPolicy)
    health_resend_seconds: float = 10.0
    """How often the health stream repeats the full state when nothing changed."""
    cdi_common: CommonEdits = NO_COMMON_EDITS
    """Edits shared by every slice's container (``driver.cdi_common``), written at start."""
    registration_wait_seconds: float = 0.0
    """How long ``start`` waits for the kubelet to register the plugin before its first
    publication (then publishes all the same, with a warning); 0 publishes at once."""
    registration_grace_seconds: float | None = None
    """How long the kubelet may take to register the plugin before a Warning on the Node says
    it does not (``RegistrationWatchdog``); None: not watched."""


class KubeletPlugin:
    def __init__(
        self,
        *,
        config: PluginConfig,
        backend: GpuBackend,
        api: ClusterApi,
        boot_id: str,
        events: EventRecorder | None = None,
        metrics: PluginMetrics | None = None,
        majors: cdi.DeviceMajors | None = None,
        step_hook: StepHook | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or PluginMetrics()
        self.tracker = RegistrationTracker()
        self.dra_socket = config.plugin_dir / DRA_SOCKET_NAME
        self.registration_socket = registration_socket_path(
            config.plugin_registry_dir, config.driver_name
        )
        self.store = CheckpointJournal(CheckpointStore(config.state_dir / CHECKPOINT_FILE_NAME))
        self.health_board = DeviceHealthBoard(
            pool=config.node_name,
            stale_after_seconds=3 * config.inventory_poll_seconds + 30,
        )
        self.xid_health = XidHealth(
            backend=backend, policy=config.xid_policy, on_change=self._gpu_health_changed
        )
        self.publisher = self._publisher(backend=backend, api=api, events=events)
        self._own_slices = self._watch_own_slices(api)
        self._register_scraped(backend)
        self.state = self._device_state(
            backend=backend, api=api, majors=majors, step_hook=step_hook
        )
        self.device_status = DeviceStatusWriter(
            api=api, driver=config.driver_name, pool=config.node_name
        )
        self.recovery = self._recovery(api=api, boot_id=boot_id)
        self.health = HealthChecker(
            registration_socket=self.registration_socket,
            dra_socket=self.dra_socket,
            tracker=self.tracker,
            inventory=lambda: self.publisher.inventory,
        )
        self.health_service = DraHealthServicer(
            self.health_board, resend_seconds=config.health_resend_seconds
        )
        self._dra_server = UnixGrpcServer(
            path=self.dra_socket, register=self._register_dra, name="dra"
        )
        self._registration_server = UnixGrpcServer(
            path=self.registration_socket,
            register=self._register_registration,
            max_workers=2,
            name="registration",
        )
        self.registration_watchdog = self._registration_watchdog(api=api, events=events)
        self._http = self._http_endpoints()
        self._started = False

    def _register_scraped(self, backend: GpuBackend) -> None:
        """The series read when scraped: the slice informer's, each live MIG slice's, the
        registration and the instances no claim owns."""
        self.metrics.registry.register(
            InformerCollector(namespace=NAMESPACE, informers=lambda: {"slices": self._own_slices})
        )
        self.metrics.registry.register(
            SliceCollector(
                node_name=self.config.node_name,
                checkpoint=self.store.load,
                usage=SliceUsageCache(source=backend),
            )
        )
        self.metrics.registry.register(
            NodeStateCollector(
                registered=lambda: self.tracker.state.registered,
                instances=backend.instances,
                checkpoint=self.store.load,
            )
        )

    def _publisher(
        self, *, backend: GpuBackend, api: ClusterApi, events: EventRecorder | None
    ) -> SlicePublisher:
        config = self.config
        return SlicePublisher(
            api=api,
            backend=backend,
            node_name=config.node_name,
            driver_name=config.driver_name,
            events=events,
            metrics=self.metrics,
            poll_seconds=config.inventory_poll_seconds,
            taint_effect=config.unhealthy_taint_effect,
            overlay=self.xid_health.apply,
            listeners=(self.health_board,),
        )

    def _device_state(
        self,
        *,
        backend: GpuBackend,
        api: ClusterApi,
        majors: cdi.DeviceMajors | None,
        step_hook: StepHook | None,
    ) -> DeviceState:
        config = self.config
        return DeviceState(
            node_name=config.node_name,
            backend=backend,
            api=api,
            store=self.store,
            cdi_root=config.cdi_root,
            inventory=lambda: self.publisher.inventory,
            emulated=config.emulated,
            majors=majors,
            metrics=self.metrics,
            step_hook=step_hook,
            common_cdi_device_ids=config.cdi_common.cdi_device_ids,
        )

    def _registration_watchdog(
        self, *, api: ClusterApi, events: EventRecorder | None
    ) -> RegistrationWatchdog | None:
        config = self.config
        if config.registration_grace_seconds is None:
            return None
        return RegistrationWatchdog(
            tracker=self.tracker,
            registration_socket=self.registration_socket,
            report=NodeWarning(
                NodeEvents(api=api, events=events, node_name=config.node_name),
                reason=REASON_NOT_REGISTERED,
            ),
            grace_s=config.registration_grace_seconds,
            delays=backoff(),
        )

    def _http_endpoints(self) -> list[HttpEndpoint]:
        """``/healthz``, ``/readyz`` and ``/metrics``: one server when the flags name one port."""
        health = {"/healthz": self.health.route, "/readyz": self.health.ready_route}
        served = [
            (self.config.healthz_address, health),
            (self.config.metrics_address, {"/metrics": self._metrics_route}),
        ]
        return list(endpoints_by_address(served).values())

    def _watch_own_slices(self, api: ClusterApi) -> Informer:
        """The kubelet deletes every ResourceSlice of its node when it starts (no driver is
        registered yet) and of a driver that stays unregistered (seen on real kubelets); our
        slices would then be missing until the next poll (up to ``inventory_poll_seconds``) while
        the node's claims stay allocated. A watch on our own slices republishes at once."""
        node_name = self.config.node_name
        informer = Informer(
            source=ListWatch(api, RESOURCE_SLICES, field_selector=f"spec.nodeName={node_name}"),
            name=f"slices-{node_name}",
        )
        informer.add_handler(on_delete=self._slice_deleted)
        return informer

    def _recovery(self, *, api: ClusterApi, boot_id: str) -> Recovery:
        config = self.config
        return Recovery(
            node_name=config.node_name,
            store=self.store,
            slices=self.state.slices,
            api=api,
            cdi_root=config.cdi_root,
            inventory=lambda: self.publisher.inventory,
            boot_id=boot_id,
            metrics=self.metrics,
            common_cdi_device_ids=config.cdi_common.cdi_device_ids,
        )

    def start(self) -> RecoveryReport:
        """Recover, publish, serve; returns what recovery did. Raises ``DriverError`` if the
        plugin cannot start (unusable directory, socket path, GPU backend)."""
        if not self.config.state_dir.is_dir():
            ensure_directory(self.config.state_dir, mode=STATE_DIR_MODE)
        ensure_directory(self.config.cdi_root, mode=0o755)
        write_common_spec(self.config.cdi_root, self.config.cdi_common)
        self.publisher.refresh_inventory()
        report = self.recovery.run()
        self.metrics.set_slices_in_use(slices_in_use(self.store.load()))
        self._started = True
        self.health_board.reopen()
        self._dra_server.start()
        self._registration_server.start()
        if self.registration_watchdog is not None:
            self.registration_watchdog.start()
        wait = self.config.registration_wait_seconds
        if wait > 0 and not self.tracker.wait_registered(timeout=wait):
            logger.warning(
                "the kubelet has not registered the plugin within %.0fs; publishing anyway", wait
            )
        try:
            self.publisher.sync()
        except DriverError as exc:
            logger.warning("first ResourceSlice publication failed (will retry): %s", exc)
        for endpoint in self._http:
            endpoint.start()
        self.publisher.start()
        self._own_slices.start()
        self.xid_health.start()
        return report

    def stop(self) -> None:
        """Stop serving and remove both sockets; prepared slices and the checkpoint stay."""
        if not self._started:
            self.device_status.close()
            self.state.close()
            return
        self._started = False
        self.health_board.close()
        if self.registration_watchdog is not None:
            self.registration_watchdog.stop()
        self._registration_server.stop()
        self._dra_server.stop()
        self.device_status.close()
        self.xid_health.stop()
        self._own_slices.stop()
        self.publisher.stop()
        for endpoint in self._http:
            endpoint.stop()
        self.state.close()
        logger.info("kubelet plugin stopped")

    def _gpu_health_changed(self) -> None:
        self.publisher.wake()

    def _slice_deleted(self, slice_obj: JsonObject) -> None:
        if SliceView.of(slice_obj).driver == self.config.driver_name and self._started:
            logger.info("a ResourceSlice of this node was deleted; republishing now")
            self.publisher.wake()

    def _register_dra(self, server: grpc.Server) -> None:
        add_dra_services(
            server,
            RecordingPreparer(self.state, prepared=self.state, writer=self.device_status),
            metrics=self.metrics,
        )
        add_health_service(server, self.health_service)

    def _register_registration(self, server: grpc.Server) -> None:
        add_registration_service(
            server,
            RegistrationServicer(
                driver_name=self.config.driver_name, endpoint=self.dra_socket, tracker=self.tracker
            ),
        )

    def endpoint_port(self, name: str) -> int:
        """Port serving ``/healthz`` or ``/metrics`` (``name`` without the slash; after start)."""
        for endpoint in self._http:
            if f"/{name}" in endpoint.paths:
                return endpoint.port
        raise KeyError(name)

    def _metrics_route(self) -> tuple[int, str, bytes]:
        return 200, "text/plain; version=0.0.4; charset=utf-8", self.metrics.render()
