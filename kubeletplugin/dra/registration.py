"""The kubelet plugin-registration service (``pluginregistration.Registration``).

The kubelet's plugin watcher notices ``<registry-dir>/<driver>-reg.sock``, calls ``GetInfo`` to learn
that a DRA plugin named ``mig.instaslice.dev`` serves the DRA services on the endpoint it names, and
then reports the outcome with ``NotifyRegistrationStatus``. Like the Go helper
(``registrationserver.go``) we answer an error to a failed registration; we also keep the last status
so ``/healthz`` can show it.
"""

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import grpc

from driver.daemon.wakeable import WakeableThread
from protos.pluginregistration import api_pb2, api_pb2_grpc

logger = logging.getLogger(__name__)

DRA_PLUGIN_TYPE: Final = "DRAPlugin"
DRA_V1_SERVICE: Final = "v1.DRAPlugin"
DRA_V1BETA1_SERVICE: Final = "v1beta1.DRAPlugin"
DRA_HEALTH_SERVICE: Final = "v1alpha1.DRAResourceHealth"
SUPPORTED_SERVICES: Final = (DRA_V1_SERVICE, DRA_V1BETA1_SERVICE, DRA_HEALTH_SERVICE)
"""In the order the Go helper lists them: for DRA, ``supported_versions`` names gRPC services (the
kubelet picks the first DRAPlugin service it knows; the health service is served on the same
endpoint and named last, as the helper does when the driver implements it)."""


def registration_socket_path(registry_dir: Path, driver_name: str) -> Path:
    """``<registry-dir>/<driver>-reg.sock``, the name the kubelet's plugin watcher picks up."""
    return registry_dir / f"{driver_name}-reg.sock"


@dataclass(frozen=True, slots=True)
class RegistrationState:
    """What the kubelet last told us: ``None`` until it has called ``NotifyRegistrationStatus``."""

    registered: bool | None
    error: str


class RegistrationTracker:
    """Thread-safe holder of the last registration status, read by the health endpoint; also
    says whether the kubelet has registered the plugin at least once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = RegistrationState(registered=None, error="")
        self._registered_once = threading.Event()

    def record(self, *, registered: bool, error: str) -> None:
        with self._lock:
            self._state = RegistrationState(registered=registered, error=error)
        if registered:
            self._registered_once.set()

    def wait_registered(self, *, timeout: float) -> bool:
        """Until the kubelet has registered the plugin (True), at most ``timeout`` seconds."""
        return self._registered_once.wait(timeout)

    @property
    def state(self) -> RegistrationState:
        with self._lock:
            return self._state


class RegistrationServicer(api_pb2_grpc.RegistrationServicer):
    def __init__(
        self,
        *,
        driver_name: str,
        endpoint: Path,
        tracker: RegistrationTracker,
        supported_services: Sequence[str] = SUPPORTED_SERVICES,
    ) -> None:
        self._info = api_pb2.PluginInfo(
            type=DRA_PLUGIN_TYPE,
            name=driver_name,
            endpoint=str(endpoint),
            supported_versions=list(supported_services),
        )
        self._tracker = tracker

    def GetInfo(  # noqa: N802 - gRPC method name
        self, request: api_pb2.InfoRequest, context: grpc.ServicerContext
    ) -> api_pb2.PluginInfo:
        return self._info

    def NotifyRegistrationStatus(  # noqa: N802 - gRPC method name
        self, request: api_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> api_pb2.RegistrationStatusResponse:
        self._tracker.record(registered=request.plugin_registered, error=request.error)
        if not request.plugin_registered:
            logger.error(
                "kubelet failed to register the plugin: %s", request.error or "(no reason)"
            )
            context.abort(grpc.StatusCode.UNKNOWN, f"failed registration process: {request.error}")
        logger.info("kubelet registered plugin %s", self._info.name)
        return api_pb2.RegistrationStatusResponse()


def add_registration_service(server: grpc.Server, servicer: RegistrationServicer) -> None:
    api_pb2_grpc.add_RegistrationServicer_to_server(servicer, server)


REASON_NOT_REGISTERED: Final = "KubeletPluginNotRegistered"


class RegistrationWatchdog:
    """Says on the Node when the kubelet does not register the plugin.

    The kubelet's plugin watcher registers a plugin within a second or two of its socket appearing
    in the directory it watches. When that does not happen, the plugin serves where no kubelet
    looks — the DaemonSet's host paths are not this node's kubelet's (a kubelet with another
    ``--root-dir``: k0s, MicroK8s...) — and would otherwise look like a success while no pod can
    get a slice. ``grace_s`` after the plugin started serving, and then after each delay of
    ``delays``, ``report`` is called with what to do about it, until the kubelet registers us.
    """

    def __init__(
        self,
        *,
        tracker: RegistrationTracker,
        registration_socket: Path,
        report: Callable[[str], None],
        grace_s: float,
        delays: Iterator[float],
    ) -> None:
        self._tracker = tracker
        self._socket = registration_socket
        self._report = report
        self._grace_s = grace_s
        self._delays = delays
        self._thread = WakeableThread(self._run, name="registration-watchdog")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def message(self) -> str:
        state = self._tracker.state
        if state.registered is False:
            return f"the kubelet refused to register the plugin: {state.error or '(no reason)'}"
        return (
            f"the kubelet has not registered the plugin {self._grace_s:.0f}s after it began "
            f"serving {self._socket}: this node's kubelet does not watch "
            f"{self._socket.parent} (a kubelet with another --root-dir, e.g. k0s or MicroK8s?); "
            "set the DaemonSet's host paths and INSTASLICE_*_DIR variables to its directories "
            "(docs/deploy.md, Troubleshooting)"
        )

    def _run(self) -> None:
        delay = self._grace_s
        while True:
            self._thread.sleep(delay)
            if self._thread.stopping() or self._tracker.state.registered is True:
                return
            message = self.message()
            logger.error("%s", message)
            self._report(message)
            delay = next(self._delays)
