"""The controller's side of the webhook process: start it, watch it, restart it, stop it.

The child runs ``python -m controller.webhook.process`` with the controller's own arguments (the
environment, and with it every ``INSTASLICE_*`` variable, is inherited), minus the health endpoint,
which stays the controller's, and with its ``/metrics`` on a loopback port it announces
(``METRICS_LINE``): ``scrape`` reads them there for the controller's ``/metrics``, so one scrape
target shows both processes. It reports ``READY_LINE`` on its stdout once it serves; ``ready`` is
true from then until it exits. A child that exits while the controller runs is started again
after a back-off (0.5 s, doubling up to 30 s; reset after a child lived a minute), and the
controller's readiness probe reports the gap. The child ends with the controller, even one killed
with ``SIGKILL`` (``driver.daemon.lifeline``).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Final

from controller.webhook.process import METRICS_LINE, PARENT_PID_ENV, READY_LINE
from driver.daemon.http import scrape_loopback

logger = logging.getLogger(__name__)

MODULE: Final = "controller.webhook.process"
STOP_TIMEOUT_S: Final = 10.0
INITIAL_BACKOFF_S: Final = 0.5
MAX_BACKOFF_S: Final = 30.0
HEALTHY_AFTER_S: Final = 60.0
SCRAPE_TIMEOUT_S: Final = 2.0


class WebhookChild:
    def __init__(self, *, argv: Sequence[str], stop: threading.Event) -> None:
        self._argv = [
            sys.executable, "-m", MODULE, *argv,
            "--metrics-address", "127.0.0.1:0", "--healthz-address", "",
        ]  # fmt: skip
        self._stop = stop
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self._metrics_port: int | None = None
        self._thread: threading.Thread | None = None
        self.starts = 0
        """How many times the child was started (restarts included)."""

    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def pid(self) -> int | None:
        with self._lock:
            return self._process.pid if self._process is not None else None

    def scrape(self) -> bytes:
        """The running child's metrics (Prometheus text); empty while there is no child serving
        them, or if it does not answer in time (a scrape of the controller must not fail for it)."""
        with self._lock:
            port = self._metrics_port
        return b"" if port is None else scrape_loopback(port, timeout=SCRAPE_TIMEOUT_S)

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("webhook process already started")
        self._thread = threading.Thread(target=self._supervise, name="webhook-child", daemon=True)
        self._thread.start()

    def _supervise(self) -> None:
        # The child is started from this thread and asks for SIGTERM when its parent thread ends:
        # this thread outlives it on purpose (it returns only after the child has exited).
        backoff = INITIAL_BACKOFF_S
        while not self._stop.is_set():
            started = time.monotonic()
            status = self._run_once()
            if self._stop.is_set():
                return
            if time.monotonic() - started >= HEALTHY_AFTER_S:
                backoff = INITIAL_BACKOFF_S
            logger.error(
                "webhook process exited with status %s; starting it again in %.1f s",
                status,
                backoff,
            )
            self._stop.wait(backoff)
            backoff = min(MAX_BACKOFF_S, backoff * 2)

    def _run_once(self) -> int | None:
        environment = {**os.environ, PARENT_PID_ENV: str(os.getpid())}
        with self._lock:
            if self._stop.is_set():
                return None
            try:
                process = subprocess.Popen(
                    self._argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    env=environment,
                    text=True,
                )
            except OSError as exc:
                logger.error("cannot start the webhook process: %s", exc)
                return None
            self._process = process
            self.starts += 1
        logger.info("webhook process started (pid %d)", process.pid)
        assert process.stdout is not None
        for line in process.stdout:  # ends when the child exits
            text = line.strip()
            if text == READY_LINE:
                self._ready.set()
            elif text.startswith(METRICS_LINE) and text.removeprefix(METRICS_LINE).isdigit():
                with self._lock:
                    self._metrics_port = int(text.removeprefix(METRICS_LINE))
        status = process.wait()
        self._ready.clear()
        with self._lock:
            self._metrics_port = None
        process.stdout.close()
        return status

    def stop(self) -> None:
        """Stop the child (SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``) and its supervisor."""
        with self._lock:
            self._stop.set()
            process = self._process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                logger.warning(
                    "webhook process did not stop within %.0f s; killing it", STOP_TIMEOUT_S
                )
                process.kill()
                process.wait()
        if self._thread is not None:
            self._thread.join(timeout=STOP_TIMEOUT_S)
        self._ready.clear()
