"""Defragmentation on rejection in the replay: who moves, where they are released, and the CLI."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pytest

from driver.errors import ConfigError
from driver.mig.catalog import gpu_model
from driver.placement import POLICIES, DeviceAssignment, Engine, Placed, PodRequest
from instaslice import cli
from instaslice.planning import limits
from instaslice.planning.defrag import DefragPlan, NoPlan, plan_defrag
from instaslice.planning.figures import ReplayResult
from instaslice.planning.fleet import parse_fleet
from instaslice.planning.replay import replay
from instaslice.planning.running import RunningRequests, occupancy_problems
from instaslice.planning.trace import TraceRequest
from tests.planning import test_decisions

TWO_A100 = parse_fleet("1x2xA100-40GB")
A100 = gpu_model("A100-40GB")


def _trace(*items: tuple[float, str, float]) -> list[TraceRequest]:
    return [
        TraceRequest(t=t, profile=profile, duration=duration, line=line)
        for line, (t, profile, duration) in enumerate(items, start=1)
    ]


# First-fit: the 1g takes GPU 0 at start 0, so the 4g goes to GPU 1 and no 7g fits at t=2. Moving
# the 1g to GPU 1 (start 4) frees GPU 0. The second 7g fills GPU 0 again after the first leaves;
# the 3g at t=99 needs GPU 1 at start 4, where the moved 1g is until its own departure at t=100.
ONE_MOVE = _trace(
    (0, "1g.5gb", 100),
    (1, "4g.20gb", 100),
    (2, "7g.40gb", 10),
    (20, "7g.40gb", 1000),
    (99, "3g.20gb", 1),
    (100.5, "3g.20gb", 1),
)

# Two 1g on GPU 0, a 4g on GPU 1: a 7g fits only if both 1g move (GPU 1's 4g can go nowhere).
TWO_MOVES = _trace((0, "1g.5gb", 50), (1, "1g.5gb", 50), (2, "4g.20gb", 50), (3, "7g.40gb", 10))


def _counts(result: ReplayResult) -> tuple[int, ...]:
    return (
        result.accepted,
        result.rejected,
        result.defragged,
        result.moves,
        result.defrag_searched,
    )


def test_a_rejected_request_is_admitted_after_one_move() -> None:
    without = replay(ONE_MOVE, TWO_A100, policy="firstfit", check_invariants=True)
    assert (without.accepted, without.rejected) == (4, 2)  # both 7g
    moved = replay(ONE_MOVE, TWO_A100, policy="firstfit", defrag_moves=1, check_invariants=True)
    # The first 7g is admitted by moving the 1g; the 3g at t=99 is rejected (the moved 1g is still
    # on GPU 1, and no plan is searched: 3 free slices cannot hold 4), the one at t=100.5 fits.
    assert _counts(moved) == (5, 1, 1, 1, 1)
    assert (moved.stranded, moved.defrag_budget_hit, moved.defrag_moves) == (0, 0, 1)


def test_the_moved_request_is_released_where_it_moved_to() -> None:
    # Had the replay released the 1g where it started (GPU 0 start 0, held by the second 7g by
    # then), the engine would refuse the release, or the 3g at t=100.5 would not fit.
    result = replay(ONE_MOVE, TWO_A100, policy="firstfit", defrag_moves=1, timeline=True)
    assert result.timeline is not None
    # Memory slices in use after each arrival: 1, 1+4, 1+4+8, 4+1+8, same, 4+8+4 (the 1g gone).
    assert result.timeline.used_slices == (1, 5, 13, 13, 13, 16)


def test_fewer_moves_than_needed_still_reject() -> None:
    one = replay(TWO_MOVES, TWO_A100, policy="firstfit", defrag_moves=1, check_invariants=True)
    assert _counts(one) == (3, 1, 0, 0, 1)
    two = replay(TWO_MOVES, TWO_A100, policy="firstfit", defrag_moves=2, check_invariants=True)
    assert _counts(two) == (4, 0, 1, 2, 1)


@pytest.mark.parametrize("policy", POLICIES)
def test_defrag_off_keeps_the_recorded_decisions(policy: str) -> None:
    """Rejections equal the pinned decisions of ``test_decisions``."""
    fleet = parse_fleet(test_decisions.FLEET)
    trace = test_decisions._trace(fleet)
    recorded = gzip.decompress(test_decisions._path(policy).read_bytes()).decode().splitlines()
    result = replay(trace, fleet, policy=policy)
    assert result.rejected == sum(line == "-" for line in recorded)
    assert result.accepted == len(recorded) - result.rejected
    assert _counts(result)[2:] == (0, 0, 0)
    assert dataclasses.replace(result, wall_s=0) == dataclasses.replace(
        replay(trace, fleet, policy=policy, defrag_moves=0), wall_s=0
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_occupancy_holds_with_moves_across_models_and_multi_slice_requests(policy: str) -> None:
    # Two models (1g.10gb on both: a moved request can change model) and requests of two slices on
    # one GPU (some admitted by a plan); after every arrival the occupancy is compared with the
    # running requests, and each request's slices must share a GPU.
    fleet = parse_fleet(test_decisions.FLEET)
    trace = test_decisions._trace(fleet)[:1200]
    off = replay(trace, fleet, policy=policy)
    on = replay(trace, fleet, policy=policy, defrag_moves=2, check_invariants=True)
    assert on.defragged > 0
    assert on.defragged <= on.moves <= 2 * on.defragged
    assert on.accepted + on.rejected == on.requests == 1200
    assert on.accepted > off.accepted


def _running(*slots: tuple[int, str, int]) -> tuple[Engine, RunningRequests]:
    """An engine on ``TWO_A100`` holding one running request per (GPU, profile, start)."""
    engine = Engine(policy="firstfit")
    for node in TWO_A100.nodes:
        engine.set_node(node)
    running = RunningRequests()
    for sequence, (gpu, profile, start) in enumerate(slots):
        size = A100.profile(profile).placement_at(start).size
        placed = Placed(
            node="node-0000",
            assignments=(
                DeviceAssignment(request="mig", node="node-0000", gpu_index=gpu, profile=profile,
                                 start=start, size=size, media=False),
            ),
        )  # fmt: skip
        engine.commit(placed)
        running.add(sequence, placed, size)
    return engine, running


def test_a_request_of_several_slices_gets_targets_on_one_gpu() -> None:
    # GPU 0 has start 6 free, GPU 1 start 5: two 1g.5gb fit, but not on one GPU, as a pod asking
    # 2 x 1g.5gb (all on one GPU) needs; moving GPU 1's 1g at 4 or 6 to GPU 0 makes room there.
    engine, running = _running(
        (0, "4g.20gb", 0), (0, "2g.10gb", 4), (1, "4g.20gb", 0), (1, "1g.5gb", 4), (1, "1g.5gb", 6)
    )
    units = running.units()
    spread = plan_defrag(engine, units, profile="1g.5gb", count=2)
    assert isinstance(spread, DefragPlan)
    assert spread.moves == ()  # two GPUs, nothing to move: not what the pod asks
    together = plan_defrag(engine, units, profile="1g.5gb", count=2, one_gpu=True)
    assert isinstance(together, DefragPlan)
    assert {(t.node, t.gpu_index) for t in together.targets} == {("node-0000", 1)}
    assert len(together.moves) == 1
    assert together.moves[0].to[0].gpu_index == 0


def test_plans_larger_than_max_units_are_not_tried() -> None:
    engine, running = _running((0, "1g.5gb", 0), (0, "1g.5gb", 1), (1, "4g.20gb", 0))
    unbounded = plan_defrag(engine, running.units(), profile="7g.40gb")
    assert isinstance(unbounded, DefragPlan)
    assert len(unbounded.moves) == 2
    bounded = plan_defrag(engine, running.units(), profile="7g.40gb", max_units=1)
    assert isinstance(bounded, NoPlan)
    assert bounded.reason == "no set of at most 1 pods can be moved so that 1 x 7g.40gb fit"
    assert not bounded.budget_exhausted


def test_the_occupancy_check_finds_strays_and_overlaps() -> None:
    engine = Engine(policy="firstfit")
    for node in TWO_A100.nodes:
        engine.set_node(node)
    placed = engine.place(PodRequest.single("3g.20gb"))
    assert isinstance(placed, Placed)
    assert occupancy_problems(engine, [placed])  # placed, not committed
    engine.commit(placed)
    assert occupancy_problems(engine, [placed]) == []
    assert occupancy_problems(engine, [])  # the engine holds a slice no request has
    problems = occupancy_problems(engine, [placed, placed])
    assert any("overlaps" in p for p in problems)


def test_defrag_and_queue_or_negative_moves_are_refused() -> None:
    with pytest.raises(ConfigError, match="do not combine"):
        replay(ONE_MOVE, TWO_A100, policy="firstfit", queue=True, defrag_moves=1)
    with pytest.raises(ConfigError, match="at least 0"):
        replay(ONE_MOVE, TWO_A100, policy="firstfit", defrag_moves=-1)


# ------------------------------------------------------------------- the replay's search budget


BUSY_FLEET = parse_fleet(test_decisions.FLEET)
BUSY = test_decisions._trace(BUSY_FLEET)[:1200]
"""A trace whose replay by first-fit with at most 2 moves searches 53 times (1,303,521 search
steps, 36 requests admitted by a plan)."""


def _searched(budget: int | None) -> ReplayResult:
    return dataclasses.replace(
        replay(
            BUSY,
            BUSY_FLEET,
            policy="firstfit",
            defrag_moves=2,
            defrag_search_steps=budget,
            check_invariants=True,
        ),
        wall_s=0,
    )


def test_a_search_spends_exactly_the_steps_it_reports() -> None:
    # Given exactly the steps it spent unbounded, a search finds the same plan; one step fewer and
    # it stops where the next step would pass the allowance.
    engine, running = _running((0, "1g.5gb", 0), (0, "1g.5gb", 1), (1, "4g.20gb", 0))
    units = running.units()
    unbounded = plan_defrag(engine, units, profile="7g.40gb")
    assert isinstance(unbounded, DefragPlan)
    assert unbounded.search_steps > 0
    exact = plan_defrag(engine, units, profile="7g.40gb", max_search_steps=unbounded.search_steps)
    assert exact == unbounded
    short = plan_defrag(
        engine, units, profile="7g.40gb", max_search_steps=unbounded.search_steps - 1
    )
    assert isinstance(short, NoPlan)
    assert short.allowance_spent
    assert short.budget_exhausted
    assert short.search_steps <= unbounded.search_steps - 1
    with pytest.raises(ConfigError, match="at least 0"):
        plan_defrag(engine, units, profile="7g.40gb", max_search_steps=-1)


def test_the_replay_budget_is_exact_and_deterministic() -> None:
    full = _searched(None)
    assert not full.defrag_budget_spent
    assert full.defrag_search_budget == limits.MAX_DEFRAG_SEARCH_STEPS_PER_REPLAY
    assert (full.defrag_searched, full.defrag_search_steps) == (53, 1_303_521)
    budget = full.defrag_search_steps // 2
    cut = _searched(budget)
    assert cut == _searched(budget)  # every figure, run after run
    assert cut.defrag_budget_spent
    # Never over; short of it by less than the step the cut search could not pay for (a read of
    # every GPU offering the profile at most).
    assert budget - 50 * 60 < cut.defrag_search_steps <= budget
    assert cut.defrag_searched < full.defrag_searched


def test_a_spent_budget_leaves_later_rejections_unsearched_and_every_request_counted() -> None:
    full = _searched(None)
    cut = _searched(full.defrag_search_steps // 4)
    assert cut.defrag_budget_spent
    assert cut.defrag_unsearched > 0
    assert cut.accepted + cut.rejected == cut.requests == 1200
    assert cut.defrag_searched + cut.defrag_unsearched <= full.defrag_searched + cut.rejected


def test_a_smaller_budget_admits_fewer_never_more(monkeypatch: pytest.MonkeyPatch) -> None:
    full = _searched(None)
    plain = replay(BUSY, BUSY_FLEET, policy="firstfit")
    monkeypatch.setattr(limits, "MAX_DEFRAG_SEARCH_STEPS_PER_REPLAY", full.defrag_search_steps // 4)
    small = _searched(None)
    assert small.defrag_search_budget == full.defrag_search_steps // 4
    assert 0 < small.defragged < full.defragged
    assert plain.accepted < small.accepted < full.accepted
    # No steps at all: no search, and the decisions of defragmentation off.
    none = _searched(0)
    assert (none.defrag_searched, none.defragged, none.moves, none.defrag_search_steps) == (
        0,
        0,
        0,
        0,
    )
    assert none.defrag_unsearched > 0
    assert (none.accepted, none.rejected, none.stranded) == (
        plain.accepted,
        plain.rejected,
        plain.stranded,
    )
    with pytest.raises(ConfigError, match="at least 0"):
        replay(BUSY, BUSY_FLEET, policy="firstfit", defrag_moves=1, defrag_search_steps=-1)


# ------------------------------------------------------------------------------------ the CLI


def _trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text(
        "".join(
            json.dumps({"t": r.t, "profile": r.profile, "duration": r.duration}) + "\n"
            for r in ONE_MOVE
        )
    )
    return path


@pytest.mark.parametrize("moves", ["0", "-2"], ids=["zero", "negative"])
def test_cli_refuses_fewer_than_one_move(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], moves: str
) -> None:
    argv = ["simulate", "--gpus", "1x2xA100-40GB", "--trace", str(_trace_file(tmp_path))]
    assert cli.main([*argv, "--defrag-on-reject", moves]) == 2
    err = capsys.readouterr().err
    assert err.startswith("instaslice simulate: --defrag-on-reject must be at least 1")
    assert err.rstrip().endswith(f"got {moves} (see instaslice simulate --help)")


def test_cli_refuses_defrag_with_the_queue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--gpus", "1x2xA100-40GB", "--trace", str(_trace_file(tmp_path))]
    assert cli.main([*argv, "--defrag-on-reject", "1", "--queue"]) == 2
    assert "do not combine" in capsys.readouterr().err


def test_cli_json_has_defrag_fields_only_with_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--gpus", "1x2xA100-40GB", "--trace", str(_trace_file(tmp_path))]
    argv += ["--json", "--policy", "firstfit"]
    assert cli.main(argv) == 0
    plain = json.loads(capsys.readouterr().out)["policies"]["firstfit"]
    assert set(plain) == {
        "requests",
        "accepted",
        "rejected",
        "stranded",
        "mean_utilization",
        "peak_utilization",
        "wall_s",
    }
    assert cli.main([*argv, "--defrag-on-reject", "1"]) == 0
    moved = json.loads(capsys.readouterr().out)["policies"]["firstfit"]
    assert set(moved) - set(plain) == {
        "defrag_moves",
        "defragged",
        "moves",
        "defrag_budget_hit",
        "defrag_searched",
        "defrag_search_steps",
        "defrag_budget_spent",
        "defrag_unsearched",
    }
    assert (moved["defrag_budget_spent"], moved["defrag_unsearched"]) == (False, 0)
    counts = [moved[k] for k in ("accepted", "rejected", "defragged", "moves")]
    assert counts == [5, 1, 1, 1]


def test_cli_text_has_defrag_columns_only_with_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--gpus", "1x2xA100-40GB", "--trace", str(_trace_file(tmp_path))]
    argv += ["--policy", "firstfit"]
    assert cli.main(argv) == 0
    assert "defragged" not in capsys.readouterr().out
    assert cli.main([*argv, "--defrag-on-reject", "2"]) == 0
    out = capsys.readouterr().out
    header = next(line.split() for line in out.splitlines() if line.startswith("policy"))
    row = next(line.split() for line in out.splitlines() if line.startswith("firstfit"))
    assert header[-2:] == ["defragged", "moves"]
    assert row[-2:] == ["1", "1"]
    assert "evicted to restart elsewhere" in out


def test_cli_says_when_the_search_budget_was_spent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["simulate", "--gpus", "1x2xA100-40GB", "--trace", str(_trace_file(tmp_path))]
    argv += ["--policy", "firstfit", "--defrag-on-reject", "1"]
    assert cli.main(argv) == 0
    assert "search budget" not in capsys.readouterr().out
    monkeypatch.setattr(limits, "MAX_DEFRAG_SEARCH_STEPS_PER_REPLAY", 0)
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("firstfit"))
    assert row[2:4] == ["4", "2"]  # both 7g rejected, as without defragmentation
    assert (
        "firstfit: the defrag search budget for this replay (0 search steps) was spent after 0 "
        "searches: 2 later rejections were not searched" in out
    )
    assert cli.main([*argv, "--json"]) == 0
    moved = json.loads(capsys.readouterr().out)["policies"]["firstfit"]
    assert (moved["defrag_budget_spent"], moved["defrag_unsearched"]) == (True, 2)
    assert (moved["defrag_searched"], moved["defrag_search_steps"]) == (0, 0)


def test_simulate_help_states_the_search_budget(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"{limits.MAX_DEFRAG_SEARCH_STEPS_PER_REPLAY:,} search steps per policy" in help_text
