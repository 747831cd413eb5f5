"""The classic-resource shim as one object the kubelet plugin starts and stops.

``Shim.start`` (after the plugin has recovered its checkpoint and published its inventory):
installs its stale-slice judge in the plugin's ``DeviceState`` (a prepare — ``Allocate`` or DRA —
finding a released shadow claim's slice still at its placement releases it first), one reconcile
pass (releases what finished while the plugin was down, records holders), then the
watcher thread — which at once, and then every ``watch_seconds``, serves one device-plugin socket
per profile of the inventory, keeps each resource's advertised devices current, re-serves sockets
the kubelet removed, and registers every resource whose registration the current ``kubelet.sock``
has not seen — and the reconcile thread. ``stop`` ends both threads and the sockets; slices,
checkpoint and claims stay as they are (a restarted plugin carries on from them). The device-plugin
directory belongs to the kubelet: it is never created here, and nothing is served until it exists.

``start(serve=False)`` (``--classic-shim off``, scheduler mode) runs the release side only: the stale
judge and the reconcile thread, no device-plugin socket and no registration. Classic pods admitted
while the shim served them (before a switch to scheduler mode) keep their slices while they run, and
their slices are destroyed when their shadow claims are released, as with the shim on.
"""

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from api.names import SYSTEM_NAMESPACE
from driver.cluster.events import EventRecorder
from driver.cluster.port import ClusterApi
from driver.errors import DriverError
from kubeletplugin.deviceplugin.advertise import advertised_counts, device_ids
from kubeletplugin.deviceplugin.allocate import Allocator, SlicePreparer
from kubeletplugin.deviceplugin.bindings import CheckpointAccess
from kubeletplugin.deviceplugin.lease import ShimLease
from kubeletplugin.deviceplugin.podresources import PodResourcesClient, PodResourcesSource
from kubeletplugin.deviceplugin.reconcile import ReconcileLoop, Reconciler, ReconcileReport
from kubeletplugin.deviceplugin.resources import (
    DEFAULT_RESOURCE_PREFIX,
    ResourceSpec,
    check_prefix,
    resource_name,
    resource_specs,
)
from kubeletplugin.deviceplugin.server import (
    KUBELET_SOCKET_NAME,
    DeviceFeed,
    DevicePluginService,
    ResourceServer,
)
from kubeletplugin.deviceplugin.staleness import ShimSliceJudge
from kubeletplugin.deviceplugin.watcher import KubeletWatcher, SocketIdentity, socket_identity
from kubeletplugin.node.inventory import NodeInventory

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ShimConfig:
    node_name: str
    device_plugin_dir: Path
    """The kubelet's device-plugin directory: its ``kubelet.sock`` and our sockets."""
    pod_resources_socket: Path
    resource_prefix: str = DEFAULT_RESOURCE_PREFIX
    watch_seconds: float = 1.0
    """How often ``kubelet.sock``, our sockets and the inventory are checked."""
    resync_seconds: float = 10.0
    """Reconcile pass interval when nothing triggers one."""
    unheld_grace_seconds: float = 60.0
    """How long ids answered to ``Allocate`` may go unseen in pod-resources before they are freed."""
    kubelet_timeout_seconds: float = 5.0
    lease_namespace: str | None = SYSTEM_NAMESPACE
    """Where the shim's Lease tells the controller it serves (``lease.py``); None: no Lease."""


def _pod_resources_client(config: ShimConfig) -> PodResourcesClient:
    return PodResourcesClient(
        config.pod_resources_socket, timeout_seconds=config.kubelet_timeout_seconds
    )


def _lease(config: ShimConfig, api: ClusterApi) -> ShimLease | None:
    """The Lease that tells the controller this node's shim serves (none without a namespace)."""
    if config.lease_namespace is None:
        return None
    return ShimLease(
        api=api,
        node_name=config.node_name,
        identity=f"{socket.gethostname()}_{os.getpid()}",
        namespace=config.lease_namespace,
    )


class Shim:
    def __init__(
        self,
        *,
        config: ShimConfig,
        state: SlicePreparer,
        checkpoint: CheckpointAccess,
        api: ClusterApi,
        inventory: Callable[[], NodeInventory],
        pod_resources: PodResourcesSource | None = None,
        clock: Callable[[], float] = time.monotonic,
        events: EventRecorder | None = None,
    ) -> None:
        check_prefix(config.resource_prefix)
        self.config = config
        self._inventory = inventory
        self._owns_pod_resources = pod_resources is None
        self._pod_resources = pod_resources or _pod_resources_client(config)
        lock = threading.RLock()
        self.reconciler = Reconciler(
            node_name=config.node_name,
            state=state,
            checkpoint=checkpoint,
            api=api,
            inventory=inventory,
            pod_resources=self._pod_resources,
            lock=lock,
            resource_for=self._resource_for,
            unheld_grace_seconds=config.unheld_grace_seconds,
            clock=clock,
            events=events,
        )
        self._loop = ReconcileLoop(self.reconciler, resync_seconds=config.resync_seconds)
        self._state = state
        self.judge = ShimSliceJudge(
            node_name=config.node_name, api=api, pod_resources=self._pod_resources
        )
        self.allocator = Allocator(
            node_name=config.node_name,
            state=state,
            checkpoint=checkpoint,
            api=api,
            inventory=inventory,
            pod_resources=self._pod_resources,
            lock=lock,
            on_bound=self._loop.trigger,
        )
        self.kubelet_socket = config.device_plugin_dir / KUBELET_SOCKET_NAME
        self._watcher = self._kubelet_watcher()
        self.lease = _lease(config, api)
        self._servers: dict[str, ResourceServer] = {}
        self._feeds: dict[str, DeviceFeed] = {}
        self._registered: dict[str, SocketIdentity | None] = {}
        self._refused: dict[str, SocketIdentity | None] = {}
        self._servers_lock = threading.Lock()
        self._started = False
        self._serving = False
        self._missing_dir = False

    def _kubelet_watcher(self) -> KubeletWatcher:
        """Calls :meth:`maintain` with ``kubelet.sock``'s identity every ``watch_seconds``."""
        return KubeletWatcher(
            kubelet_socket=self.kubelet_socket,
            interval_seconds=self.config.watch_seconds,
            on_tick=self.maintain,
        )

    def _resource_for(self, profile: str) -> str:
        return resource_name(profile, prefix=self.config.resource_prefix)

    # -- life cycle -------------------------------------------------------------------------

    def start(self, *, serve: bool = True) -> None:
        """Start; ``serve=False`` releases the slices of classic pods admitted earlier but serves
        (advertises, allocates) nothing."""
        self._state.set_stale_judge(self.judge)
        try:
            self.reconciler.run_pass()
        except Exception:
            logger.exception("first shim reconcile pass failed; the reconcile loop retries")
        self._started = True
        self._serving = serve
        if serve:
            self._watcher.start()
        self._loop.start()
        if serve:
            logger.info("classic-resource shim started in %s", self.config.device_plugin_dir)
        else:
            logger.info("classic-resource shim off: releasing earlier classic pods' slices only")

    def stop(self) -> None:
        started, self._started = self._started, False
        if self.lease is not None:
            with self._servers_lock:  # not taken again by a maintenance tick under way
                self.lease.release()  # first: the controller stops sending classic pods here
        if started:
            if self._serving:
                self._watcher.stop()
            self._loop.stop()
        with self._servers_lock:
            for server in self._servers.values():
                server.stop()
            self._servers.clear()
            self._registered.clear()
        self._state.set_stale_judge(None)
        if self._owns_pod_resources:
            self._pod_resources.close()

    # -- what tests and the health endpoint read --------------------------------------------

    @property
    def resources(self) -> tuple[ResourceSpec, ...]:
        with self._servers_lock:
            return tuple(server.spec for server in self._servers.values())

    def advertised(self, resource: str) -> tuple[str, ...]:
        """Device ids the resource advertises now (empty if it is not served)."""
        with self._servers_lock:
            for profile, server in self._servers.items():
                if server.spec.resource_name == resource:
                    return self._feeds[profile].snapshot()[1]
        return ()

    def registered(self) -> dict[str, bool]:
        """Resource name → registered with the current ``kubelet.sock``."""
        identity = socket_identity(self.kubelet_socket)
        with self._servers_lock:
            return {
                server.spec.resource_name: identity is not None
                and self._registered.get(profile) == identity
                for profile, server in self._servers.items()
            }

    def reconcile_now(self) -> ReconcileReport:
        return self.reconciler.run_pass()

    # -- maintenance (watcher thread) -------------------------------------------------------

    def maintain(self, identity: SocketIdentity | None = None) -> None:
        """Serve the inventory's resources, re-serve removed sockets, register what the current
        ``kubelet.sock`` has not seen. Called by the watcher; callable directly (tests)."""
        with self._servers_lock:
            if not self.config.device_plugin_dir.is_dir():
                # The kubelet creates it (and the DaemonSet mounts it); never create it ourselves.
                if not self._missing_dir:
                    logger.warning(
                        "device-plugin directory %s does not exist; classic resources are "
                        "served once it does",
                        self.config.device_plugin_dir,
                    )
                self._missing_dir = True
                return
            self._missing_dir = False
            counts = advertised_counts(self._inventory())
            specs = {
                s.profile: s for s in resource_specs(counts, prefix=self.config.resource_prefix)
            }
            for profile in [p for p in self._servers if p not in specs]:
                logger.info("MIG profile %s is gone from the inventory; no longer served", profile)
                self._servers.pop(profile).stop()
                self._registered.pop(profile, None)
            for profile, spec in specs.items():
                feed = self._feeds.setdefault(profile, DeviceFeed())
                feed.set(device_ids(spec, counts[profile]))
                self._serve(spec, feed)
            if identity is None:
                identity = socket_identity(self.kubelet_socket)
            if identity is None:
                self._registered = dict.fromkeys(self._registered)
                return
            for profile, server in self._servers.items():
                if server.running and self._registered.get(profile) != identity:
                    self._register(profile, server, identity)
            serving = bool(self._servers) and all(
                self._registered.get(profile) == identity for profile in self._servers
            )
            if serving and self.lease is not None and self._started:
                self.lease.acquire()

    def _serve(self, spec: ResourceSpec, feed: DeviceFeed) -> None:
        server = self._servers.get(spec.profile)
        if server is None:
            service = DevicePluginService(
                spec=spec, feed=feed, allocator=self.allocator, on_pre_start=self._loop.trigger
            )
            server = ResourceServer(
                spec=spec, directory=self.config.device_plugin_dir, service=service
            )
            self._servers[spec.profile] = server
        if server.running and server.socket_present():
            return
        if server.running:
            logger.info("socket %s was removed (kubelet restart?); serving it again", server.path)
            server.stop()
        try:
            server.start()
        except DriverError as exc:
            logger.error("cannot serve %s: %s", spec.resource_name, exc)
            return
        self._registered[spec.profile] = None

    def _register(self, profile: str, server: ResourceServer, identity: SocketIdentity) -> None:
        try:
            server.register(
                self.kubelet_socket, timeout_seconds=self.config.kubelet_timeout_seconds
            )
        except DriverError as exc:
            if self._refused.get(profile) != identity:
                logger.warning("%s (retrying)", exc)
                self._refused[profile] = identity
            return
        self._registered[profile] = identity
        self._refused.pop(profile, None)
