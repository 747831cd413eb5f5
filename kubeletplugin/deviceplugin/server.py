"""One device-plugin gRPC server per classic resource, and its registration with the kubelet.

Per resource (``resources.ResourceSpec``): a ``v1beta1.DevicePlugin`` service on
``<device-plugin dir>/instaslice-<profile>.sock``, registered on the kubelet's
``<device-plugin dir>/kubelet.sock`` (``v1beta1.Registration/Register``: version ``v1beta1``, the
socket's file name as ``endpoint``, the resource name, and the options below). The kubelet then
dials the socket, reads the options and keeps a ``ListAndWatch`` stream open.

Options: ``get_preferred_allocation_available`` — the kubelet asks which free ids to use, and we
steer it away from ids still recorded for a claim not released yet; ``pre_start_required`` — the
kubelet calls ``PreStartContainer`` just before a container starts, after it has recorded the
container's ids, which is when the reconciler can see the holder; the call itself never fails.

``Allocate`` refuses ids this resource does not advertise (``INVALID_ARGUMENT``) and anything the
allocator cannot serve (``FAILED_PRECONDITION`` with the allocator's message, which the kubelet
puts on the pod as ``UnexpectedAdmissionError``).
"""

import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import grpc

from driver.errors import DriverError
from kubeletplugin.deviceplugin.advertise import unknown_ids
from kubeletplugin.deviceplugin.allocate import AllocateError, Allocator
from kubeletplugin.deviceplugin.podresources import describe_rpc_error
from kubeletplugin.deviceplugin.resources import ResourceSpec
from kubeletplugin.sockets import UnixGrpcServer
from protos.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

logger = logging.getLogger(__name__)

API_VERSION: Final = "v1beta1"
KUBELET_SOCKET_NAME: Final = "kubelet.sock"
HEALTHY: Final = "Healthy"
STREAM_POLL_SECONDS: Final = 0.5
"""How often a ``ListAndWatch`` stream notices that its client or our server went away."""


class RegistrationError(DriverError):
    """The kubelet did not accept (or could not be reached for) a registration."""

    retryable = True


class DeviceFeed:
    """The device ids a resource advertises now; ``ListAndWatch`` streams wait on changes."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._ids: tuple[str, ...] = ()
        self._version = 0
        self._wakeups = 0

    def set(self, ids: tuple[str, ...]) -> None:
        with self._changed:
            if ids != self._ids:
                self._ids = ids
                self._version += 1
                self._changed.notify_all()

    def snapshot(self) -> tuple[int, tuple[str, ...]]:
        with self._changed:
            return self._version, self._ids

    def wait(self, version: int, timeout: float) -> tuple[int, tuple[str, ...]]:
        """The newest (version, ids), after waiting up to ``timeout`` for a version past
        ``version`` (or a ``wake``)."""
        with self._changed:
            wakeups = self._wakeups
            self._changed.wait_for(
                lambda: self._version != version or self._wakeups != wakeups, timeout=timeout
            )
            return self._version, self._ids

    def wake(self) -> None:
        """End every current ``wait`` early (streams closing)."""
        with self._changed:
            self._wakeups += 1
            self._changed.notify_all()


def _device_list(ids: tuple[str, ...]) -> api_pb2.ListAndWatchResponse:
    return api_pb2.ListAndWatchResponse(
        devices=[api_pb2.Device(ID=device_id, health=HEALTHY) for device_id in ids]
    )


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """The ``DevicePlugin`` service of one resource."""

    def __init__(
        self,
        *,
        spec: ResourceSpec,
        feed: DeviceFeed,
        allocator: Allocator,
        on_pre_start: Callable[[], None],
    ) -> None:
        self._spec = spec
        self._feed = feed
        self._allocator = allocator
        self._on_pre_start = on_pre_start
        self._closed = threading.Event()

    def close(self) -> None:
        """End open ``ListAndWatch`` streams (before the server stops)."""
        self._closed.set()
        self._feed.wake()

    def reopen(self) -> None:
        """Serve streams again (the server is restarted on a new socket)."""
        self._closed.clear()

    @staticmethod
    def options() -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(
            pre_start_required=True, get_preferred_allocation_available=True
        )

    def GetDevicePluginOptions(  # noqa: N802 - gRPC method name
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return self.options()

    def ListAndWatch(  # noqa: N802 - gRPC method name
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.ListAndWatchResponse]:
        version, ids = self._feed.snapshot()
        logger.info("kubelet watches %s: %d devices", self._spec.resource_name, len(ids))
        yield _device_list(ids)
        while context.is_active() and not self._closed.is_set():
            newest, ids = self._feed.wait(version, STREAM_POLL_SECONDS)
            if newest != version and not self._closed.is_set():
                version = newest
                logger.info("%s now advertises %d devices", self._spec.resource_name, len(ids))
                yield _device_list(ids)

    def GetPreferredAllocation(  # noqa: N802 - gRPC method name
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        return api_pb2.PreferredAllocationResponse(
            container_responses=[
                api_pb2.ContainerPreferredAllocationResponse(
                    deviceIDs=self._allocator.preferred(
                        self._spec,
                        available=list(r.available_deviceIDs),
                        must_include=list(r.must_include_deviceIDs),
                        size=r.allocation_size,
                    )
                )
                for r in request.container_requests
            ]
        )

    def Allocate(  # noqa: N802 - gRPC method name
        self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocateResponse:
        _, advertised = self._feed.snapshot()
        responses = []
        for container in request.container_requests:
            ids = list(container.devices_ids)
            unknown = unknown_ids(self._spec, len(advertised), ids)
            if unknown:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{self._spec.resource_name}: device ids {', '.join(unknown)} are not "
                    "advertised by this plugin",
                )
            try:
                answer = self._allocator.allocate(self._spec, ids)
            except AllocateError as exc:
                logger.warning("Allocate of %s refused: %s", self._spec.resource_name, exc)
                refused = grpc.StatusCode.FAILED_PRECONDITION
                context.abort(grpc.StatusCode.UNAVAILABLE if exc.retryable else refused, str(exc))
            except DriverError as exc:
                logger.warning("Allocate of %s failed: %s", self._spec.resource_name, exc)
                context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            except Exception as exc:
                logger.exception("Allocate of %s failed unexpectedly", self._spec.resource_name)
                context.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc}")
            responses.append(
                api_pb2.ContainerAllocateResponse(
                    envs=dict(answer.envs),
                    cdi_devices=[api_pb2.CDIDevice(name=name) for name in answer.cdi_devices],
                )
            )
        return api_pb2.AllocateResponse(container_responses=responses)

    def PreStartContainer(  # noqa: N802 - gRPC method name
        self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        self._on_pre_start()
        return api_pb2.PreStartContainerResponse()


class ResourceServer:
    """The socket of one resource; restartable (the kubelet deletes plugin sockets on start)."""

    def __init__(
        self, *, spec: ResourceSpec, directory: Path, service: DevicePluginService
    ) -> None:
        self.spec = spec
        self.service = service
        self.path = directory / spec.socket_name
        self._server: UnixGrpcServer | None = None

    @property
    def running(self) -> bool:
        return self._server is not None

    def socket_present(self) -> bool:
        return self.path.is_socket()

    def start(self) -> None:
        server = UnixGrpcServer(
            path=self.path,
            register=lambda s: api_pb2_grpc.add_DevicePluginServicer_to_server(self.service, s),
            max_workers=4,
            name=f"deviceplugin-{self.spec.device_id_prefix.rstrip('-')}",
        )
        server.start()
        self._server = server

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            self.service.close()
            server.stop(grace_seconds=1.0)
            self.service.reopen()

    def register(self, kubelet_socket: Path, *, timeout_seconds: float) -> None:
        """``Register`` this resource with the kubelet; ``RegistrationError`` if refused."""
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=self.spec.socket_name,
            resource_name=self.spec.resource_name,
            options=self.service.options(),
        )
        try:
            with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
                api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=timeout_seconds)
        except grpc.RpcError as exc:
            raise RegistrationError(
                f"registering {self.spec.resource_name} on {kubelet_socket} failed: "
                f"{describe_rpc_error(exc)}"
            ) from exc
        logger.info(
            "registered %s with the kubelet (endpoint %s)",
            self.spec.resource_name,
            self.spec.socket_name,
        )
