"""The benchmark runner and the placement benchmark run end to end at a tiny size.

Only the shape of the JSON is checked — never timings, which depend on the machine.
"""

import json
from pathlib import Path

import pytest

from bench.__main__ import BENCHMARKS, main

RUN_KEYS = {
    "nodes",
    "policy",
    "load",
    "decisions",
    "decisions_per_s",
    "p50_us",
    "p99_us",
    "peak_rss_mb",
    "acceptance_rate",
    "stranded_rate",
}


def test_placement_bench_quick_writes_its_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--quick", "--out", str(tmp_path), "placement"]) == 0
    result = json.loads((tmp_path / "placement.json").read_text())
    assert result["benchmark"] == "placement"
    assert result["quick"] is True
    assert {r["policy"] for r in result["runs"]} == {"firstfit", "bestfit"}
    for run in result["runs"]:
        assert set(run) >= RUN_KEYS
        assert run["decisions"] > 0
        assert 0.0 <= run["acceptance_rate"] <= 1.0
        assert 0.0 <= run["stranded_rate"] <= 1.0 - run["acceptance_rate"] + 1e-9
    out = capsys.readouterr().out
    assert "decisions/s" in out
    assert "bestfit" in out


def test_unknown_benchmark_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["no-such-bench"])
    assert "unknown benchmark" in capsys.readouterr().err
    assert "placement" in BENCHMARKS
