"""``python -m localcluster.launch <module> [args…]``: run ``python -m <module> [args…]`` in a process
that ends when the process that started it ends.

The demo and the end-to-end harness start the daemons through this launcher. On Linux it asks the
kernel for ``SIGTERM`` when the parent dies (``PR_SET_PDEATHSIG``), so even a demo killed with
``SIGKILL`` leaves no daemon behind. It is done here, after ``exec``, rather than in a
``preexec_fn``: a ``preexec_fn`` forces a real ``fork()`` of the multi-threaded parent, whose gRPC
fork handlers can then start a poller thread in the child that aborts it before ``exec`` (its
epoll descriptor was closed) — with no ``preexec_fn`` the parent uses ``vfork`` and runs no
fork handlers.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import runpy
import signal
import sys

PARENT_PID_ENV = "INSTASLICE_LAUNCH_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    expected = os.environ.pop(PARENT_PID_ENV, "")
    if expected.isdigit() and os.getppid() != int(expected):
        sys.exit(1)  # the parent died before the request took effect


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m localcluster.launch <module> [args...]")
    die_with_parent()
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
