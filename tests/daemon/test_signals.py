"""SIGTERM and SIGINT set the stop event and say so in the daemon's log; a storm of them while the
main thread waits on the event (a killed parent's threads going away one by one, each sending its
child the parent-death signal) never hangs the process."""

from __future__ import annotations

import logging
import os
import signal
import threading

import pytest

from driver.daemon.signals import stop_on_signals


@pytest.mark.usefixtures("restored_handlers")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["term", "int"])
def test_a_signal_sets_the_event_and_is_logged(
    signum: signal.Signals, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="daemon-under-test")
    stop = stop_on_signals(logger=logging.getLogger("daemon-under-test"))
    assert not stop.is_set()
    signal.raise_signal(signum)
    assert stop.wait(5)
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("daemon-under-test", f"received signal {signum.name}, stopping")
    ]


@pytest.mark.usefixtures("restored_handlers")
def test_many_signals_while_the_main_thread_waits_set_the_event_without_a_hang(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="daemon-under-test")
    stop = stop_on_signals(logger=logging.getLogger("daemon-under-test"))

    def storm() -> None:
        for _ in range(200):
            os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=storm)
    sender.start()
    assert stop.wait(10)  # the main thread waits, as a daemon's main does
    sender.join(10)
    assert not sender.is_alive()
    assert caplog.records
    assert {r.getMessage() for r in caplog.records} == {"received signal SIGTERM, stopping"}
