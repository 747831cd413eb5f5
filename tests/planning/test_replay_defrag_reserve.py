"""``defrag_whole_gpu_reserve``: whole-GPU requests defragment only if the memory slices left free
hold some seconds of the smaller requests' recent demand (issue 17j)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from controller import cli
from driver.errors import ConfigError
from driver.planning.replay import DEMAND_WINDOW_S, ReplayResult, replay
from driver.planning.trace import TraceRequest
from tests.planning.test_replay_defrag import ONE_MOVE, TWO_A100, _trace, _trace_file
from tests.planning.test_replay_defrag_rule import SMALL_AFTER_MOVE

# ONE_MOVE's first 7g is rejected at t=2 with the 1g and the 4g (5 memory slices, both asked in
# the last 120 s) running on the 16 slices of two A100s: once admitted, 16 - 5 - 8 = 3 slices stay
# free, which hold 3 / (5 / 120) = 72 seconds of that demand.
HOLDS_S = 72.0


def _counts(result: ReplayResult) -> tuple[int, int, int, int, int]:
    return (
        result.accepted,
        result.rejected,
        result.defragged,
        result.moves,
        result.defrag_searched,
    )


def _replay(trace: list[TraceRequest], reserve: float | None) -> ReplayResult:
    return replay(
        trace,
        TWO_A100,
        policy="firstfit",
        defrag_moves=1,
        defrag_whole_gpu_reserve=reserve,
        check_invariants=True,
    )


def test_the_window_is_two_minutes() -> None:
    assert DEMAND_WINDOW_S == 120.0


@pytest.mark.parametrize("reserve", [1.0, HOLDS_S])
def test_a_whole_gpu_request_defragments_while_the_free_slices_hold_the_reserve(
    reserve: float,
) -> None:
    allowed = _replay(ONE_MOVE, reserve)
    plain = replay(ONE_MOVE, TWO_A100, policy="firstfit", defrag_moves=1)
    assert _counts(allowed) == _counts(plain) == (5, 1, 1, 1, 1)
    assert allowed.defrag_whole_gpu_reserve == reserve


@pytest.mark.parametrize("reserve", [HOLDS_S + 0.5, 1000.0])
def test_a_whole_gpu_request_does_not_defragment_beyond_the_reserve(reserve: float) -> None:
    # Both 7g are turned away without a search (the second at t=20, with the same demand).
    assert _counts(_replay(ONE_MOVE, reserve)) == (4, 2, 0, 0, 0)


def test_demand_older_than_the_window_is_forgotten() -> None:
    def seven_g_at(t: float) -> list[TraceRequest]:
        return _trace((0, "1g.5gb", 1000), (1, "4g.20gb", 1000), (t, "7g.40gb", 10))

    # At t=121 the 4g asked at t=1 still counts (3 free slices hold 3 / (4 / 120) = 90 s of it);
    # after t=121 nothing smaller arrived in the last 120 s, so any reserve is held.
    assert _counts(_replay(seven_g_at(121), 90.0)) == (3, 0, 1, 1, 1)
    assert _counts(_replay(seven_g_at(121), 91.0)) == (2, 1, 0, 0, 0)
    assert _counts(_replay(seven_g_at(121.5), 1e9)) == (3, 0, 1, 1, 1)


def test_smaller_requests_defragment_whatever_the_reserve() -> None:
    assert _counts(_replay(SMALL_AFTER_MOVE, 1e9)) == (3, 0, 1, 1, 1)


def test_the_reserve_is_off_by_default() -> None:
    result = replay(ONE_MOVE, TWO_A100, policy="firstfit", defrag_moves=1)
    assert result.defrag_whole_gpu_reserve is None


@pytest.mark.parametrize(
    ("below", "reserve", "counts"),
    [
        (0.35, HOLDS_S, (5, 1, 1, 1, 1)),
        (0.35, 100.0, (4, 2, 0, 0, 0)),  # the reserve refuses
        (0.3, HOLDS_S, (4, 2, 0, 0, 0)),  # the use limit refuses (5 of 16 in use)
    ],
)
def test_with_both_rules_both_must_allow(
    below: float, reserve: float, counts: tuple[int, ...]
) -> None:
    result = replay(
        ONE_MOVE,
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
        (0, 10.0, "needs defragmentation on"),
        (1, 0.0, "more than 0 and finite, got 0.0"),
        (1, -5.0, "got -5.0"),
        (1, math.inf, "got inf"),
        (1, math.nan, "got nan"),
    ],
)
def test_bad_reserves_are_refused(moves: int, reserve: float, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        replay(
            ONE_MOVE,
            TWO_A100,
            policy="firstfit",
            defrag_moves=moves,
            defrag_whole_gpu_reserve=reserve,
        )


# ------------------------------------------------------------------------------------ the CLI


def _argv(tmp_path: Path) -> list[str]:
    trace = str(_trace_file(tmp_path))
    return ["simulate", "--gpus", "1x2xA100-40GB", "--trace", trace, "--policy", "firstfit"]


@pytest.mark.parametrize("seconds", ["0", "-5", "inf", "nan"])
def test_cli_refuses_reserves_out_of_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seconds: str
) -> None:
    argv = [*_argv(tmp_path), "--defrag-on-reject", "1", "--defrag-whole-gpu-reserve", seconds]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("instaslice simulate: --defrag-whole-gpu-reserve is seconds")
    assert err.rstrip().endswith(f"got {float(seconds):g}")


def test_cli_refuses_the_reserve_without_defragmentation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*_argv(tmp_path), "--defrag-whole-gpu-reserve", "10"]) == 1
    assert "--defrag-whole-gpu-reserve needs --defrag-on-reject K" in capsys.readouterr().err


def test_cli_json_has_the_reserve_only_when_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*_argv(tmp_path), "--json", "--defrag-on-reject", "1"]
    assert cli.main(argv) == 0
    plain = json.loads(capsys.readouterr().out)["policies"]["firstfit"]
    assert "defrag_whole_gpu_reserve_s" not in plain
    assert cli.main([*argv, "--defrag-whole-gpu-reserve", "100"]) == 0
    reserved = json.loads(capsys.readouterr().out)["policies"]["firstfit"]
    assert set(reserved) - set(plain) == {"defrag_whole_gpu_reserve_s"}
    assert reserved["defrag_whole_gpu_reserve_s"] == 100.0
    counts = [reserved[k] for k in ("accepted", "rejected", "defragged", "moves")]
    assert counts == [4, 2, 0, 0]


def test_cli_text_notes_the_reserve(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*_argv(tmp_path), "--defrag-on-reject", "1"]
    assert cli.main(argv) == 0
    assert "demand" not in capsys.readouterr().out
    assert cli.main([*argv, "--defrag-whole-gpu-reserve", "72"]) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("firstfit"))
    assert row[-2:] == ["1", "1"]
    assert (
        "whole-GPU requests moved others only if the memory slices left free held 72 s of the "
        "smaller requests' demand (slices asked per second over the last 120 s)" in out
    )
