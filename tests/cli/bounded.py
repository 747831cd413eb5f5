"""Run ``instaslice`` on one argument vector in a child process with a memory ceiling and a guard
against hangs, and collect what a user would see: the exit status, stdout and stderr.

The child is forked from the test process (no interpreter start per example, so property tests can
try many inputs quickly). It gets ``RLIMIT_AS`` set to the parent's address space plus
``memory_bytes``: an input that makes the command grow past it fails with ``MemoryError``, which
the child reports as a traceback. A child still running after ``guard_s`` is killed and reported as
``hung``; the guard is generous (it catches an endless loop or a runaway input, it does not time
anything). The child reads stdin from ``/dev/null`` and sees only ``env`` changes given here (no
cluster is reachable: ``$KUBECONFIG`` names a missing file). It runs in a temporary folder of its
own, removed afterwards: an argument that happens to be a relative path (``--trace 1e309`` with
``--synthesize``) writes there, never into the checkout the tests run from.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from instaslice import cli

CRASHED = 70
"""The child's exit status when ``main`` raised instead of returning (its traceback on stderr)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    status: int
    stdout: str
    stderr: str
    hung: bool = False

    @property
    def stderr_lines(self) -> list[str]:
        return self.stderr.splitlines()


def _address_space_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def run_bounded(
    argv: Sequence[str],
    *,
    memory_bytes: int = 768 * 1024 * 1024,
    guard_s: float = 60.0,
    env: Mapping[str, str] | None = None,
) -> Outcome:
    """``instaslice ARGV`` in a forked child limited to ``memory_bytes`` more address space."""
    limit = _address_space_bytes() + memory_bytes
    with tempfile.TemporaryDirectory(prefix="instaslice-bounded-") as folder:
        out_path, err_path, cwd = Path(folder, "out"), Path(folder, "err"), Path(folder, "cwd")
        cwd.mkdir()
        with warnings.catch_warnings():
            # Python 3.12+ warns about forking a process with threads: the child runs only the
            # command and exits, it never touches another thread's locks.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns
            _child(argv, limit=limit, out=out_path, err=err_path, cwd=cwd, env=env or {})
        status, hung = _wait(pid, guard_s=guard_s)
        return Outcome(
            status=status,
            stdout=out_path.read_text(errors="replace"),
            stderr=err_path.read_text(errors="replace"),
            hung=hung,
        )


def _child(
    argv: Sequence[str], *, limit: int, out: Path, err: Path, cwd: Path, env: Mapping[str, str]
) -> None:
    status = CRASHED
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
        os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the child's whole life
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        os.chdir(cwd)
        os.environ.pop("KUBERNETES_SERVICE_HOST", None)
        os.environ["KUBECONFIG"] = str(out.parent / "no-kubeconfig")
        os.environ.update(env)
        try:
            status = cli.main(list(argv))
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            status = CRASHED
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


def _wait(pid: int, *, guard_s: float) -> tuple[int, bool]:
    deadline = time.monotonic() + guard_s
    while True:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(wait_status), False
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -signal.SIGKILL, True
        time.sleep(0.005)
