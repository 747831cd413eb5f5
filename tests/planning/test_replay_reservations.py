"""Reservations against starvation in the queued replay: a 7g.40gb under a stream of 1g.5gb."""

from __future__ import annotations

import pytest

from instaslice.planning.figures import ReplayResult
from instaslice.planning.fleet import parse_fleet
from instaslice.planning.replay import replay
from instaslice.planning.trace import TraceRequest

TWO_A100 = parse_fleet("1x2xA100-40GB")
LIFETIME = 30.0
STREAM_END = 1500.0
BIG_AT = 50.0


def _stream(*, every: float, priority: int) -> list[TraceRequest]:
    """1g.5gb requests from 0 to ``STREAM_END``, each held ``LIFETIME``: with one every 2.5 s
    about twelve run, so neither GPU ever empties by itself."""
    count = int(STREAM_END / every)
    return [
        TraceRequest(t=i * every, profile="1g.5gb", duration=LIFETIME, priority=priority)
        for i in range(count)
    ]


def _with(trace: list[TraceRequest], *extra: TraceRequest) -> list[TraceRequest]:
    return sorted([*trace, *extra], key=lambda r: r.t)


def _replay(trace: list[TraceRequest], bound: float | None) -> ReplayResult:
    return replay(
        trace,
        TWO_A100,
        policy="firstfit",
        queue=True,
        starvation_after=bound,
        check_invariants=True,
    )


@pytest.mark.parametrize(
    ("stream", "big", "bound", "placed_within"),
    [
        (0, 0, 60.0, 60.0 + LIFETIME),
        (0, 5, 60.0, 60.0 + LIFETIME),
        (0, 0, 200.0, 200.0 + LIFETIME),
        (0, 0, None, None),
        (10, 5, 60.0, None),  # higher priorities pass a reservation
    ],
    ids=[
        "equal-priority",
        "higher-priority",
        "longer-bound",
        "no-reservations",
        "lower-than-stream",
    ],
)
def test_a_reservation_places_a_whole_gpu_request_within_the_bound_and_one_lifetime(
    stream: int, big: int, bound: float | None, placed_within: float | None
) -> None:
    trace = _with(
        _stream(every=2.5, priority=stream),
        TraceRequest(t=BIG_AT, profile="7g.40gb", duration=100.0, priority=big),
    )
    result = _replay(trace, bound)
    assert result.largest_profile == "7g.40gb"
    wait = result.largest_wait_p99_s
    assert wait is not None
    if placed_within is None:
        assert wait > STREAM_END - BIG_AT - LIFETIME  # only once the stream dries up
    else:
        assert bound is not None
        assert bound < wait <= placed_within
        assert result.reservations == 1
    assert result.accepted == result.requests


def test_no_reservation_where_one_departure_lets_the_request_in() -> None:
    # A lone 7g.40gb holds the first GPU until 500: its departure alone makes room, so the
    # waiting one reserves nothing (the serving order gives it that room) and the 1g.5gb keep
    # the second GPU.
    trace = _with(
        _stream(every=5.0, priority=0),
        TraceRequest(t=0.0, profile="7g.40gb", duration=500.0),
        TraceRequest(t=BIG_AT, profile="7g.40gb", duration=100.0),
    )
    result = _replay(trace, 60.0)
    assert result.reservations == 0
    assert result.largest_wait_p99_s == 500.0 - BIG_AT


def test_a_request_placed_before_its_bound_reserves_nothing() -> None:
    trace = _with(
        _stream(every=2.5, priority=0)[:40],  # the stream stops at 100 s: the GPUs empty by 130
        TraceRequest(t=BIG_AT, profile="7g.40gb", duration=100.0),
    )
    result = _replay(trace, 120.0)
    assert result.reservations == 0
    assert result.largest_wait_p99_s is not None
    assert result.largest_wait_p99_s < 120.0
