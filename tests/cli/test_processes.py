"""The daemons' child processes: graceful stop, kill, restart, and no orphan when the parent dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from localcluster.processes import ManagedProcess

BLOCKING_MODULE = ("http.server", ["0", "--bind", "127.0.0.1"])


def _gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return False


def test_stop_kill_and_restart_keep_one_log(tmp_path: Path) -> None:
    module, args = BLOCKING_MODULE
    process = ManagedProcess(name="srv", module=module, args=args, log_file=tmp_path / "srv.log")
    process.start()
    first = process.pid
    assert first is not None
    assert process.running()
    assert process.stop() == -signal.SIGTERM
    assert not process.running()
    process.start()
    assert process.pid != first
    assert process.kill() == -signal.SIGKILL
    assert process.starts == 2
    assert process.stop() is None
    assert process.log_tail().count("--- start") == 2


def test_a_daemon_ends_with_the_process_that_started_it(tmp_path: Path) -> None:
    module, args = BLOCKING_MODULE
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from localcluster.processes import ManagedProcess\n"
            f"p = ManagedProcess(name='srv', module={module!r}, args={args!r},"
            f" log_file=Path({str(tmp_path / 'srv.log')!r}))\n"
            "p.start()\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert not _gone(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert _wait_gone(child), "the daemon outlived the process that started it"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        parent.stdout.close()  # type: ignore[union-attr]
