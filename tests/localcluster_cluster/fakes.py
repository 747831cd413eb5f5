"""Tiny plugins the emulated kubelet talks to: a DRA plugin (registration + DRA v1 service) and a
device plugin (DevicePlugin service, registering itself on ``kubelet.sock``). Both record calls."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from protos.deviceplugin.v1beta1 import api_pb2 as dp
from protos.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from protos.dra.v1 import api_pb2 as dra
from protos.dra.v1 import api_pb2_grpc as dra_grpc
from protos.dra.v1beta1 import api_pb2 as dra_beta
from protos.dra.v1beta1 import api_pb2_grpc as dra_beta_grpc
from protos.pluginregistration import api_pb2 as reg
from protos.pluginregistration import api_pb2_grpc as reg_grpc
from protos.podresources.v1 import api_pb2 as pr
from protos.podresources.v1 import api_pb2_grpc as pr_grpc


def _server(path: Path, add: Any) -> grpc.Server:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    server = grpc.server(ThreadPoolExecutor(max_workers=4), options=[("grpc.so_reuseport", 0)])
    add(server)
    server.add_insecure_port(f"unix:{path}")
    server.start()
    return server


class FakeDraPlugin(reg_grpc.RegistrationServicer, dra_grpc.DRAPluginServicer):
    """Registers ``driver`` on a kubelet; prepare answers one device per claim."""

    def __init__(
        self,
        kubelet_root: Path,
        *,
        driver: str = "mig.instaslice.dev",
        plugin_type: str = "DRAPlugin",
        services: tuple[str, ...] = ("v1.DRAPlugin", "v1beta1.DRAPlugin"),
    ) -> None:
        self.driver = driver
        self.plugin_type = plugin_type
        self.services = services
        self.reg_path = kubelet_root / "plugins_registry" / f"{driver}-reg.sock"
        self.dra_path = kubelet_root / "plugins" / driver / "dra.sock"
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.statuses: list[tuple[bool, str]] = []
        self.versions: list[str] = []
        """DRA API version of each prepare call (v1 or v1beta1)."""
        self.fail_prepare: dict[str, int] = {}
        """claim name -> how many more prepare calls fail for it"""
        self._lock = threading.Lock()
        self._servers: list[grpc.Server] = []

    def start(self) -> FakeDraPlugin:
        def add_dra(server: grpc.Server) -> None:
            dra_grpc.add_DRAPluginServicer_to_server(self, server)
            dra_beta_grpc.add_DRAPluginServicer_to_server(_V1beta1(self), server)

        self._servers.append(_server(self.dra_path, add_dra))
        self._servers.append(
            _server(self.reg_path, lambda s: reg_grpc.add_RegistrationServicer_to_server(self, s))
        )
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.stop(None).wait()
        self._servers.clear()
        self.reg_path.unlink(missing_ok=True)
        self.dra_path.unlink(missing_ok=True)

    def GetInfo(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=self.plugin_type,
            name=self.driver,
            endpoint=str(self.dra_path),
            supported_versions=list(self.services),
        )

    def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: Any
    ) -> reg.RegistrationStatusResponse:
        with self._lock:
            self.statuses.append((request.plugin_registered, request.error))
        return reg.RegistrationStatusResponse()

    def NodePrepareResources(self, request: Any, context: Any, pb: Any = dra) -> Any:
        response = pb.NodePrepareResourcesResponse()
        with self._lock:
            self.calls.append(("prepare", tuple(c.name for c in request.claims)))
            self.versions.append(pb.__name__.split(".")[-2])
            for claim in request.claims:
                if self.fail_prepare.get(claim.name, 0) > 0:
                    self.fail_prepare[claim.name] -= 1
                    response.claims[claim.uid].error = "injected failure"
                    continue
                response.claims[claim.uid].devices.add(
                    request_names=[],
                    pool_name="node",
                    device_name=f"dev-{claim.name}",
                    cdi_device_ids=[f"instaslice.dev/mig={claim.uid}"],
                )
        return response

    def NodeUnprepareResources(self, request: Any, context: Any, pb: Any = dra) -> Any:
        response = pb.NodeUnprepareResourcesResponse()
        with self._lock:
            self.calls.append(("unprepare", tuple(c.name for c in request.claims)))
            for claim in request.claims:
                response.claims[claim.uid].error = ""
        return response


class _V1beta1(dra_beta_grpc.DRAPluginServicer):
    def __init__(self, plugin: FakeDraPlugin) -> None:
        self._plugin = plugin

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        return self._plugin.NodePrepareResources(request, context, pb=dra_beta)

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        return self._plugin.NodeUnprepareResources(request, context, pb=dra_beta)


class FakeDevicePlugin(dp_grpc.DevicePluginServicer):
    """Serves one extended resource from ``device-plugins/<endpoint>``."""

    def __init__(
        self,
        kubelet_root: Path,
        *,
        resource: str = "nvidia.com/mig-1g.5gb",
        devices: tuple[str, ...] = ("d0", "d1"),
        endpoint: str = "fake.sock",
        preferred: bool = False,
        pre_start: bool = False,
    ) -> None:
        self.pod_resources_socket = kubelet_root / "pod-resources" / "kubelet.sock"
        self.seen_at_pre_start: list[list[tuple[str, str, tuple[str, ...]]]] = []
        """What pod-resources said at each PreStartContainer: (pod, container, device ids)."""
        self.seen_at_allocate: list[list[tuple[str, str, tuple[str, ...]]]] = []
        """What pod-resources said at each Allocate, before answering."""
        self.allocate_gate: threading.Event | None = None
        """When set to an event: each Allocate waits for it (up to 8 s) before answering."""
        self.allocate_started = threading.Event()
        self.resource = resource
        self.directory = kubelet_root / "device-plugins"
        self.endpoint = endpoint
        self.options = dp.DevicePluginOptions(
            pre_start_required=pre_start, get_preferred_allocation_available=preferred
        )
        self.allocations: list[tuple[str, ...]] = []
        self.preferred_requests: list[tuple[tuple[str, ...], int]] = []
        self.pre_starts: list[tuple[str, ...]] = []
        self.fail_allocate = False
        self._devices = devices
        self._lists: queue.Queue[tuple[str, ...] | None] = queue.Queue()
        self._server: grpc.Server | None = None
        self._streams = 0

    @property
    def path(self) -> Path:
        return self.directory / self.endpoint

    def start(self) -> FakeDevicePlugin:
        self._lists = queue.Queue()
        self._lists.put(self._devices)
        self._server = _server(
            self.path, lambda s: dp_grpc.add_DevicePluginServicer_to_server(self, s)
        )
        return self

    def register(self) -> None:
        channel = grpc.insecure_channel(f"unix:{self.directory / 'kubelet.sock'}")
        try:
            dp_grpc.RegistrationStub(channel).Register(
                dp.RegisterRequest(
                    version="v1beta1",
                    endpoint=self.endpoint,
                    resource_name=self.resource,
                    options=self.options,
                ),
                timeout=10,
            )
        finally:
            channel.close()

    def set_devices(self, devices: tuple[str, ...]) -> None:
        self._devices = devices
        self._lists.put(devices)

    def stop(self) -> None:
        self._lists.put(None)
        if self._server is not None:
            self._server.stop(None).wait()
            self._server = None
        self.path.unlink(missing_ok=True)

    def GetDevicePluginOptions(self, request: dp.Empty, context: Any) -> dp.DevicePluginOptions:
        return self.options

    def ListAndWatch(self, request: dp.Empty, context: Any) -> Iterator[dp.ListAndWatchResponse]:
        lists = self._lists
        while context.is_active():
            try:
                devices = lists.get(timeout=0.1)
            except queue.Empty:
                continue
            if devices is None:
                return
            yield dp.ListAndWatchResponse(
                devices=[dp.Device(ID=d, health="Healthy") for d in devices]
            )

    def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: Any
    ) -> dp.PreferredAllocationResponse:
        response = dp.PreferredAllocationResponse()
        for container in request.container_requests:
            available = tuple(container.available_deviceIDs)
            self.preferred_requests.append((available, container.allocation_size))
            chosen = sorted(available, reverse=True)[: container.allocation_size]
            response.container_responses.add(deviceIDs=chosen)
        return response

    def Allocate(self, request: dp.AllocateRequest, context: Any) -> dp.AllocateResponse:
        if self.fail_allocate:
            context.abort(grpc.StatusCode.INTERNAL, "injected Allocate failure")
        self.seen_at_allocate.append(self.listed())
        self.allocate_started.set()
        if self.allocate_gate is not None:
            self.allocate_gate.wait(timeout=8)
        response = dp.AllocateResponse()
        for container in request.container_requests:
            ids = tuple(container.devices_ids)
            self.allocations.append(ids)
            response.container_responses.add(
                envs={"FAKE_DEVICES": ",".join(ids)},
                cdi_devices=[dp.CDIDevice(name=f"fake.dev/dev={i}") for i in ids],
            )
        return response

    def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: Any
    ) -> dp.PreStartContainerResponse:
        self.pre_starts.append(tuple(request.devices_ids))
        self.seen_at_pre_start.append(self.listed())
        return dp.PreStartContainerResponse()

    def listed(self) -> list[tuple[str, str, tuple[str, ...]]]:
        """The kubelet's pod-resources ``List`` now: (pod, container, device ids)."""
        channel = grpc.insecure_channel(f"unix:{self.pod_resources_socket}")
        try:
            listed = pr_grpc.PodResourcesListerStub(channel).List(
                pr.ListPodResourcesRequest(), timeout=5
            )
        finally:
            channel.close()
        return [
            (p.name, c.name, tuple(i for d in c.devices for i in d.device_ids))
            for p in listed.pod_resources
            for c in p.containers
        ]
