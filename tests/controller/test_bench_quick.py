"""``python -m bench controller --quick``: the benchmark runs end to end at a tiny size and writes
its figures. Only their shape and the correctness figures are checked — never timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.__main__ import BENCHMARKS, main


def test_controller_bench_quick_places_every_pod_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert BENCHMARKS["controller"] == "bench.controller"
    assert main(["--quick", "--out", str(tmp_path), "controller"]) == 0
    result = json.loads((tmp_path / "controller.json").read_text())
    assert result["benchmark"] == "controller"
    assert result["quick"] is True
    assert result["finished"] is True
    assert result["unplaced"] == 0
    assert result["overlaps"] == 0
    assert result["allocated"] == result["pods"]
    for key in ("pods_per_s", "latency_p50_s", "latency_p99_s", "latency_max_s", "creation_s"):
        assert isinstance(result[key], float)
    assert "pods/s placed and ungated" in capsys.readouterr().out
