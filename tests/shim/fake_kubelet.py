"""A kubelet's device manager and pod-resources service, as far as the shim meets them.

What it does like the real kubelet (1.36 ``pkg/kubelet/cm/devicemanager``, ``apis/podresources``):

- on start, removes the sockets in its device-plugin directory (ours too) and serves
  ``v1beta1.Registration`` on ``kubelet.sock``; ``Register`` checks the version, dials the plugin's
  endpoint, reads its options and keeps a ``ListAndWatch`` stream whose latest list is the resource's
  devices;
- admits a pod: the pod is listed by pod-resources from the start of its admission; per container
  and resource, it picks free healthy ids (asking ``GetPreferredAllocation`` when offered), calls
  ``Allocate`` with one container request, and records the ids only once the answer is back; a
  failed ``Allocate`` fails the admission and the pod is no longer listed;
- calls ``PreStartContainer`` for containers with devices when the plugin asks for it;
- frees the ids of pods it no longer runs; serves ``v1.PodResourcesLister/List`` on its own socket.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from protos.deviceplugin.v1beta1 import api_pb2 as dp
from protos.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from protos.podresources.v1 import api_pb2 as pr
from protos.podresources.v1 import api_pb2_grpc as pr_grpc


class AdmissionError(Exception):
    """The pod was refused (``UnexpectedAdmissionError`` on a real node)."""


@dataclass(frozen=True)
class FakePod:
    namespace: str
    name: str
    uid: str
    containers: tuple[tuple[str, Mapping[str, int]], ...]
    """(container name, {resource: count}) in spec order."""


@dataclass
class Plugin:
    resource: str
    endpoint: str
    channel: grpc.Channel
    stub: dp_grpc.DevicePluginStub
    options: dp.DevicePluginOptions
    devices: list[str] = field(default_factory=list)
    stream: Any = None
    """The open ``ListAndWatch`` call (an iterator that can be cancelled)."""
    thread: threading.Thread | None = None


@dataclass(frozen=True)
class Admitted:
    """What each container of an admitted pod got: ids and the plugin's answer."""

    ids: dict[tuple[str, str], tuple[str, ...]]
    """(container, resource) → device ids."""
    answers: dict[tuple[str, str], dp.ContainerAllocateResponse]


class _Registration(dp_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    def Register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:
        if request.version != "v1beta1":
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version}"
            )
        if "/" in request.endpoint or not request.resource_name:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad endpoint or resource name")
        self._kubelet.connect(request)
        return dp.Empty()


class _PodResources(pr_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    def List(
        self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr.ListPodResourcesResponse:
        if not self._kubelet.pod_resources_up:
            context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet is restarting")
        return self._kubelet.list_pod_resources()

    def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pr.AllocatableResourcesResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not emulated")

    def Get(
        self, request: pr.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr.GetPodResourcesResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not emulated")


class FakeKubelet:
    def __init__(self, *, device_plugin_dir: Path, pod_resources_socket: Path) -> None:
        self.dir = device_plugin_dir
        self.socket = device_plugin_dir / "kubelet.sock"
        self.pod_resources_socket = pod_resources_socket
        self.plugins: dict[str, Plugin] = {}
        self.registrations: list[str] = []
        self.pod_resources_up = True
        self.use_preferred = True
        self._pods: dict[str, FakePod] = {}
        self._ids: dict[str, dict[tuple[str, str], tuple[str, ...]]] = {}
        self._lock = threading.Condition()
        self._server: grpc.Server | None = None
        self._pr_server: grpc.Server | None = None

    # -- life cycle -------------------------------------------------------------------------

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for path in self.dir.iterdir():
            if path.is_socket():
                path.unlink()
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        dp_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix:{self.socket}")
        server.start()
        self._server = server
        if self._pr_server is None:
            pr_server = grpc.server(ThreadPoolExecutor(max_workers=2))
            pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), pr_server)
            pr_server.add_insecure_port(f"unix:{self.pod_resources_socket}")
            pr_server.start()
            self._pr_server = pr_server

    def stop(self) -> None:
        """The kubelet process ends: its socket and plugin connections go away."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(None).wait()
        self.socket.unlink(missing_ok=True)
        with self._lock:
            plugins = list(self.plugins.values())
            self.plugins.clear()
        for plugin in plugins:
            _disconnect(plugin)

    def close(self) -> None:
        self.stop()
        pr_server, self._pr_server = self._pr_server, None
        if pr_server is not None:
            pr_server.stop(None).wait()
        self.pod_resources_socket.unlink(missing_ok=True)

    def restart(self) -> None:
        """Stop and start again: sockets removed, ``kubelet.sock`` recreated, pods kept (the real
        kubelet restores them from its checkpoint)."""
        self.stop()
        self.start()

    # -- device plugins ---------------------------------------------------------------------

    def connect(self, request: dp.RegisterRequest) -> None:
        channel = grpc.insecure_channel(f"unix://{self.dir / request.endpoint}")
        stub = dp_grpc.DevicePluginStub(channel)
        options = stub.GetDevicePluginOptions(dp.Empty(), timeout=5)
        plugin = Plugin(
            resource=request.resource_name,
            endpoint=request.endpoint,
            channel=channel,
            stub=stub,
            options=options,
        )
        plugin.stream = stub.ListAndWatch(dp.Empty())
        plugin.thread = threading.Thread(target=self._watch, args=(plugin,), daemon=True)
        with self._lock:
            old = self.plugins.get(request.resource_name)
            self.plugins[request.resource_name] = plugin
            self.registrations.append(request.resource_name)
        if old is not None:
            _disconnect(old)
        plugin.thread.start()

    def _watch(self, plugin: Plugin) -> None:
        assert plugin.stream is not None
        try:
            for response in plugin.stream:
                with self._lock:
                    plugin.devices = [d.ID for d in response.devices if d.health == "Healthy"]
                    self._lock.notify_all()
        except grpc.RpcError:
            pass
        with self._lock:
            if self.plugins.get(plugin.resource) is plugin:
                plugin.devices = []
            self._lock.notify_all()

    def wait_devices(self, resource: str, count: int, timeout: float = 10.0) -> list[str]:
        with self._lock:
            ok = self._lock.wait_for(
                lambda: resource in self.plugins and len(self.plugins[resource].devices) == count,
                timeout=timeout,
            )
            assert ok, f"{resource}: {self.plugins.get(resource)}"
            return list(self.plugins[resource].devices)

    def wait_registered(self, resources: Sequence[str], timeout: float = 10.0) -> None:
        with self._lock:
            ok = self._lock.wait_for(
                lambda: all(r in self.plugins and self.plugins[r].devices for r in resources),
                timeout=timeout,
            )
            assert ok, sorted(self.plugins)

    # -- pods -------------------------------------------------------------------------------

    def add_pod(self, pod: FakePod) -> None:
        """The pod is known to the kubelet (listed by pod-resources), not admitted yet."""
        with self._lock:
            self._pods.setdefault(pod.uid, pod)
            self._ids.setdefault(pod.uid, {})

    def admit(
        self, pod: FakePod, *, ids: Mapping[tuple[str, str], Sequence[str]] | None = None
    ) -> Admitted:
        """Admit the pod as the device manager does; ``ids`` forces the ids of some requests."""
        self.add_pod(pod)
        answers: dict[tuple[str, str], dp.ContainerAllocateResponse] = {}
        for container, asked in pod.containers:
            for resource, count in asked.items():
                chosen = list((ids or {}).get((container, resource)) or self._pick(resource, count))
                plugin = self.plugins[resource]
                try:
                    response = plugin.stub.Allocate(
                        dp.AllocateRequest(
                            container_requests=[dp.ContainerAllocateRequest(devices_ids=chosen)]
                        ),
                        timeout=30,
                    )
                except grpc.RpcError as exc:
                    self.remove_pod(pod)
                    raise AdmissionError(f"Allocate failed due to {exc.details()}") from exc
                with self._lock:
                    self._ids[pod.uid][(container, resource)] = tuple(chosen)
                answers[(container, resource)] = response.container_responses[0]
        for container, asked in pod.containers:
            for resource in asked:
                plugin = self.plugins[resource]
                if plugin.options.pre_start_required:
                    plugin.stub.PreStartContainer(
                        dp.PreStartContainerRequest(
                            devices_ids=list(self._ids[pod.uid][(container, resource)])
                        ),
                        timeout=30,
                    )
        return Admitted(ids=dict(self._ids[pod.uid]), answers=answers)

    def hold(self, pod: FakePod, ids: Mapping[tuple[str, str], Sequence[str]]) -> None:
        """The pod runs here holding ``ids`` ((container, resource) → ids) without an ``Allocate``
        now — as a kubelet restored from its checkpoint."""
        with self._lock:
            self._pods.setdefault(pod.uid, pod)
            self._ids.setdefault(pod.uid, {}).update({k: tuple(v) for k, v in ids.items()})

    def remove_pod(self, pod: FakePod) -> None:
        """The pod is no longer running here: not listed, its ids free."""
        with self._lock:
            self._pods.pop(pod.uid, None)
            self._ids.pop(pod.uid, None)

    def _pick(self, resource: str, count: int) -> list[str]:
        plugin = self.plugins[resource]
        with self._lock:
            taken = {
                i
                for held in self._ids.values()
                for (_, r), ids in held.items()
                if r == resource
                for i in ids
            }
            free = [d for d in plugin.devices if d not in taken]
        if len(free) < count:
            raise AdmissionError(f"OutOf{resource}: {len(free)} free, {count} asked")
        if plugin.options.get_preferred_allocation_available and self.use_preferred:
            response = plugin.stub.GetPreferredAllocation(
                dp.PreferredAllocationRequest(
                    container_requests=[
                        dp.ContainerPreferredAllocationRequest(
                            available_deviceIDs=free, allocation_size=count
                        )
                    ]
                ),
                timeout=5,
            )
            preferred = list(response.container_responses[0].deviceIDs)
            assert len(preferred) == count, preferred
            assert set(preferred) <= set(free), preferred
            return preferred
        return free[:count]

    def list_pod_resources(self) -> pr.ListPodResourcesResponse:
        with self._lock:
            pods = list(self._pods.values())
            held = {uid: dict(ids) for uid, ids in self._ids.items()}
        return pr.ListPodResourcesResponse(
            pod_resources=[
                pr.PodResources(
                    name=pod.name,
                    namespace=pod.namespace,
                    containers=[
                        pr.ContainerResources(
                            name=container,
                            devices=[
                                pr.ContainerDevices(resource_name=resource, device_ids=list(ids))
                                for (name, resource), ids in sorted(held[pod.uid].items())
                                if name == container
                            ],
                        )
                        for container, _ in pod.containers
                    ],
                )
                for pod in pods
            ]
        )


def _disconnect(plugin: Plugin) -> None:
    if plugin.stream is not None:
        plugin.stream.cancel()
    if plugin.thread is not None:
        plugin.thread.join(timeout=10)
    plugin.channel.close()
