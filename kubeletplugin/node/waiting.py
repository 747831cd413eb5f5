"""Waiting, with back-off and a Node event, for what the plugin cannot serve without.

A node the plugin cannot serve yet is no reason to exit: the kubelet would restart the container in
a crash loop and the reason would scroll away in old logs. The plugin stays up instead, says why on
its Node (a Warning event, ``kubectl describe node``; ``make deploy`` prints it), tries again after
10 s, 20 s, 40 s ... up to 5 minutes, answers ``/healthz`` (alive: no restart) but not ``/readyz``
(the DaemonSet's rollout does not count the node as served), and stops at once on SIGTERM.

What it waits for here: the GPU backend — NVML that cannot be loaded means no NVIDIA driver on the
node, or a container that was not given the library (RuntimeClass ``nvidia``). A backend that can
never start (``ConfigError``: emulated GPUs the catalog does not know, a state file that is not
one) is not waited for: the error ends the plugin at start (``driver.daemon.run``). The kubelet's
registration is watched once the plugin serves (``kubeletplugin.dra.registration``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Final

from driver.daemon.flags import split_address
from driver.daemon.http import HttpEndpoint
from driver.errors import ConfigError, DriverError
from driver.gpu.backend import MigModeBackend
from kubeletplugin.node.setup import build_backend
from kubeletplugin.settings import Settings

logger = logging.getLogger(__name__)

BACKOFF_INITIAL_S: Final = 10.0
BACKOFF_MAX_S: Final = 300.0
REASON_GPU_BACKEND_UNAVAILABLE: Final = "GpuBackendUnavailable"
NVML_HINT: Final = (
    "is the NVIDIA driver installed on this node, and does the plugin's pod get libnvidia-ml.so "
    "(RuntimeClass nvidia of the NVIDIA GPU Operator or container toolkit)? The gpu overlay runs "
    "the plugin on nodes labelled nvidia.com/mig.capable=true only: check that label"
)


def backoff(
    initial_s: float = BACKOFF_INITIAL_S, maximum_s: float = BACKOFF_MAX_S
) -> Iterator[float]:
    """``initial_s``, doubled each time, at most ``maximum_s``."""
    delay = initial_s
    while True:
        yield delay
        delay = min(delay * 2, maximum_s)


def waiting_routes(reason: Callable[[], str]) -> dict[str, Callable[[], tuple[int, str, bytes]]]:
    """``/healthz`` alive (a restart would not help), ``/readyz`` not ready, both saying why."""

    def healthz() -> tuple[int, str, bytes]:
        return 200, "text/plain", f"waiting: {reason()}\n".encode()

    def readyz() -> tuple[int, str, bytes]:
        return 503, "text/plain", f"not ready: {reason()}\n".encode()

    return {"/healthz": healthz, "/readyz": readyz}


class BackendWait:
    """Builds the GPU backend the flags name, retrying with back-off while it cannot; ``report``
    gets each failure's explanation (``__main__`` posts it on the Node)."""

    def __init__(
        self,
        *,
        settings: Settings,
        report: Callable[[str], None],
        stop: threading.Event,
        build: Callable[[Settings], MigModeBackend] = build_backend,
        delays: Iterator[float] | None = None,
    ) -> None:
        self._settings = settings
        self._report = report
        self._stop = stop
        self._build = build
        self._delays = delays or backoff()
        self._reason = ""
        self._endpoint: HttpEndpoint | None = None

    def run(self) -> MigModeBackend | None:
        """The backend, or None when stopped (SIGTERM) before it could be built; a
        ``ConfigError`` is raised at once."""
        try:
            while True:
                try:
                    return self._build(self._settings)
                except ConfigError:
                    raise
                except DriverError as exc:
                    self._reason = self._explain(exc)
                delay = next(self._delays)
                logger.error("%s; trying again in %.0fs", self._reason, delay)
                self._report(self._reason)
                self._serve_probes()
                if self._stop.wait(delay):
                    return None
        finally:
            if self._endpoint is not None:
                self._endpoint.stop()

    def _explain(self, exc: DriverError) -> str:
        backend = self._settings.gpu_backend
        hint = f": {NVML_HINT}" if backend == "nvml" else ""
        return f"cannot start the {backend} GPU backend ({exc}){hint}"

    def _serve_probes(self) -> None:
        address = self._settings.daemon.healthz_address
        if self._endpoint is not None or not address:
            return
        endpoint = HttpEndpoint(
            address=split_address(address),
            routes=waiting_routes(lambda: self._reason),
            name="http /healthz+/readyz (waiting)",
        )
        try:
            endpoint.start()
        except OSError as exc:
            logger.warning("cannot serve the probes while waiting: %s", exc)
            return
        self._endpoint = endpoint
