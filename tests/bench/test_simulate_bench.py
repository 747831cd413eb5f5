"""The capacity-planning benchmark: its kept traces are what their recorded parameters make."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.__main__ import main
from bench.simulate import HELD_OUT, TRACES, trace_path
from instaslice.planning.fleet import parse_fleet
from instaslice.planning.trace import parse_mix, read_trace, synthesize


@pytest.mark.parametrize("name", [*list(TRACES)[:2], *list(HELD_OUT)[:1], *list(HELD_OUT)[-1:]])
def test_kept_traces_are_reproducible(name: str) -> None:
    spec = (TRACES | HELD_OUT)[name]
    made = synthesize(
        fleet=parse_fleet(spec.gpus),
        mix=parse_mix(spec.mix),
        load=spec.load,
        events=spec.events,
        seed=spec.seed,
        mean_duration=spec.mean_duration,
    )
    kept = read_trace(trace_path(name))
    assert [(r.t, r.profile, r.count, r.duration) for r in kept] == [
        (r.t, r.profile, r.count, r.duration) for r in made
    ]


def test_every_kept_trace_exists() -> None:
    for name in TRACES | HELD_OUT:
        assert trace_path(name).stat().st_size > 0


def test_simulate_bench_quick_writes_its_figures(tmp_path: Path) -> None:
    assert main(["--quick", "--out", str(tmp_path), "simulate"]) == 0
    result = json.loads((tmp_path / "simulate.json").read_text())
    (comparison,) = result["comparisons"]
    assert all(n >= comparison["floor"] for n in comparison["rejected"].values())
    assert {s["policy"] for s in result["speed"]} >= {"firstfit", "bestfit", "floor"}


def test_simulate_bench_quick_with_defrag_moves_adds_its_rows(tmp_path: Path) -> None:
    argv = ["--quick", "--out", str(tmp_path), "simulate", "--defrag-moves", "1,2"]
    assert main(argv) == 0
    (comparison,) = json.loads((tmp_path / "simulate.json").read_text())["comparisons"]
    rows = comparison["defrag"]
    assert [(d["moves_max"], d["policy"]) for d in rows] == [
        (k, p) for k in (1, 2) for p in ("firstfit", "bestfit", "scarcity")
    ]
    for d in rows:
        assert d["defragged"] <= d["moves"] <= d["moves_max"] * d["defragged"]
        assert comparison["floor"] <= d["rejected"]
        # the bench's own budget, not the CLI's cap: every rejection that could be searched was
        assert d["unsearched"] == 0
        assert d["search_steps"] > 0 or d["searched"] == 0


def test_simulate_bench_whole_gpu_limit_is_in_the_rows_only_when_given(tmp_path: Path) -> None:
    argv = ["--quick", "--out", str(tmp_path), "simulate", "--defrag-moves", "1"]
    assert main([*argv, "--defrag-whole-gpu-below", "50"]) == 0
    (comparison,) = json.loads((tmp_path / "simulate.json").read_text())["comparisons"]
    assert {d["whole_gpu_below"] for d in comparison["defrag"]} == {0.5}
    assert main(argv) == 0
    (comparison,) = json.loads((tmp_path / "simulate.json").read_text())["comparisons"]
    assert all("whole_gpu_below" not in d for d in comparison["defrag"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--defrag-whole-gpu-below", "50"], "needs --defrag-moves"),
        (["--defrag-moves", "1", "--defrag-whole-gpu-below", "0"], "got 0"),
    ],
)
def test_simulate_bench_refuses_bad_whole_gpu_limits(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    with pytest.raises(SystemExit, match=message):
        main(["--quick", "--out", str(tmp_path), "simulate", *extra])


def test_simulate_bench_whole_gpu_reserve_is_in_the_rows_only_when_given(tmp_path: Path) -> None:
    argv = ["--quick", "--out", str(tmp_path), "simulate", "--defrag-moves", "1"]
    assert main([*argv, "--defrag-whole-gpu-reserve", "0.05"]) == 0
    (comparison,) = json.loads((tmp_path / "simulate.json").read_text())["comparisons"]
    assert {d["whole_gpu_reserve_lifetimes"] for d in comparison["defrag"]} == {0.05}
    assert main(argv) == 0
    (comparison,) = json.loads((tmp_path / "simulate.json").read_text())["comparisons"]
    assert all("whole_gpu_reserve_lifetimes" not in d for d in comparison["defrag"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--defrag-whole-gpu-reserve", "0.05"], "needs --defrag-moves"),
        (["--defrag-moves", "1", "--defrag-whole-gpu-reserve", "0"], "got 0"),
        (["--defrag-moves", "1", "--defrag-whole-gpu-reserve", "14"], "at most 1, got 14"),
        (["--defrag-moves", "1", "--defrag-whole-gpu-reserve", "nan"], "got nan"),
    ],
)
def test_simulate_bench_refuses_bad_whole_gpu_reserves(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    with pytest.raises(SystemExit, match=message):
        main(["--quick", "--out", str(tmp_path), "simulate", *extra])
