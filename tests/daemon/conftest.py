"""Fixtures of the process-wide state a daemon's start-up changes: signal handlers and logging."""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator

import pytest


@pytest.fixture
def restored_handlers() -> Iterator[None]:
    """SIGTERM's and SIGINT's handlers and the wakeup fd, put back as they were."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(wakeup)


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """The root logger, put back as it was (pytest's own capture handlers included)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield root
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
