"""The wakeable thread: ``wake`` ends a sleep early (once), ``stop`` ends the loop and joins it,
and it can be started again after a stop."""

from __future__ import annotations

import threading

from driver.daemon.wakeable import WakeableThread

LONG = 60.0
"""Longer than any test may take: reaching it would mean a wake was lost."""


class _Loop:
    def __init__(self) -> None:
        self.thread = WakeableThread(self._run, name="test-wakeable")
        self.rounds = 0
        self.woken: list[bool] = []
        self.round_done = threading.Semaphore(0)

    def _run(self) -> None:
        while not self.thread.stopping():
            self.rounds += 1
            self.round_done.release()
            self.woken.append(self.thread.sleep(LONG))


def test_wake_runs_a_round_now_and_stop_joins() -> None:
    loop = _Loop()
    loop.thread.start()
    try:
        assert loop.round_done.acquire(timeout=5)
        loop.thread.wake()
        assert loop.round_done.acquire(timeout=5)
        assert loop.woken == [True]
    finally:
        loop.thread.stop()
    assert loop.rounds == 2
    assert loop.woken == [True, True]  # stop wakes the last sleep
    assert not any(t.name == "test-wakeable" for t in threading.enumerate())


def test_sleep_times_out_without_a_wake_and_consumes_a_wake() -> None:
    thread = WakeableThread(lambda: None, name="unused")
    assert thread.sleep(0.01) is False
    thread.wake()
    assert thread.sleep(LONG) is True
    assert thread.sleep(0.01) is False  # the wake was consumed


def test_restart_after_stop() -> None:
    loop = _Loop()
    loop.thread.start()
    assert loop.round_done.acquire(timeout=5)
    loop.thread.stop()
    assert loop.thread.stopping()
    loop.thread.start()
    try:
        assert not loop.thread.stopping()
        assert loop.round_done.acquire(timeout=5)
    finally:
        loop.thread.stop()
    assert loop.rounds == 2
