"""``python -m bench real``: its arithmetic on kube-apiserver's histogram, and the one-line skip
when no real control plane is built (the benchmark itself needs the stack and runs by hand)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import real
from bench.__main__ import main

SERIES = "apiserver_admission_webhook_admission_duration_seconds"
LABELS = 'name="pod-gate.instaslice.dev",operation="CREATE",rejected="false",type="admit"'
OTHER = 'name="someone-else.example.com",operation="CREATE",rejected="false",type="admit"'


def _metrics(buckets: dict[str, int], total: float, *, other: int = 0) -> str:
    lines = ["# HELP ignored", "# TYPE ignored histogram"]
    lines += [f'{SERIES}_bucket{{{LABELS},le="{le}"}} {count}' for le, count in buckets.items()]
    lines += [f"{SERIES}_sum{{{LABELS}}} {total}", f"{SERIES}_count{{{LABELS}}} {buckets['+Inf']}"]
    lines += [f'{SERIES}_bucket{{{OTHER},le="+Inf"}} {other}', f"{SERIES}_count{{{OTHER}}} {other}"]
    return "\n".join(lines) + "\n"


def test_the_webhook_histogram_is_read_for_our_webhook_only_and_differenced() -> None:
    before = real.webhook_histogram(
        _metrics({"0.005": 10, "0.025": 10, "0.1": 10, "+Inf": 10}, 0.03, other=500)
    )
    # 100 more calls: 50 under 5 ms, 48 in (5, 25] ms, 2 in (25, 100] ms, 0.9 s in all
    after = real.webhook_histogram(
        _metrics({"0.005": 60, "0.025": 108, "0.1": 110, "+Inf": 110}, 0.93, other=900)
    )
    delta = real.histogram_delta(before, after)
    assert delta["calls"] == 100
    assert delta["mean_ms"] == pytest.approx(9.0)
    assert delta["within_25ms"] == pytest.approx(0.98)
    assert delta["over_100ms"] == pytest.approx(0.0)
    assert delta["p50_ms"] == pytest.approx(5.0)  # the 50th call is the last one under 5 ms
    assert delta["p99_ms"] == pytest.approx(25 + 75 * 0.5)  # halfway through (25, 100] ms


def test_no_calls_means_no_latency_figures() -> None:
    same = real.webhook_histogram(_metrics({"0.005": 3, "+Inf": 3}, 0.01))
    assert real.histogram_delta(same, same) == {"calls": 0}


def test_bench_real_skips_with_one_line_without_the_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("INSTASLICE_REALSTACK", str(tmp_path / "no-k8s"))
    assert main(["--out", str(tmp_path), "real", "--pods", "5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("bench real: skipped: no real control plane built at ")
    assert json.loads((tmp_path / "real.json").read_text())["skipped"]
