"""The kubelet's device manager (device-plugin API v1beta1) for one emulated node.

* Serves ``v1beta1.Registration`` on ``device-plugins/kubelet.sock``. ``Register`` checks the version
  (``v1beta1``) and that the resource is an extended resource name, dials the plugin's endpoint (a
  file name in the same directory), asks ``GetDevicePluginOptions`` and opens ``ListAndWatch``; each
  list replaces the resource's devices. Node capacity is the device count, allocatable the healthy
  ones; a plugin whose stream ends has all its devices counted unhealthy until it registers again.
* Admission (one pod at a time) allocates per container (init containers first) for every
  extended resource in its limits that a plugin serves: ``GetPreferredAllocation`` when the plugin
  offers it, then ``Allocate`` with the chosen ids. Not enough healthy free devices or a failing
  ``Allocate`` rejects the pod (``UnexpectedAdmissionError``). The pod is listed by pod-resources
  from the start of its own admission turn (without devices), and the assignment as soon as
  ``Allocate`` has answered. ``PreStartContainer`` runs before each container start when the
  plugin asks for it.
* ``restart`` is a kubelet restart as plugins see it: the registration socket and every other
  socket in the directory are removed (``CleanupPluginDirectory``) and ``kubelet.sock`` created
  anew; allocations survive (the kubelet restores them from its checkpoint) but no resource is
  allocatable until its plugin registers again.

Not modelled: devices of init containers reused by app containers, topology hints, the 5 minute
grace before a stopped plugin's resource disappears from the node.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from driver.cluster.port import JsonObject, uid_of
from localcluster.cluster.grpcutil import CALL_TIMEOUT_S, UnixServer, dial
from localcluster.cluster.podutil import container_limits
from protos.deviceplugin.v1beta1 import api_pb2 as dp
from protos.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT_FILE = "kubelet_internal_checkpoint"
SUPPORTED_VERSIONS = ("v1beta1",)
HEALTHY = "Healthy"


class AdmissionError(Exception):
    """The pod cannot be admitted; the message is what the kubelet reports."""


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """What one container got for one resource."""

    resource: str
    device_ids: tuple[str, ...]
    envs: dict[str, str]
    cdi_devices: tuple[str, ...]


@dataclass(slots=True)
class _Endpoint:
    resource: str
    endpoint: str
    channel: grpc.Channel
    stub: dp_grpc.DevicePluginStub
    options: dp.DevicePluginOptions
    devices: dict[str, str] = field(default_factory=dict)  # id -> health
    stream: Any = None
    thread: threading.Thread | None = None
    stopped: bool = False


def is_extended_resource_name(name: str) -> bool:
    """``v1helper.IsExtendedResourceName``: domain-prefixed, not ``kubernetes.io``, not quota."""
    if "/" not in name or name.startswith("requests."):
        return False
    domain = name.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


class DeviceManager:
    def __init__(self, *, directory: Path, on_change: Callable[[], None]) -> None:
        self.directory = directory
        self._on_change = on_change
        self._lock = threading.RLock()
        # The kubelet admits pods one at a time (HandlePodAdditions), so two pods never race for
        # the same preferred device ids; admissions here are serialized the same way.
        self._admission_lock = threading.Lock()
        self._endpoints: dict[str, _Endpoint] = {}
        self._known_resources: set[str] = set()
        # pod uid -> container -> allocations
        self._allocated: dict[str, dict[str, list[ContainerAllocation]]] = {}
        self._in_flight: dict[str, set[tuple[str, str]]] = {}  # pod uid -> (resource, id)
        self._server: UnixServer | None = None
        self.registrations = 0

    @property
    def socket_path(self) -> Path:
        return self.directory / KUBELET_SOCKET

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._cleanup_directory()
        server = UnixServer(
            path=self.socket_path,
            register=lambda s: dp_grpc.add_RegistrationServicer_to_server(_Registration(self), s),
            name="device-manager",
        )
        server.start()
        self._server = server

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()
        with self._lock:
            endpoints = list(self._endpoints.values())
            self._endpoints.clear()
        for endpoint in endpoints:
            self._close_endpoint(endpoint)

    def restart(self) -> None:
        """A kubelet restart: sockets wiped, ``kubelet.sock`` re-created, plugins must re-register."""
        self.stop()
        self.start()
        self._on_change()

    def _cleanup_directory(self) -> None:
        for entry in os.scandir(self.directory):
            if entry.name == CHECKPOINT_FILE:
                continue
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except FileNotFoundError:
                continue
            if stat.S_ISSOCK(mode):
                Path(entry.path).unlink(missing_ok=True)

    # --- registration ---------------------------------------------------------------------------

    def register(self, request: dp.RegisterRequest) -> None:
        """The ``Register`` call; raises ``ValueError`` with the kubelet's message on refusal."""
        if request.version not in SUPPORTED_VERSIONS:
            raise ValueError(
                f"requested device plugin version {request.version} is not supported, "
                f"supported versions: {list(SUPPORTED_VERSIONS)}"
            )
        if not is_extended_resource_name(request.resource_name):
            raise ValueError(f"invalid name of device plugin socket: {request.resource_name}")
        path = self.directory / request.endpoint
        try:
            channel = dial(path, timeout=CALL_TIMEOUT_S)
        except grpc.FutureTimeoutError as exc:
            raise ValueError(f"failed to dial device plugin at {path}") from exc
        stub = dp_grpc.DevicePluginStub(channel)
        try:
            options = stub.GetDevicePluginOptions(dp.Empty(), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            channel.close()
            raise ValueError(f"failed to get device plugin options: {exc}") from exc
        endpoint = _Endpoint(
            resource=request.resource_name,
            endpoint=request.endpoint,
            channel=channel,
            stub=stub,
            options=options,
        )
        with self._lock:
            old = self._endpoints.get(request.resource_name)
            self._endpoints[request.resource_name] = endpoint
            self._known_resources.add(request.resource_name)
            self.registrations += 1
        if old is not None:
            self._close_endpoint(old)
        endpoint.stream = stub.ListAndWatch(dp.Empty())
        endpoint.thread = threading.Thread(
            target=self._list_and_watch,
            args=(endpoint,),
            name=f"list-and-watch-{request.resource_name}",
            daemon=True,
        )
        endpoint.thread.start()
        log.info("device plugin for %s registered at %s", request.resource_name, path)

    def _list_and_watch(self, endpoint: _Endpoint) -> None:
        try:
            for response in endpoint.stream:
                with self._lock:
                    if endpoint.stopped:
                        return
                    endpoint.devices = {d.ID: d.health for d in response.devices}
                self._on_change()
        except Exception as exc:  # grpc.RpcError, or the channel closed under us
            if not endpoint.stopped:
                log.info("ListAndWatch of %s ended: %s", endpoint.resource, exc)
        with self._lock:
            stale = endpoint.stopped
            for device_id in endpoint.devices:
                endpoint.devices[device_id] = "Unhealthy"
        if not stale:
            self._on_change()

    def _close_endpoint(self, endpoint: _Endpoint) -> None:
        with self._lock:
            endpoint.stopped = True
        if endpoint.stream is not None:
            endpoint.stream.cancel()
        if endpoint.thread is not None and endpoint.thread is not threading.current_thread():
            endpoint.thread.join(timeout=5.0)
        endpoint.channel.close()

    # --- what the node advertises ---------------------------------------------------------------

    def resources(self) -> dict[str, tuple[int, int]]:
        """Per resource: (capacity, allocatable) = (all devices, healthy devices)."""
        with self._lock:
            result = dict.fromkeys(self._known_resources, (0, 0))
            for name, endpoint in self._endpoints.items():
                healthy = sum(1 for h in endpoint.devices.values() if h == HEALTHY)
                result[name] = (len(endpoint.devices), healthy)
            return result

    def healthy_devices(self) -> dict[str, list[str]]:
        with self._lock:
            return {
                name: sorted(i for i, h in e.devices.items() if h == HEALTHY)
                for name, e in self._endpoints.items()
            }

    # --- admission and container start ----------------------------------------------------------

    def allocate(self, pod: JsonObject, *, admitting: Callable[[], None] | None = None) -> None:
        """Allocate for every container of the pod; ``AdmissionError`` (nothing kept) on failure.

        ``admitting`` runs first, inside the admission turn: where the kubelet adds the pod to its
        pod manager (``HandlePodAdditions``: add, then admit, one pod at a time), so that
        pod-resources lists a pod from its own admission on, never while it waits for its turn.
        """
        uid = uid_of(pod)
        spec = pod.get("spec") or {}
        containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        with self._admission_lock:
            if admitting is not None:
                admitting()
            try:
                for container in containers:
                    for resource, amount in sorted(container_limits(container).items()):
                        self._allocate_one(uid, str(container.get("name")), resource, int(amount))
            except AdmissionError:
                self.release(uid)
                raise

    def _allocate_one(self, pod_uid: str, container: str, resource: str, needed: int) -> None:
        with self._lock:
            if resource not in self._known_resources or needed <= 0:
                return  # not a device-plugin resource: someone else's business
            done = self._allocated.get(pod_uid, {}).get(container, [])
            if any(a.resource == resource for a in done):
                return
            endpoint = self._endpoints.get(resource)
            if endpoint is None or endpoint.stopped:
                raise AdmissionError(f"cannot allocate unregistered device {resource}")
            in_use = self._in_use(resource)
            available = sorted(
                i for i, h in endpoint.devices.items() if h == HEALTHY and i not in in_use
            )
            if len(available) < needed:
                raise AdmissionError(
                    f"requested number of devices unavailable for {resource}. "
                    f"Requested: {needed}, Available: {len(available)}"
                )
        chosen = self._preferred(endpoint, available, needed)
        with self._lock:
            if set(chosen) & self._in_use(resource):
                raise AdmissionError(f"devices of {resource} were taken meanwhile; retry")
            # Held before the call so that a concurrent admission cannot pick the same ids.
            self._in_flight.setdefault(pod_uid, set()).update((resource, i) for i in chosen)
        try:
            try:
                response = endpoint.stub.Allocate(
                    dp.AllocateRequest(
                        container_requests=[dp.ContainerAllocateRequest(devices_ids=chosen)]
                    ),
                    timeout=CALL_TIMEOUT_S,
                )
            except grpc.RpcError as exc:
                raise AdmissionError(f"Allocate of {resource} failed: {exc.details()}") from exc
            if not response.container_responses:
                raise AdmissionError("no containers return in allocation response")
            answer = response.container_responses[0]
            allocation = ContainerAllocation(
                resource=resource,
                device_ids=tuple(chosen),
                envs=dict(answer.envs),
                cdi_devices=tuple(d.name for d in answer.cdi_devices),
            )
            with self._lock:
                self._allocated.setdefault(pod_uid, {}).setdefault(container, []).append(allocation)
        finally:
            with self._lock:
                held = self._in_flight.get(pod_uid, set())
                held.difference_update((resource, i) for i in chosen)
                if not held:
                    self._in_flight.pop(pod_uid, None)

    def _in_use(self, resource: str) -> set[str]:
        """Device ids of ``resource`` held by any pod (answered or being allocated). Lock held."""
        used = {
            device
            for containers in self._allocated.values()
            for allocations in containers.values()
            for a in allocations
            if a.resource == resource
            for device in a.device_ids
        }
        used |= {i for held in self._in_flight.values() for r, i in held if r == resource}
        return used

    def _preferred(self, endpoint: _Endpoint, available: list[str], needed: int) -> list[str]:
        chosen: list[str] = []
        if endpoint.options.get_preferred_allocation_available:
            try:
                response = endpoint.stub.GetPreferredAllocation(
                    dp.PreferredAllocationRequest(
                        container_requests=[
                            dp.ContainerPreferredAllocationRequest(
                                available_deviceIDs=available,
                                must_include_deviceIDs=[],
                                allocation_size=needed,
                            )
                        ]
                    ),
                    timeout=CALL_TIMEOUT_S,
                )
                if response.container_responses:
                    for device_id in response.container_responses[0].deviceIDs:
                        if device_id in available and device_id not in chosen:
                            chosen.append(device_id)
            except grpc.RpcError as exc:
                log.info("GetPreferredAllocation for %s failed: %s", endpoint.resource, exc)
        chosen = chosen[:needed]
        chosen += [i for i in available if i not in chosen][: needed - len(chosen)]
        return chosen

    def pre_start(self, pod_uid: str, container: str) -> None:
        """``PreStartContainer`` for each of the container's resources whose plugin wants it."""
        for allocation in self.container_allocations(pod_uid, container):
            with self._lock:
                endpoint = self._endpoints.get(allocation.resource)
            if endpoint is None or not endpoint.options.pre_start_required:
                continue
            endpoint.stub.PreStartContainer(
                dp.PreStartContainerRequest(devices_ids=list(allocation.device_ids)),
                timeout=CALL_TIMEOUT_S,
            )

    def container_allocations(self, pod_uid: str, container: str) -> list[ContainerAllocation]:
        with self._lock:
            return list(self._allocated.get(pod_uid, {}).get(container, []))

    def release(self, pod_uid: str) -> None:
        with self._lock:
            self._allocated.pop(pod_uid, None)


class _Registration(dp_grpc.RegistrationServicer):
    def __init__(self, manager: DeviceManager) -> None:
        self._manager = manager

    def Register(  # noqa: N802 - gRPC method name
        self, request: dp.RegisterRequest, context: grpc.ServicerContext
    ) -> dp.Empty:
        try:
            self._manager.register(request)
        except ValueError as exc:
            log.warning("device plugin registration refused: %s", exc)
            context.abort(grpc.StatusCode.UNKNOWN, str(exc))
        return dp.Empty()
