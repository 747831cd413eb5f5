"""``python -m bench preemption``: the fewest victims the MIG layout allows, what a preemptor's
hold annotation and the watches tell, its stages, evictions counted twice, and the one-line skip
when no real control plane is built (the benchmark itself needs the stack and runs by hand)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from api.names import HOLD_ANNOTATION, SCHEDULING_GATE
from bench.__main__ import main
from bench.preemptiontimeline import (
    PodSeen,
    Seen,
    evictions_from_events,
    minimal_victims,
    parse_hold,
    per_gpu,
    stage_figures,
    stage_times,
)
from driver.cluster.port import JsonObject


def test_bench_preemption_skips_with_one_line_without_the_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("INSTASLICE_REALSTACK", str(tmp_path / "no-k8s"))
    assert main(["--out", str(tmp_path), "preemption", "--quick"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("bench preemption: skipped: no real control plane built at ")
    assert json.loads((tmp_path / "preemption.json").read_text())["skipped"]


@pytest.mark.parametrize(
    ("fill", "ask", "fewest", "fill_per_gpu"),
    [
        ("3g.20gb", "3g.20gb", 1, 2),
        ("1g.5gb", "3g.20gb", 3, 7),  # start 4 covers 1g.5gb at 4, 5, 6; start 0 four of them
        ("3g.20gb", "7g.40gb", 2, 2),
    ],
    ids=["3g-among-3g", "3g-among-1g", "7g-among-3g"],
)
def test_the_fewest_victims_follow_the_mig_layout(
    fill: str, ask: str, fewest: int, fill_per_gpu: int
) -> None:
    assert minimal_victims(model="A100-40GB", fill=fill, ask=ask) == fewest
    assert per_gpu(model="A100-40GB", profile=fill) == fill_per_gpu


def _hold(*, since: str, victims: list[str], kind: str = "preemption") -> str:
    body = {"kind": kind, "node": "gpu-node-003", "gpus": [5], "since": since, "victims": victims}
    return json.dumps(body)


@pytest.mark.parametrize(
    ("text", "victims"),
    [
        (_hold(since="2026-12-07T10:00:00Z", victims=["bench/low-00007"]), ("low-00007",)),
        (_hold(since="2026-12-07T10:00:00Z", victims=[], kind="reservation"), None),
        ("{not json", None),
        ('["a list"]', None),
    ],
    ids=["preemption", "reservation", "junk", "not-an-object"],
)
def test_only_a_preemption_hold_annotation_is_read(
    text: str, victims: tuple[str, ...] | None
) -> None:
    hold = parse_hold(text, seen=1.0)
    assert (hold.victims if hold else None) == victims


def _pod(name: str, *, gated: bool = False, node: str = "", hold: str = "") -> JsonObject:
    pod: JsonObject = {"metadata": {"name": name, "annotations": {}}, "spec": {}}
    if gated:
        pod["spec"]["schedulingGates"] = [{"name": SCHEDULING_GATE}]
    if node:
        pod["spec"]["nodeName"] = node
    if hold:
        pod["metadata"]["annotations"][HOLD_ANNOTATION] = hold
    return pod


def _claim(name: str, *, allocated: bool) -> JsonObject:
    return {"metadata": {"name": name}, "status": {"allocation": {"x": 1}} if allocated else {}}


def test_a_preemptors_way_is_split_into_stages_in_the_order_it_was_seen() -> None:
    seen = Seen()
    hold = _hold(since="2026-12-07T10:00:00Z", victims=["bench/low-1", "bench/low-2"])
    seen.pod(_pod("low-1", node="n"), now=0.0)
    seen.pod(_pod("low-2", node="n"), now=0.0)
    for name in ("low-1", "low-2"):
        seen.claim(_claim(name, allocated=True), now=0.0)
    assert not seen.pod(_pod("high", gated=True), now=10.0)
    seen.pods["high"].sent, seen.pods["high"].created = 9.9, 10.0
    seen.pod(_pod("high", gated=True, hold=hold), now=10.5)  # decided
    seen.pod_gone("low-1", now=10.6)
    seen.pod_gone("low-2", now=10.8)  # evicted: the last victim gone
    seen.claim(_claim("low-2", allocated=False), now=11.0)
    seen.claim(_claim("low-1", allocated=False), now=11.5)  # freed: the last claim deallocated
    seen.claim(_claim("high", allocated=True), now=11.6)
    seen.pod(_pod("high", hold=hold), now=11.8)  # ungated
    assert seen.pod(_pod("high", node="n", hold=hold), now=12.4)  # bound, seen just now
    assert not seen.pod(_pod("high", node="n", hold=hold), now=13.0)
    spent = stage_times(seen, "high")
    assert spent == pytest.approx(
        {"create": 0.1, "decide": 0.5, "evict": 0.3, "free": 0.7, "allocate": 0.1,
         "ungate": 0.2, "bind": 0.6}
    )  # fmt: skip
    assert sum(spent.values()) == pytest.approx(12.4 - 9.9)
    assert len(seen.pods["high"].holds) == 1  # the same hold seen again is one preemption
    figures = stage_figures([spent, {"bind": 2.0}])
    assert figures["bind"] == {"p50_s": 1.3, "max_s": 2.0}
    assert figures["free"] == {"p50_s": 0.7, "max_s": 0.7}


def test_a_victim_never_seen_gone_leaves_its_stages_out() -> None:
    seen = Seen()
    hold = _hold(since="2026-12-07T10:00:00Z", victims=["bench/low-1"])
    seen.pod(_pod("low-1", node="n"), now=0.0)
    seen.pods["high"] = PodSeen(sent=1.0, created=1.1)
    seen.pod(_pod("high", gated=True, hold=hold), now=1.5)
    seen.pod(_pod("high", node="n", hold=hold), now=3.0)  # placed on other room
    spent = stage_times(seen, "high")
    assert "evict" not in spent
    assert "free" not in spent
    assert spent["ungate"] == pytest.approx(1.5)
    assert stage_times(seen, "never-sent") == {}


def _event(uid: str, name: str, preemptor: str, *, count: int = 1) -> JsonObject:
    return {
        "reason": "Preempted",
        "count": count,
        "involvedObject": {"kind": "Pod", "uid": uid, "name": name},
        "message": f"evicted by InstaSlice for pod bench/{preemptor} (priority 1000; this pod's "
        "priority 0), which needs MIG slices on node gpu-node-001",
    }


def test_evictions_are_counted_per_victim_and_a_second_one_is_named() -> None:
    events = [
        _event("u1", "low-1", "high-a-000"),
        _event("u2", "low-2", "high-a-001"),
        _event("u3", "low-3", "high-b-000", count=2),  # the recorder bumped a repeat
        _event("u2", "low-2", "high-b-001"),  # the same pod for a second preemptor
        {"reason": "Scheduled", "involvedObject": {"uid": "u9"}},
    ]
    found = evictions_from_events(events)
    assert found["victims"] == 3
    assert found["events"] == 5
    assert found["evicted_more_than_once"] == ["low-2", "low-3"]
    assert found["by_preemptor"]["high-b-001"] == ["low-2"]
