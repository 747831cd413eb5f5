"""Child processes of the demo and the end-to-end harness: the real InstaSlice daemons.

Each daemon runs as ``python -m <package>`` in its own session (a Ctrl-C in the terminal reaches
only the demo, which then stops its children in order) with its output in a log file. It is
started through ``localcluster.launch``, which makes it end with the process that started it, so
even a demo killed with ``SIGKILL`` leaves no daemon behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from localcluster.launch import PARENT_PID_ENV

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0
CHECKOUT = Path(__file__).resolve().parent.parent
"""The source checkout: ``localcluster.launch`` is not in the installed package, so the children
find it here whatever their working directory."""


class ManagedProcess:
    """One daemon: ``start`` it, ``stop`` it gracefully (SIGTERM, then SIGKILL), or ``kill`` it."""

    def __init__(
        self,
        *,
        name: str,
        module: str,
        args: Sequence[str],
        log_file: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = [sys.executable, "-m", "localcluster.launch", module, *args]
        self.log_file = log_file
        self._env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH", "")) if p
            ),
            PARENT_PID_ENV: str(os.getpid()),
            **(env or {}),
        }
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def returncode(self) -> int | None:
        return self._process.poll() if self._process is not None else None

    def start(self) -> None:
        if self.running():
            raise RuntimeError(f"{self.name} is already running")
        self._reap()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_file.open("ab")
        self._log.write(f"--- start {self.starts + 1}: {' '.join(self.argv)}\n".encode())
        self._log.flush()
        self._process = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self._env,
            start_new_session=True,
        )
        self.starts += 1
        log.debug("started %s (pid %s)", self.name, self._process.pid)

    def stop(self, *, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL. Returns the exit status."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0fs; killing it", self.name, timeout)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                process.wait()
        return self._reap()

    def kill(self) -> int | None:
        """SIGKILL, as a crash or an OOM kill would end it."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        process.wait()
        return self._reap()

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _reap(self) -> int | None:
        code = None
        if self._process is not None:
            code = self._process.wait()
            self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None
        return code
