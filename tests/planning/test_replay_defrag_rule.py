"""``defrag_whole_gpu_below``: whole-GPU requests defragment only below a memory use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driver.errors import ConfigError
from instaslice import cli
from instaslice.planning.replay import replay
from tests.planning.test_replay_defrag import ONE_MOVE, TWO_A100, _counts, _trace, _trace_file

# First-fit: the 1g takes GPU 0 and the first 4g GPU 1; the second 4g fits only if the 1g moves to
# GPU 1, with 5 of the 16 memory slices in use (31.25%).
SMALL_AFTER_MOVE = _trace((0, "1g.5gb", 100), (1, "4g.20gb", 100), (2, "4g.20gb", 100))


def test_a_whole_gpu_request_does_not_defragment_at_or_above_the_limit() -> None:
    # ONE_MOVE's first 7g arrives with 5 of 16 memory slices in use: 5 >= 0.3 * 16 = 4.8.
    blocked = replay(
        ONE_MOVE,
        TWO_A100,
        policy="firstfit",
        defrag_moves=1,
        defrag_whole_gpu_below=0.3,
        check_invariants=True,
    )
    assert _counts(blocked) == (4, 2, 0, 0, 0)  # as without moves: both 7g rejected, no search
    assert blocked.defrag_whole_gpu_below == 0.3


@pytest.mark.parametrize("below", [0.35, 1.0])
def test_a_whole_gpu_request_defragments_below_the_limit(below: float) -> None:
    allowed = replay(
        ONE_MOVE,
        TWO_A100,
        policy="firstfit",
        defrag_moves=1,
        defrag_whole_gpu_below=below,
        check_invariants=True,
    )
    plain = replay(ONE_MOVE, TWO_A100, policy="firstfit", defrag_moves=1)
    assert _counts(allowed) == _counts(plain) == (5, 1, 1, 1, 1)


def test_smaller_requests_defragment_at_any_use() -> None:
    without = replay(SMALL_AFTER_MOVE, TWO_A100, policy="firstfit")
    assert (without.accepted, without.rejected) == (2, 1)
    low = replay(
        SMALL_AFTER_MOVE,
        TWO_A100,
        policy="firstfit",
        defrag_moves=1,
        defrag_whole_gpu_below=0.01,
        check_invariants=True,
    )
    assert _counts(low) == (3, 0, 1, 1, 1)


def test_the_limit_is_off_by_default() -> None:
    result = replay(ONE_MOVE, TWO_A100, policy="firstfit", defrag_moves=1)
    assert result.defrag_whole_gpu_below is None


@pytest.mark.parametrize(
    ("moves", "below", "message"),
    [
        (0, 0.5, "needs defragmentation on"),
        (1, 0.0, "more than 0 and at most 1, got 0.0"),
        (1, 1.5, "more than 0 and at most 1, got 1.5"),
        (1, float("nan"), "got nan"),
    ],
)
def test_bad_limits_are_refused(moves: int, below: float, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        replay(
            ONE_MOVE,
            TWO_A100,
            policy="firstfit",
            defrag_moves=moves,
            defrag_whole_gpu_below=below,
        )


# ------------------------------------------------------------------------------------ the CLI


def _argv(tmp_path: Path) -> list[str]:
    trace = str(_trace_file(tmp_path))
    return ["simulate", "--gpus", "1x2xA100-40GB", "--trace", trace, "--policy", "firstfit"]


@pytest.mark.parametrize("percent", ["0", "-5", "100.5", "nan"])
def test_cli_refuses_percentages_out_of_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], percent: str
) -> None:
    argv = [*_argv(tmp_path), "--defrag-on-reject", "1", "--defrag-whole-gpu-below", percent]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("instaslice simulate: --defrag-whole-gpu-below is a percentage")
    assert err.rstrip().endswith(f"got {float(percent):g} (see instaslice simulate --help)")


def test_cli_refuses_the_limit_without_defragmentation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*_argv(tmp_path), "--defrag-whole-gpu-below", "90"]) == 2
    assert "needs --defrag-on-reject K" in capsys.readouterr().err


def test_cli_json_has_the_limit_only_when_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*_argv(tmp_path), "--json", "--defrag-on-reject", "1"]
    assert cli.main(argv) == 0
    plain = json.loads(capsys.readouterr().out)["policies"]["firstfit"]
    assert "defrag_whole_gpu_below" not in plain
    assert cli.main([*argv, "--defrag-whole-gpu-below", "30"]) == 0
    limited = json.loads(capsys.readouterr().out)["policies"]["firstfit"]
    assert set(limited) - set(plain) == {"defrag_whole_gpu_below"}
    assert limited["defrag_whole_gpu_below"] == 0.3
    counts = [limited[k] for k in ("accepted", "rejected", "defragged", "moves")]
    assert counts == [4, 2, 0, 0]


def test_cli_text_notes_the_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*_argv(tmp_path), "--defrag-on-reject", "1"]
    assert cli.main(argv) == 0
    assert "whole-GPU" not in capsys.readouterr().out
    assert cli.main([*argv, "--defrag-whole-gpu-below", "35"]) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("firstfit"))
    assert row[-2:] == ["1", "1"]
    assert "whole-GPU requests moved others only below 35% of memory slices in use;" in out
    assert "reject fewer than the floor" in out
