"""The DRA resource-health service (``v1alpha1.DRAResourceHealth``): device health for the kubelet.

The kubelet (``ResourceHealthStatus``, beta and on by default in 1.36) opens ``NodeWatchResources``
on the plugin's DRA socket right after registration and again every 5 s while the stream is down
(``pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go``); it shows what it hears in
``pod.status.containerStatuses[].allocatedResourcesStatus`` of the pods using those devices. Like
the Go helper, the plugin lists ``v1alpha1.DRAResourceHealth`` in ``supported_versions``.

Each response carries the complete list: every device of this node's pool (pool = node name, the
device names published in the ResourceSlices) with ``HEALTHY`` or ``UNHEALTHY`` (the message says
why), or ``UNKNOWN`` while the GPUs cannot be read or were not checked for too long. The full state
is sent on connect, on every change, and every ``resend_seconds`` besides: the kubelet marks a
device Unknown when it heard nothing of it for ``health_check_timeout_seconds`` (its default is
30 s), counted from when it *received* the last update.

Many watchers may stream at once (each holds a server thread, so their number is capped and a
watcher beyond the cap is refused with ``RESOURCE_EXHAUSTED``); a client that goes away ends its
stream at once; ``close()`` ends every stream cleanly (the kubelet sees EOF and reconnects).
"""

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

import grpc

from kubeletplugin.node.inventory import NodeInventory
from protos.drahealth.v1alpha1 import api_pb2 as health_pb2
from protos.drahealth.v1alpha1 import api_pb2_grpc as health_grpc

logger = logging.getLogger(__name__)

MAX_MESSAGE_CHARS: Final = 1024
DEFAULT_RESEND_SECONDS: Final = 10.0
DEFAULT_TIMEOUT_SECONDS: Final = 45
DEFAULT_MAX_WATCHERS: Final = 4

HEALTHY: Final = health_pb2.HEALTHY
UNHEALTHY: Final = health_pb2.UNHEALTHY
UNKNOWN: Final = health_pb2.UNKNOWN


@dataclass(frozen=True, slots=True)
class DeviceHealthState:
    health: "health_pb2.HealthStatus.ValueType"
    message: str
    since: float
    """Unix seconds when the device got this health and message."""


class DeviceHealthBoard:
    """The health of every device of the pool, fed by the publisher's inventory reads."""

    def __init__(
        self,
        *,
        pool: str,
        stale_after_seconds: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.pool = pool
        self._stale_after = stale_after_seconds
        self._clock = clock
        self._cond = threading.Condition()
        self._devices: dict[str, DeviceHealthState] = {}
        self._checked_at: float | None = None
        self._version = 0
        self._closed = False

    # -- fed by the publisher (InventoryListener) ------------------------------------------------

    def inventory_read(self, inventory: NodeInventory) -> None:
        now = self._clock()
        healthy = {gpu.index for gpu in inventory.gpus}
        unhealthy = {gpu.index: gpu for gpu in inventory.unhealthy_gpus}
        states: dict[str, tuple[health_pb2.HealthStatus.ValueType, str]] = {}
        for name, device in inventory.devices.items():
            if device.gpu_index in unhealthy:
                gpu = unhealthy[device.gpu_index]
                why = gpu.health_reason or "no reason given"
                states[name] = (UNHEALTHY, f"GPU {gpu.index} ({gpu.uuid}) is unhealthy: {why}")
            elif device.gpu_index in healthy:
                states[name] = (HEALTHY, "")
            else:
                states[name] = (UNKNOWN, f"GPU {device.gpu_index} is not published")
        with self._cond:
            self._checked_at = now
            self._set(states, now)

    def inventory_failed(self, reason: str) -> None:
        now = self._clock()
        with self._cond:
            self._set(dict.fromkeys(self._devices, (UNKNOWN, reason)), now)

    # -- read by the streams -------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    def snapshot(self) -> tuple[int, Mapping[str, DeviceHealthState]]:
        """(version, device → state); a device not checked for ``stale_after_seconds`` is
        Unknown."""
        now = self._clock()
        with self._cond:
            version, devices, checked = self._version, dict(self._devices), self._checked_at
        if checked is not None and now - checked > self._stale_after:
            message = f"GPU health not checked for {int(now - checked)} s"
            devices = {
                name: DeviceHealthState(health=UNKNOWN, message=message, since=checked)
                for name in devices
            }
        return version, MappingProxyType(devices)

    def wait_for_change(self, version: int, *, timeout_seconds: float) -> None:
        """Return when the version moved past ``version``, on ``wake``/``close``, or on timeout."""
        with self._cond:
            if self._version == version and not self._closed:
                self._cond.wait(timeout_seconds)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def reopen(self) -> None:
        """Serve streams again after ``close`` (a plugin started again)."""
        with self._cond:
            self._closed = False

    def close(self) -> None:
        """End every stream (they return after their current send)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _set(
        self, states: Mapping[str, tuple["health_pb2.HealthStatus.ValueType", str]], now: float
    ) -> None:
        changed = states.keys() != self._devices.keys()
        devices: dict[str, DeviceHealthState] = {}
        for name, (health, message) in states.items():
            old = self._devices.get(name)
            if old is not None and (old.health, old.message) == (health, message):
                devices[name] = old
            else:
                devices[name] = DeviceHealthState(health=health, message=message, since=now)
                changed = True
        self._devices = devices
        if changed:
            self._version += 1
            self._cond.notify_all()


class DraHealthServicer(health_grpc.DRAResourceHealthServicer):
    def __init__(
        self,
        board: DeviceHealthBoard,
        *,
        resend_seconds: float = DEFAULT_RESEND_SECONDS,
        timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS,
        max_watchers: int = DEFAULT_MAX_WATCHERS,
    ) -> None:
        self._board = board
        self._resend = resend_seconds
        self._timeout = timeout_seconds
        self._max_watchers = max_watchers
        self._lock = threading.Lock()
        self._watchers = 0

    @property
    def watchers(self) -> int:
        with self._lock:
            return self._watchers

    def NodeWatchResources(  # noqa: N802 - gRPC method name
        self, request: health_pb2.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[health_pb2.NodeWatchResourcesResponse]:
        with self._lock:
            full = self._watchers >= self._max_watchers
            if not full:
                self._watchers += 1
        if full:
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"at most {self._max_watchers} health watchers at once",
            )
        context.add_callback(self._board.wake)
        try:
            yield from self._stream(context)
        finally:
            with self._lock:
                self._watchers -= 1

    def _stream(
        self, context: grpc.ServicerContext
    ) -> Iterator[health_pb2.NodeWatchResourcesResponse]:
        board = self._board
        logger.info("kubelet health watcher connected")
        while context.is_active() and not board.closed:
            version, devices = board.snapshot()
            yield self._response(devices)
            board.wait_for_change(version, timeout_seconds=self._resend)
        logger.info("kubelet health watcher done")

    def _response(
        self, devices: Mapping[str, DeviceHealthState]
    ) -> health_pb2.NodeWatchResourcesResponse:
        return health_pb2.NodeWatchResourcesResponse(
            devices=[
                health_pb2.DeviceHealth(
                    device=health_pb2.DeviceIdentifier(
                        pool_name=self._board.pool, device_name=name
                    ),
                    health=state.health,
                    last_updated_time=int(state.since),
                    health_check_timeout_seconds=self._timeout,
                    message=_truncate(state.message),
                )
                for name, state in sorted(devices.items())
            ]
        )


def _truncate(message: str) -> str:
    """At most 1024 characters, as the kubelet would cut it (1021 + ``...``)."""
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[: MAX_MESSAGE_CHARS - 3] + "..."


def add_health_service(server: grpc.Server, servicer: DraHealthServicer) -> None:
    health_grpc.add_DRAResourceHealthServicer_to_server(servicer, server)
