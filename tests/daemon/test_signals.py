"""SIGTERM and SIGINT set the stop event and say so in the daemon's log."""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator

import pytest

from driver.daemon.signals import stop_on_signals


@pytest.fixture
def restored_handlers() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


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
