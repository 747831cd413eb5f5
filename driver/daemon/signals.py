"""Stop a daemon gracefully on SIGTERM (kubelet, ``kubectl delete``) and SIGINT (Ctrl-C).

Nothing happens inside the signal handler: Python runs handlers in the main thread between two
bytecodes, also while that thread holds a lock — inside ``Event.wait`` or inside an earlier
handler's ``Event.set`` — and a handler taking the same lock deadlocks the process (seen: the
webhook process, sent several SIGTERMs as the threads of its killed parent went away, hung for
good). So the handler does nothing, the interpreter's C-level handler writes the signal number to a
pipe (``signal.set_wakeup_fd``), and a thread of its own reads it, logs and sets the event; ``main``
waits on the event and then stops its parts in order.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_on_signals(*, logger: logging.Logger) -> threading.Event:
    """Install SIGTERM and SIGINT handling (main thread only); the returned event is set, and the
    signal logged through ``logger``, when one arrives."""
    stop = threading.Event()
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def ignore(signum: int, frame: FrameType | None) -> None:
        """Keeps the default action (exit) away; the wakeup fd does the work."""

    for signum in SIGNALS:
        signal.signal(signum, ignore)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watch() -> None:
        while True:
            try:
                received = os.read(read_fd, 64)
            except OSError:
                return
            if not received:
                return
            for number in received:
                with contextlib.suppress(ValueError):
                    if signal.Signals(number) in SIGNALS:
                        logger.info("received signal %s, stopping", signal.Signals(number).name)
                        stop.set()

    threading.Thread(target=watch, name="signals", daemon=True).start()
    return stop
