"""The queued replay: waiting requests served by priority, preemption, and its figures."""

from __future__ import annotations

import dataclasses
import random

import pytest

from driver.errors import ConfigError
from driver.placement import POLICIES
from instaslice.planning.figures import ReplayResult
from instaslice.planning.fleet import Fleet, parse_fleet
from instaslice.planning.replay import replay
from instaslice.planning.trace import PreemptionPolicy, TraceRequest, parse_mix, synthesize

ONE_A100 = parse_fleet("1x1xA100-40GB")


def _request(
    t: float,
    profile: str,
    duration: float,
    *,
    priority: int = 0,
    policy: PreemptionPolicy = "PreemptLowerPriority",
    name: str | None = None,
) -> TraceRequest:
    return TraceRequest(
        t=t,
        profile=profile,
        duration=duration,
        priority=priority,
        preemption_policy=policy,
        name=name,
    )


def _queued(
    trace: list[TraceRequest], fleet: Fleet = ONE_A100, *, preemption: bool = False
) -> ReplayResult:
    return replay(
        trace, fleet, policy="firstfit", queue=True, preemption=preemption, check_invariants=True
    )


def _waits(result: ReplayResult) -> dict[int, tuple[float, float]]:
    return {p.priority: (p.wait_p50_s, p.wait_p99_s) for p in result.by_priority}


# ----------------------------------------------------------------------------------- order


def test_waiting_requests_are_served_by_priority_then_arrival() -> None:
    # One GPU, one 7g.40gb at a time: after the first, the others run highest priority first,
    # and of equal priorities the earlier first.
    trace = [
        _request(0, "7g.40gb", 10),
        _request(1, "7g.40gb", 10, priority=0),
        _request(2, "7g.40gb", 10, priority=5),
        _request(3, "7g.40gb", 10, priority=3),
        _request(4, "7g.40gb", 10, priority=3),
    ]
    result = _queued(trace)
    assert (result.accepted, result.rejected, result.queued) == (5, 0, 4)
    # priority 5 at 10 (waited 8), 3 at 20 and 30 (17, 26), the second 0 at 40 (39)
    assert _waits(result) == {5: (8.0, 8.0), 3: (17.0, 26.0), 0: (0.0, 39.0)}
    assert [p.priority for p in result.by_priority] == [5, 3, 0]


def test_a_request_behind_that_fits_does_not_wait_for_one_ahead_that_does_not() -> None:
    # The 7g.40gb waits for the 1g.5gb to leave; the later, lower 1g.5gb fits beside it now.
    trace = [
        _request(0, "1g.5gb", 100),
        _request(1, "7g.40gb", 10, priority=5),
        _request(2, "1g.5gb", 10),
    ]
    result = _queued(trace)
    assert (result.accepted, result.queued) == (3, 1)
    assert _waits(result) == {5: (99.0, 99.0), 0: (0.0, 0.0)}


def test_freed_room_goes_to_the_highest_priority_that_fits_it() -> None:
    # At 10 a 4g.20gb frees; the 3g.20gb of priority 9 takes it before the earlier one of 1,
    # which gets the other half at 20.
    trace = [
        _request(0, "4g.20gb", 10),
        _request(0, "3g.20gb", 20),
        _request(1, "3g.20gb", 5, priority=1),
        _request(2, "3g.20gb", 50, priority=9),
    ]
    result = _queued(trace)
    assert _waits(result) == {9: (8.0, 8.0), 1: (19.0, 19.0), 0: (0.0, 0.0)}


def test_figures_per_priority_add_up_and_name_the_largest_profile() -> None:
    fleet = parse_fleet("1x2xA100-40GB")
    rng = random.Random(4)
    mix = parse_mix("1g.5gb=6,3g.20gb=2,7g.40gb=1")
    base = synthesize(fleet=fleet, mix=mix, load=1.1, events=300, seed=4, mean_duration=60)
    trace = [
        TraceRequest(
            t=r.t,
            profile=r.profile,
            count=8 if i % 50 == 0 else r.count,  # 8 x 1g.5gb never fit one GPU
            duration=r.duration,
            priority=rng.choice((-5, 0, 100)),
        )
        for i, r in enumerate(base)
    ]
    result = replay(
        trace, fleet, policy="bestfit", queue=True, preemption=True, check_invariants=True
    )
    assert sum(p.requests for p in result.by_priority) == result.requests == 300
    assert sum(p.admitted for p in result.by_priority) == result.accepted
    assert sum(p.rejected for p in result.by_priority) == result.rejected
    assert result.accepted + result.rejected == 300
    assert result.rejected == sum(r.count == 8 for r in trace)
    assert sum(p.preempted for p in result.by_priority) == result.preempted > 0
    assert result.by_priority[-1].preempted == result.preempted - result.by_priority[1].preempted
    assert result.by_priority[0].preempted == 0  # nothing is above 100
    assert result.largest_profile == "7g.40gb"
    assert result.largest_wait_p99_s is not None
    assert result.largest_wait_p99_s >= (result.largest_wait_p50_s or 0.0)


def test_a_trace_without_priorities_gives_the_same_figures_with_preemption_on() -> None:
    fleet = parse_fleet("2x4xA100-40GB")
    mix = parse_mix("1g.5gb=45,2g.10gb=15,3g.20gb=15,7g.40gb=5")
    trace = synthesize(fleet=fleet, mix=mix, load=1.05, events=1500, seed=2)
    for policy in POLICIES:
        off = replay(trace, fleet, policy=policy, queue=True)
        on = replay(trace, fleet, policy=policy, queue=True, preemption=True)
        assert dataclasses.replace(on, wall_s=off.wall_s, preemption=False) == off
        assert on.preempted == 0


# ------------------------------------------------------------------------------ preemption


@pytest.mark.parametrize(
    ("running", "arriving", "policy", "preempted", "wait"),
    [
        (0, 10, "PreemptLowerPriority", 1, 0.0),
        (0, 10, "Never", 0, 90.0),
        (10, 10, "PreemptLowerPriority", 0, 90.0),
        (10, 0, "PreemptLowerPriority", 0, 90.0),
        (-(2**31), 2**31 - 1, "PreemptLowerPriority", 1, 0.0),
    ],
    ids=["lower", "never", "equal", "higher", "int32-limits"],
)
def test_only_a_strictly_higher_priority_that_may_preempt_evicts(
    running: int, arriving: int, policy: PreemptionPolicy, preempted: int, wait: float
) -> None:
    trace = [
        _request(0, "7g.40gb", 100, priority=running),
        _request(10, "7g.40gb", 5, priority=arriving, policy=policy),
    ]
    result = _queued(trace, preemption=True)
    assert result.preempted == preempted
    assert {p.priority: p.preempted for p in result.by_priority}[running] == preempted
    assert _waits(result)[arriving][1] == wait


def test_an_evicted_request_waits_again_and_restarts_from_the_beginning() -> None:
    trace = [
        _request(0, "7g.40gb", 100),
        _request(10, "7g.40gb", 5, priority=1),
        _request(12, "7g.40gb", 50),  # waits behind the evicted one (evicted at 10, before it)
    ]
    result = replay(trace, ONE_A100, policy="firstfit", queue=True, preemption=True, timeline=True)
    # The evicted request waits 10 → 15 and runs 15 → 115 (all 100 s again); the last one
    # from 115, having waited 103 s.
    assert (result.accepted, result.preempted) == (3, 1)
    assert _waits(result) == {1: (0.0, 0.0), 0: (5.0, 103.0)}


def test_preemption_is_refused_without_the_queue() -> None:
    with pytest.raises(ConfigError, match="preemption needs the queue"):
        replay([_request(0, "1g.5gb", 1)], ONE_A100, policy="firstfit", preemption=True)


def test_a_replay_with_every_rule_keeps_the_engine_and_the_running_requests_in_step() -> None:
    fleet = parse_fleet("2x2xA100-40GB")
    mix = parse_mix("1g.5gb=8,1g.5gb+me=1,2g.10gb=3,3g.20gb=3,4g.20gb=1,7g.40gb=2,2*1g.5gb=1")
    for seed in range(3):
        rng = random.Random(seed)
        base = synthesize(fleet=fleet, mix=mix, load=1.2, events=400, seed=seed, mean_duration=30)
        trace = [
            TraceRequest(
                t=r.t,
                profile=r.profile,
                count=r.count,
                duration=r.duration,
                priority=rng.choice((0, 0, 5, 9)),
                preemption_policy=rng.choice(("PreemptLowerPriority", "Never")),
            )
            for r in base
        ]
        for policy in POLICIES:
            result = replay(
                trace,
                fleet,
                policy=policy,
                queue=True,
                preemption=True,
                starvation_after=20.0,
                check_invariants=True,
            )
            assert result.accepted + result.rejected == result.requests == 400
