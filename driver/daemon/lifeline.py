"""End a child daemon with the process that started it.

A daemon that starts a helper process of its own (the controller starts its webhook process) must
not leave it behind when it is killed with ``SIGKILL``: on Linux the kernel is asked for
``SIGTERM`` when the parent dies (``PR_SET_PDEATHSIG``), and a parent that died before the request
took effect is noticed by comparing ``getppid()`` with the pid the parent wrote into the child's
environment. Elsewhere it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid_env: str) -> bool:
    """Ask for ``SIGTERM`` when the parent dies; False if the parent named in ``parent_pid_env``
    is already gone (the caller should exit). The variable is removed from the environment, so
    grandchildren do not inherit it."""
    expected = os.environ.pop(parent_pid_env, "")
    if not sys.platform.startswith("linux"):
        return True
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    return not (expected.isdigit() and os.getppid() != int(expected))
