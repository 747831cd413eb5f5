"""Stop a daemon gracefully on SIGTERM (kubelet, ``kubectl delete``) and SIGINT (Ctrl-C).

The handler only logs and sets an event; ``main`` waits on the event and then stops its parts in
order, so nothing is torn down from inside a signal handler.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType


def stop_on_signals(*, logger: logging.Logger) -> threading.Event:
    """Install SIGTERM and SIGINT handlers (main thread only) that log through ``logger`` and set
    the returned event."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        logger.info("received signal %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop
