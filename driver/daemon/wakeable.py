"""A background thread that sleeps between rounds and can be woken early or stopped at once.

Loops that poll on an interval but must also react now (a kubelet restart, an ``Allocate`` that
needs its claim moved) share this lifecycle: ``start``, ``wake`` to cut the current sleep short,
``stop`` to end the loop and join it. The loop body decides what a round does and how long to sleep.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class WakeableThread:
    """Runs ``body`` on a daemon thread named ``name``; ``body`` loops until ``stopping()`` and
    sleeps with ``sleep``."""

    def __init__(self, body: Callable[[], None], *, name: str) -> None:
        self._body = body
        self._name = name
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def stopping(self) -> bool:
        """Whether ``stop`` was called: the body should return. (A method, not a property: it
        changes under the body's feet, and type checkers narrow properties.)"""
        return self._stopping.is_set()

    def start(self) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._body, name=self._name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """End the body's current (or next) ``sleep`` now."""
        self._wake.set()

    def stop(self) -> None:
        """Tell the body to stop, wake it, and wait until it has returned."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def sleep(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True if woken early (by ``wake`` or ``stop``), which is
        consumed: the next ``sleep`` waits again."""
        woken = self._wake.wait(seconds)
        self._wake.clear()
        return woken
