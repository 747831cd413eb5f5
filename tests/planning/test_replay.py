"""Replaying traces on the placement engine, and the fluid floor."""

from __future__ import annotations

import pytest

from driver.errors import ConfigError
from driver.placement import POLICIES
from instaslice.planning.figures import percentile
from instaslice.planning.fleet import parse_fleet
from instaslice.planning.replay import fluid_floor, replay
from instaslice.planning.trace import TraceRequest, parse_mix, synthesize

ONE_A100 = parse_fleet("1x1xA100-40GB")


def _trace(*items: tuple[float, str, float] | tuple[float, str, float, int]) -> list[TraceRequest]:
    requests = []
    for line, item in enumerate(items, start=1):
        t, profile, duration, *count = item
        requests.append(
            TraceRequest(
                t=t, profile=profile, duration=duration, count=count[0] if count else 1, line=line
            )
        )
    return requests


@pytest.mark.parametrize("policy", list(POLICIES))
def test_slices_are_released_at_arrival_plus_duration(policy: str) -> None:
    trace = _trace((0, "7g.40gb", 10), (1, "1g.5gb", 5), (10, "1g.5gb", 5))
    result = replay(trace, ONE_A100, policy=policy)
    assert (result.requests, result.accepted, result.rejected, result.stranded) == (3, 2, 1, 0)


def test_stranding_counts_rejections_that_free_memory_could_have_taken() -> None:
    # First-fit puts the 1g at start 0, where the only 4g placement begins; best-fit keeps it free.
    trace = _trace((0, "1g.5gb", 100), (1, "4g.20gb", 10))
    first = replay(trace, ONE_A100, policy="firstfit")
    best = replay(trace, ONE_A100, policy="bestfit")
    assert (first.rejected, first.stranded) == (1, 1)
    assert (best.rejected, best.stranded) == (0, 0)


def test_utilization_is_time_weighted_between_first_and_last_arrival() -> None:
    trace = _trace((0, "7g.40gb", 10), (20, "1g.5gb", 100))
    result = replay(trace, ONE_A100, policy="firstfit", timeline=True)
    assert result.mean_utilization == pytest.approx(0.5)
    assert result.peak_utilization == 1.0
    assert result.timeline is not None
    assert result.timeline.t == (0.0, 20.0)
    assert result.timeline.used_slices == (8, 1)
    assert result.timeline.rejected == (0, 0)


def test_the_queue_is_fifo_and_waits_are_measured() -> None:
    trace = _trace((0, "7g.40gb", 10), (1, "7g.40gb", 5), (2, "1g.5gb", 1), (3, "1g.5gb", 8, 8))
    result = replay(trace, ONE_A100, policy="firstfit", queue=True)
    # The second 7g waits until 10; the 1g behind it until 15; 8 x 1g never fit one GPU.
    assert (result.accepted, result.rejected, result.queued) == (3, 1, 2)
    assert result.wait_p50_s == 9.0
    assert result.wait_p99_s == 13.0


def test_the_floor_ignores_placement_rules() -> None:
    trace = _trace((0, "4g.20gb", 10), (1, "4g.20gb", 10), (2, "1g.5gb", 10))
    assert replay(trace, ONE_A100, policy="bestfit").rejected == 1  # 4g.20gb only starts at 0
    floor = fluid_floor(trace, ONE_A100)
    assert (floor.requests, floor.rejected) == (3, 1)  # the 1g finds no free slice at all


def test_the_floor_uses_the_model_with_most_free_memory() -> None:
    fleet = parse_fleet("1x1xA100-40GB,1x1xA100-80GB")
    # 1g.10gb is 2 slices on the A100-40GB, 1 on the A100-80GB; 2g.20gb only on the 80GB.
    trace = _trace((0, "1g.10gb", 10), (1, "1g.10gb", 10), (2, "2g.20gb", 10), (3, "7g.80gb", 10))
    assert fluid_floor(trace, fleet).rejected == 1


@pytest.mark.parametrize("load", [0.8, 0.95])
@pytest.mark.parametrize("seed", [1, 2])
def test_no_policy_beats_the_floor(load: float, seed: int) -> None:
    fleet = parse_fleet("2x4xA100-40GB")
    mix = parse_mix("1g.5gb=45,1g.10gb=10,2g.10gb=15,3g.20gb=15,4g.20gb=5,7g.40gb=5,1g.5gb+me=5")
    trace = synthesize(fleet=fleet, mix=mix, load=load, events=1500, seed=seed)
    floor = fluid_floor(trace, fleet)
    for policy in POLICIES:
        result = replay(trace, fleet, policy=policy)
        assert result.accepted + result.rejected == result.requests == 1500
        assert result.rejected >= floor.rejected
        assert result.stranded <= result.rejected


def test_a_profile_the_fleet_lacks_names_its_line() -> None:
    trace = _trace((0, "1g.5gb", 1), (1, "1g.10gb", 1), (2, "3g.40gb", 1))
    with pytest.raises(ConfigError) as raised:
        replay(trace, ONE_A100, policy="firstfit")
    assert str(raised.value).startswith("trace line 3: profile '3g.40gb' is not offered")
    with pytest.raises(ConfigError):
        fluid_floor(trace, ONE_A100)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 0.5), percentile(values, 0.99), percentile([], 0.5)) == (
        50.0,
        99.0,
        0.0,
    )
