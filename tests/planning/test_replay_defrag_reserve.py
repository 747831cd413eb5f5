"""``defrag_whole_gpu_reserve``: whole-GPU requests defragment only if the memory slices left free
hold the smaller requests' recent demand over some share of the mean request lifetime."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from driver.errors import ConfigError
from instaslice import cli
from instaslice.planning import replay as replay_module
from instaslice.planning.figures import ReplayResult
from instaslice.planning.fleet import Fleet, parse_fleet
from instaslice.planning.replay import DEMAND_WINDOW_LIFETIMES, LIFETIME_SAMPLE, replay
from instaslice.planning.trace import TraceRequest, parse_mix, save_trace, synthesize
from tests.planning.test_replay_defrag import ONE_MOVE, TWO_A100, _counts, _trace
from tests.planning.test_replay_defrag_rule import SMALL_AFTER_MOVE


def _reserved(seven_g_at: float) -> list[TraceRequest]:
    """First-fit on two A100s: a 1g lasting 10 s departs (the mean lifetime is 10 s, the demand
    window 4 s), then a 1g on GPU 0 and a 4g on GPU 1 leave no GPU free for a 7g; moving the 1g
    to GPU 1 frees GPU 0. Once admitted, 16 - 5 - 8 = 3 memory slices stay free."""
    return _trace(
        (0, "1g.5gb", 10),
        (11, "1g.5gb", 100),
        (12, "4g.20gb", 100),
        (seven_g_at, "7g.40gb", 10),
    )


# At t=13 both smaller requests (5 slices) arrived in the last 4 s: 5 / 4 slices per second, so the
# 3 free slices hold 3 / (5 / 4) = 2.4 s = 0.24 lifetimes of that demand.
RESERVED = _reserved(13)
HOLDS = 0.24
ADMITTED = (4, 0, 1, 1, 1)
TURNED_AWAY = (3, 1, 0, 0, 0)


def _replay(
    trace: list[TraceRequest],
    reserve: float | None,
    *,
    fleet: Fleet = TWO_A100,
    policy: str = "firstfit",
) -> ReplayResult:
    return replay(
        trace,
        fleet,
        policy=policy,
        defrag_moves=1,
        defrag_whole_gpu_reserve=reserve,
        check_invariants=True,
        timeline=True,
    )


def _scaled(trace: list[TraceRequest], factor: float) -> list[TraceRequest]:
    return [replace(r, t=r.t * factor, duration=r.duration * factor) for r in trace]


def test_the_window_and_the_sample_are_as_documented() -> None:
    # 0.4 lifetimes: the 120 s the rule was tuned with on traces of 300 s jobs.
    assert DEMAND_WINDOW_LIFETIMES == 0.4
    assert LIFETIME_SAMPLE == 1_000


@pytest.mark.parametrize("reserve", [0.01, HOLDS - 0.01])
def test_a_whole_gpu_request_defragments_while_the_free_slices_hold_the_reserve(
    reserve: float,
) -> None:
    allowed = _replay(RESERVED, reserve)
    plain = replay(RESERVED, TWO_A100, policy="firstfit", defrag_moves=1)
    assert _counts(allowed) == _counts(plain) == ADMITTED
    assert allowed.defrag_whole_gpu_reserve == reserve


@pytest.mark.parametrize("reserve", [HOLDS + 0.01, 1.0])
def test_a_whole_gpu_request_does_not_defragment_beyond_the_reserve(reserve: float) -> None:
    assert _counts(_replay(RESERVED, reserve)) == TURNED_AWAY  # turned away without a search


def test_demand_older_than_the_window_is_forgotten() -> None:
    # At t=15.5 the window (4 s) holds the 4g only: 3 free slices hold 3 / (4 / 4) = 3 s of it,
    # 0.3 lifetimes. At t=16.5 nothing smaller arrived in the last 4 s: any reserve is held.
    assert _counts(_replay(_reserved(15.5), 0.29)) == ADMITTED
    assert _counts(_replay(_reserved(15.5), 0.31)) == TURNED_AWAY
    assert _counts(_replay(_reserved(16.5), 1.0)) == ADMITTED


@pytest.mark.parametrize("factor", [0.25, 4.0, 1024.0])
@pytest.mark.parametrize("reserve", [HOLDS - 0.01, HOLDS + 0.01])
def test_scaling_every_time_of_the_trace_changes_no_decision(reserve: float, factor: float) -> None:
    # Powers of two: the scaled times are exact, so the comparisons are too.
    assert _counts(_replay(_scaled(RESERVED, factor), reserve)) == _counts(
        _replay(RESERVED, reserve)
    )


def test_a_synthesized_trace_and_its_time_scaled_copy_get_the_same_decisions() -> None:
    fleet = parse_fleet("1x4xA100-40GB")
    trace = list(
        synthesize(
            fleet=fleet,
            mix=parse_mix("1g.5gb=45,2g.10gb=15,3g.20gb=15,4g.20gb=10,7g.40gb=15"),
            load=0.95,
            events=1_500,
            seed=7,
        )
    )

    def run(requests: list[TraceRequest], reserve: float | None) -> ReplayResult:
        return _replay(requests, reserve, fleet=fleet, policy="bestfit")

    plain = run(trace, None)
    reserved = run(trace, 0.05)
    # The rule turns whole-GPU requests away here, so the comparison below means something.
    assert _counts(reserved) != _counts(plain)
    assert reserved.defrag_searched < plain.defrag_searched
    for factor in (0.125, 8.0):
        scaled = run(_scaled(trace, factor), 0.05)
        assert _counts(scaled) == _counts(reserved)
        assert scaled.timeline is not None
        assert reserved.timeline is not None
        assert scaled.timeline.used_slices == reserved.timeline.used_slices


def test_before_the_first_departure_the_rule_allows() -> None:
    # ONE_MOVE's first 7g arrives before anything departed: there is no lifetime to measure in.
    plain = replay(ONE_MOVE, TWO_A100, policy="firstfit", defrag_moves=1)
    assert _counts(_replay(ONE_MOVE, 1.0)) == _counts(plain) == (5, 1, 1, 1, 1)


def test_departures_of_no_duration_give_no_window_and_the_rule_allows() -> None:
    trace = _trace((0, "1g.5gb", 0), (1, "1g.5gb", 100), (2, "4g.20gb", 100), (3, "7g.40gb", 10))
    assert _counts(_replay(trace, 1.0)) == ADMITTED


def test_the_lifetime_is_that_of_the_latest_departures(monkeypatch: pytest.MonkeyPatch) -> None:
    # Departures of 2 s and 9.5 s before the 7g at t=13; a 1g at t=10 and a 4g at t=12 run (the
    # 1g took GPU 0 start 0 once the 2 s request left, the 4g GPU 1). Over both departures the
    # mean lifetime is 5.75 s: the window (2.3 s) holds the 4g only, 3 free slices hold
    # 3 / (4 / 2.3) = 1.725 s of it, 0.3 lifetimes. Over the latest one only, 9.5 s: the window
    # (3.8 s) holds both (5 slices), 3 free slices hold 3 / (5 / 3.8) = 2.28 s, 0.24 lifetimes.
    trace = _trace(
        (0, "1g.5gb", 2),
        (1, "1g.5gb", 9.5),
        (10, "1g.5gb", 100),
        (12, "4g.20gb", 100),
        (13, "7g.40gb", 10),
    )
    assert _counts(_replay(trace, 0.27)) == (5, 0, 1, 1, 1)
    assert _counts(_replay(trace, 0.31)) == (4, 1, 0, 0, 0)
    monkeypatch.setattr(replay_module, "LIFETIME_SAMPLE", 1)
    assert _counts(_replay(trace, 0.27)) == (4, 1, 0, 0, 0)
    assert _counts(_replay(trace, 0.23)) == (5, 0, 1, 1, 1)


def test_smaller_requests_defragment_whatever_the_reserve() -> None:
    # Departures first, so that the rule has a lifetime to measure in.
    trace = _trace((0, "1g.5gb", 1), *((t + 2, p, d) for t, p, d in _items(SMALL_AFTER_MOVE)))
    assert _counts(_replay(trace, 1.0)) == (4, 0, 1, 1, 1)


def _items(trace: list[TraceRequest]) -> list[tuple[float, str, float]]:
    return [(r.t, r.profile, r.duration) for r in trace]


def test_the_reserve_is_off_by_default() -> None:
    result = replay(RESERVED, TWO_A100, policy="firstfit", defrag_moves=1)
    assert result.defrag_whole_gpu_reserve is None


@pytest.mark.parametrize(
    ("below", "reserve", "counts"),
    [
        (0.35, HOLDS - 0.01, ADMITTED),
        (0.35, HOLDS + 0.01, TURNED_AWAY),  # the reserve refuses
        (0.3, HOLDS - 0.01, TURNED_AWAY),  # the use limit refuses (5 of 16 in use)
    ],
)
def test_with_both_rules_both_must_allow(
    below: float, reserve: float, counts: tuple[int, ...]
) -> None:
    result = replay(
        RESERVED,
        TWO_A100,
        policy="firstfit",
        defrag_moves=1,
        defrag_whole_gpu_below=below,
        defrag_whole_gpu_reserve=reserve,
    )
    assert _counts(result) == counts


@pytest.mark.parametrize(
    ("moves", "reserve", "message"),
    [
        (0, 0.05, "needs defragmentation on"),
        (1, 0.0, "more than 0 and at most 1, got 0.0"),
        (1, -0.5, "got -0.5"),
        (1, 1.5, "got 1.5"),
        (1, 14.0, "got 14.0"),  # a number of seconds, not of lifetimes
        (1, math.inf, "got inf"),
        (1, math.nan, "got nan"),
    ],
)
def test_bad_reserves_are_refused(moves: int, reserve: float, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        replay(
            RESERVED,
            TWO_A100,
            policy="firstfit",
            defrag_moves=moves,
            defrag_whole_gpu_reserve=reserve,
        )


# ------------------------------------------------------------------------------------ the CLI


def _argv(tmp_path: Path) -> list[str]:
    trace = tmp_path / "t.jsonl"
    save_trace(RESERVED, trace)
    return ["simulate", "--gpus", "1x2xA100-40GB", "--trace", str(trace), "--policy", "firstfit"]


@pytest.mark.parametrize("lifetimes", ["0", "-5", "1.5", "14", "inf", "nan"])
def test_cli_refuses_reserves_out_of_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lifetimes: str
) -> None:
    argv = [*_argv(tmp_path), "--defrag-on-reject", "1", "--defrag-whole-gpu-reserve", lifetimes]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "instaslice simulate: --defrag-whole-gpu-reserve is a share of the mean request lifetime"
    )
    assert err.rstrip().endswith(f"got {float(lifetimes):g} (see instaslice simulate --help)")


def test_cli_refuses_the_reserve_without_defragmentation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*_argv(tmp_path), "--defrag-whole-gpu-reserve", "0.05"]) == 2
    assert "--defrag-whole-gpu-reserve needs --defrag-on-reject K" in capsys.readouterr().err


def test_cli_json_has_the_reserve_only_when_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*_argv(tmp_path), "--json", "--defrag-on-reject", "1"]
    assert cli.main(argv) == 0
    plain = json.loads(capsys.readouterr().out)["policies"]["firstfit"]
    assert "defrag_whole_gpu_reserve_lifetimes" not in plain
    assert cli.main([*argv, "--defrag-whole-gpu-reserve", "0.5"]) == 0
    reserved = json.loads(capsys.readouterr().out)["policies"]["firstfit"]
    assert set(reserved) - set(plain) == {"defrag_whole_gpu_reserve_lifetimes"}
    assert reserved["defrag_whole_gpu_reserve_lifetimes"] == 0.5
    counts = [reserved[k] for k in ("accepted", "rejected", "defragged", "moves")]
    assert counts == [3, 1, 0, 0]


def test_cli_text_notes_the_reserve(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*_argv(tmp_path), "--defrag-on-reject", "1"]
    assert cli.main(argv) == 0
    assert "demand" not in capsys.readouterr().out
    assert cli.main([*argv, "--defrag-whole-gpu-reserve", "0.2"]) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("firstfit"))
    assert row[-2:] == ["1", "1"]  # defragged, moves
    assert (
        "whole-GPU requests moved others only if the memory slices left free held 0.2 mean "
        "request lifetimes of the smaller requests' demand (slices asked per second over the "
        "last 0.4 lifetimes)" in out
    )
