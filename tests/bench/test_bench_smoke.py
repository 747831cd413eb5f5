"""The benchmark runner and the placement benchmark run end to end at a tiny size.

Only the shape of the JSON is checked — never timings, which depend on the machine.
"""

import json
import sys
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


def test_webhook_bench_quick_measures_our_server_and_a_stand_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the stand-in's command line (-cert C -key K -addr H:P), served by our own server here
    stub = tmp_path / "stub"
    stub.write_text(
        "#!/bin/sh\n"
        'certs=$(dirname "$2"); port=${6##*:}\n'
        f'exec {sys.executable} -m bench.webhook serve "$certs" "$port"\n'
    )
    stub.chmod(0o755)
    assert main(["--quick", "--out", str(tmp_path), "webhook", "--webhook-stub", str(stub)]) == 0
    result = json.loads((tmp_path / "webhook.json").read_text())
    assert [r["server"] for r in result["rounds"]] == ["ours", "stub"]
    for r in result["rounds"]:
        assert r["reviews"] == 64  # every one answered 200 with the gate's patch
        assert r["cpu_ms_per_review"] > 0
        assert 0 < r["p50_ms"] <= r["p99_ms"]
    assert result["cpu_ratio_median"] > 0
    assert "CPU per review, ours / the Go stand-in" in capsys.readouterr().out
