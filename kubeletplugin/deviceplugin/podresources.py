"""Which pod and container hold which device-plugin ids, as the kubelet's pod-resources API says.

The device-plugin ``Allocate`` call never names the pod it is for. The kubelet's pod-resources
service (``v1.PodResourcesLister/List`` on ``/var/lib/kubelet/pod-resources/kubelet.sock``) lists
every active pod it runs — also one being admitted right now, with no devices yet — with, per
container, the device ids it holds per resource. Pods are named by namespace and name only (no UID).

``Holdings`` is that answer reduced to what the shim needs; ``PodResourcesClient`` fetches it. A
failed ``List`` (kubelet restarting, socket missing) raises ``PodResourcesError``: callers then
decide nothing that depends on it — in particular nothing is released on an unknown answer.
"""

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Final, Protocol

import grpc

from driver.errors import DriverError
from protos.podresources.v1 import api_pb2, api_pb2_grpc

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
"""The kubelet's own pod-resources clients allow 16 MiB answers (many pods, many CPU ids)."""


class PodResourcesError(DriverError):
    """The kubelet's pod-resources API could not be asked."""

    retryable = True


@dataclass(frozen=True, slots=True, order=True)
class ContainerKey:
    """One container of one pod, as the kubelet names it."""

    namespace: str
    pod: str
    container: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}[{self.container}]"


@dataclass(frozen=True, slots=True)
class Holdings:
    """The kubelet's view: listed containers (in spec order per pod) and device-id holders."""

    containers: tuple[ContainerKey, ...] = ()
    holders: Mapping[tuple[str, str], ContainerKey] = field(
        default_factory=lambda: MappingProxyType({})
    )
    """(resource name, device id) → the container holding it."""

    def holder(self, resource: str, device_id: str) -> ContainerKey | None:
        return self.holders.get((resource, device_id))

    def holders_of(self, resource: str, device_ids: Iterable[str]) -> set[ContainerKey]:
        """Every container holding one of ``device_ids`` of ``resource``."""
        return {h for i in device_ids if (h := self.holder(resource, i)) is not None}

    def position(self, key: ContainerKey) -> int | None:
        """Index of the container in the list (pods in kubelet order, containers in spec order)."""
        try:
            return self.containers.index(key)
        except ValueError:
            return None

    def holds(self, key: ContainerKey, resource: str) -> bool:
        """True if the container already holds devices of ``resource``."""
        return any(h == key and r == resource for (r, _), h in self.holders.items())


def holdings_from_response(
    response: api_pb2.ListPodResourcesResponse, *, resources: Iterable[str] | None = None
) -> Holdings:
    """``Holdings`` of a ``List`` answer, keeping only ``resources`` (all when None)."""
    wanted = None if resources is None else set(resources)
    containers: list[ContainerKey] = []
    holders: dict[tuple[str, str], ContainerKey] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            key = ContainerKey(namespace=pod.namespace, pod=pod.name, container=container.name)
            containers.append(key)
            for devices in container.devices:
                if wanted is not None and devices.resource_name not in wanted:
                    continue
                for device_id in devices.device_ids:
                    holders[(devices.resource_name, device_id)] = key
    return Holdings(containers=tuple(containers), holders=MappingProxyType(holders))


class PodResourcesSource(Protocol):
    """Where the shim learns the kubelet's holdings (the client below, or a test's fake)."""

    def list_holdings(self, resources: Sequence[str] | None) -> Holdings:
        """Holdings of ``resources`` (all when None); raises ``PodResourcesError`` when the
        kubelet cannot be asked."""
        ...

    def close(self) -> None: ...


class PodResourcesClient:
    """``List`` over the kubelet's pod-resources unix socket; one channel, reconnecting by itself."""

    def __init__(self, socket: Path, *, timeout_seconds: float = 5.0) -> None:
        self._socket = socket
        self._timeout = timeout_seconds
        self._channel = grpc.insecure_channel(
            f"unix://{socket}",
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
        )
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)

    def list_holdings(self, resources: Sequence[str] | None) -> Holdings:
        if not self._socket.exists():
            raise PodResourcesError(f"the kubelet's pod-resources socket {self._socket} is missing")
        try:
            response = self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=self._timeout)
        except grpc.RpcError as exc:
            raise PodResourcesError(
                f"pod-resources List on {self._socket} failed: {describe_rpc_error(exc)}"
            ) from exc
        return holdings_from_response(response, resources=resources)

    def close(self) -> None:
        self._channel.close()


def describe_rpc_error(exc: grpc.RpcError) -> str:
    """``CODE: details`` of a failed call (``RpcError`` itself carries neither by type)."""
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    name = getattr(code(), "name", "error") if callable(code) else "error"
    return f"{name}: {details() if callable(details) else exc}"
