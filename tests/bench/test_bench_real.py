"""``python -m bench real``: its arithmetic on kube-apiserver's and kube-scheduler's metrics, the
per-pod breakdown, py-spy summaries, and the one-line skip when no real control plane is built (the
benchmark itself needs the stack and runs by hand)."""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bench import real, realmetrics
from bench.__main__ import main
from bench.controllerstub import free_devices
from bench.realnodes import GPUS_PER_NODE, PROFILE, ReadyNodes, context_switches, gpus_of
from controller.metrics import ControllerMetrics, WebhookMetrics
from driver.cluster.kube import KubeClusterApi
from driver.cluster.port import NODES, PatchType
from driver.resourceslices import build_pool, complete_pools, parse_devices
from localcluster.apiserver import LocalApiServer
from localcluster.cluster.client import connect

SERIES = "apiserver_admission_webhook_admission_duration_seconds"
LABELS = 'name="claim-gate.instaslice.dev",operation="CREATE",rejected="false",type="admit"'
OTHER = 'name="someone-else.example.com",operation="CREATE",rejected="false",type="admit"'


def _metrics(buckets: dict[str, int], total: float, *, other: int = 0) -> str:
    lines = ["# HELP ignored", "# TYPE ignored histogram"]
    lines += [f'{SERIES}_bucket{{{LABELS},le="{le}"}} {count}' for le, count in buckets.items()]
    lines += [f"{SERIES}_sum{{{LABELS}}} {total}", f"{SERIES}_count{{{LABELS}}} {buckets['+Inf']}"]
    lines += [f'{SERIES}_bucket{{{OTHER},le="+Inf"}} {other}', f"{SERIES}_count{{{OTHER}}} {other}"]
    return "\n".join(lines) + "\n"


def test_the_webhook_histogram_is_read_for_our_webhook_only_and_differenced() -> None:
    before = realmetrics.webhook_histogram(
        _metrics({"0.005": 10, "0.025": 10, "0.1": 10, "+Inf": 10}, 0.03, other=500), real.WEBHOOKS
    )
    # 100 more calls: 50 under 5 ms, 48 in (5, 25] ms, 2 in (25, 100] ms, 0.9 s in all
    after = realmetrics.webhook_histogram(
        _metrics({"0.005": 60, "0.025": 108, "0.1": 110, "+Inf": 110}, 0.93, other=900),
        real.WEBHOOKS,
    )
    delta = realmetrics.histogram_delta(before, after)
    assert delta["calls"] == 100
    assert delta["mean_ms"] == pytest.approx(9.0)
    assert delta["within_25ms"] == pytest.approx(0.98)
    assert delta["over_100ms"] == pytest.approx(0.0)
    assert delta["p50_ms"] == pytest.approx(5.0)  # the 50th call is the last one under 5 ms
    assert delta["p99_ms"] == pytest.approx(25 + 75 * 0.5)  # halfway through (25, 100] ms


def test_no_calls_means_no_latency_figures() -> None:
    same = realmetrics.webhook_histogram(_metrics({"0.005": 3, "+Inf": 3}, 0.01), real.WEBHOOKS)
    assert realmetrics.histogram_delta(same, same) == {"calls": 0}


def test_bench_real_skips_with_one_line_without_the_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("INSTASLICE_REALSTACK", str(tmp_path / "no-k8s"))
    assert main(["--out", str(tmp_path), "real", "--pods", "5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("bench real: skipped: no real control plane built at ")
    assert json.loads((tmp_path / "real.json").read_text())["skipped"]


def test_the_breakdown_splits_each_pod_into_stages_and_names_what_the_tail_is_made_of() -> None:
    # 100 pods: 99 spend 0.1 s in each stage; pod-099 waits 5 s to be bound
    times = {
        f"pod-{i:03d}": {"sent": 0.0, "create": 0.1, "allocate": 0.2, "ungate": 0.3, "bind": 0.4}
        for i in range(100)
    }
    times["pod-099"]["bind"] = 5.3
    times["pod-098"]["allocate"] = 0.05  # seen before its create returned: counts as 0 s
    latencies = {pod: seen["bind"] - seen["sent"] for pod, seen in times.items()}
    figures = real.breakdown(times, latencies)
    assert figures["tail_pods"] == 1
    assert figures["bind"]["tail_mean_s"] == pytest.approx(5.0)
    assert figures["bind"]["p50_s"] == pytest.approx(0.1)
    assert figures["allocate"]["tail_mean_s"] == pytest.approx(0.1)
    assert figures["allocate"]["p50_s"] == pytest.approx(0.1)
    assert min(figures[stage]["p50_s"] for stage in real.STAGES) >= 0


def test_a_pod_never_bound_is_left_out_of_the_breakdown() -> None:
    times = {"pod-000": {"sent": 0.0, "create": 0.1}, "pod-001": {"sent": 0.0, "bind": 1.0}}
    figures = real.breakdown(times, {"pod-001": 1.0})
    assert figures["tail_pods"] == 1
    assert "create" not in figures
    assert figures["bind"]["p99_s"] == pytest.approx(1.0)


def test_metric_totals_sum_label_sets_of_one_name_only() -> None:
    metrics = "\n".join(
        [
            "# HELP rest_client_rate_limiter_duration_seconds_sum x",
            'rest_client_rate_limiter_duration_seconds_sum{host="a",verb="POST"} 1.5',
            'rest_client_rate_limiter_duration_seconds_sum{host="a",verb="PUT"} 2',
            "rest_client_rate_limiter_duration_seconds_sum_other 100",
            'rest_client_requests_total{code="201",method="POST"} 7',
        ]
    )
    assert realmetrics.metric_total(metrics, "rest_client_rate_limiter_duration_seconds_sum") == 3.5
    assert (
        realmetrics.metric_total(metrics, "rest_client_requests_total", labels={"code": "201"}) == 7
    )
    before = realmetrics.counters(
        metrics, {"waited": "rest_client_rate_limiter_duration_seconds_sum"}
    )
    assert realmetrics.counters_delta(before, {"waited": 5.0}) == {"waited": 1.5}


def test_top_functions_ranks_py_spy_folded_stacks(tmp_path: Path) -> None:
    folded = tmp_path / "x.folded"
    folded.write_text(
        "thread (1);run (a.py:1);decode (driver/cluster/kube.py:5) 3\n"
        "thread (1);run (a.py:1);handshake (ssl.py:9) 1\n"
    )
    top = realmetrics.top_functions(folded)
    assert top["samples"] == [("all", 4.0)]
    assert top["self"][0] == ("decode (kube.py:5)", 0.75)
    assert ("run (a.py:1)", 1.0) in top["total"]


def test_by_label_sums_one_metric_per_label_value() -> None:
    metrics = "\n".join(
        [
            'w_sum{execute="true",flow_schema="exempt",priority_level="exempt"} 1',
            'w_sum{execute="false",flow_schema="exempt",priority_level="exempt"} 2',
            'w_sum{execute="true",flow_schema="kube-scheduler",priority_level="workload-high"} 4',
            'w_count{execute="true",flow_schema="kube-scheduler",priority_level="workload-high"} 9',
        ]
    )
    assert realmetrics.by_label(metrics, "w_sum", "flow_schema") == {
        "exempt": 3.0,
        "kube-scheduler": 4.0,
    }


def test_the_stub_webhook_path_needs_an_executable_stand_in(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="go build -o /tmp/webhookstub"):
        real._stub(argparse.Namespace(webhook_stub=None))
    script = tmp_path / "stub"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(SystemExit, match="--webhook-stub EXE"):
        real._stub(argparse.Namespace(webhook_stub=str(script)))  # not executable
    script.chmod(0o755)
    assert real._stub(argparse.Namespace(webhook_stub=str(script))) == str(script)


def test_our_webhook_servers_histogram_is_read_from_the_controllers_metrics() -> None:
    metrics = WebhookMetrics()
    before = realmetrics.histogram(
        metrics.exposition().decode(), realmetrics.SERVER_WEBHOOK_DURATION
    )
    for seconds in (0.0004, 0.0004, 0.003, 0.2):
        metrics.answered(200, seconds, {"response": {"allowed": True, "patch": "W10="}})
    after = realmetrics.histogram(
        metrics.exposition().decode(), realmetrics.SERVER_WEBHOOK_DURATION
    )
    figures = realmetrics.histogram_delta(before, after)
    assert figures["calls"] == 4
    assert figures["mean_ms"] == 50.95
    assert figures["within_25ms"] == 0.75
    assert figures["p50_ms"] <= 0.5  # half the calls within the first bucket (0.5 ms)


def test_the_stand_in_controller_hands_out_disjoint_devices_of_the_benchmark_profile() -> None:
    slices = [
        s
        for node in ("n-a", "n-b")
        for s in build_pool(node=node, gpus=gpus_of(node), generation=1)
    ]
    handed = free_devices(slices)
    devices = {
        (d.node, d.name): d for pool in complete_pools(slices).values() for d in parse_devices(pool)
    }
    assert len(handed) == len(set(handed)) == 2 * GPUS_PER_NODE * 7  # 7 x 1g.5gb per A100-40GB
    used: dict[tuple[str, int], int] = {}
    for key in handed:
        device = devices[key]
        assert device.profile == PROFILE
        gpu = (device.node, device.gpu_index)
        assert not used.get(gpu, 0) & device.placement.mask
        used[gpu] = used.get(gpu, 0) | device.placement.mask
    assert [node for node, _ in handed[:7]] == ["n-a"] * 7  # node by node, GPU by GPU


def test_context_switches_are_summed_over_a_process_threads() -> None:
    before = context_switches(os.getpid())
    assert before is not None
    done = threading.Event()
    waiter = threading.Thread(target=done.wait, args=(5,))
    waiter.start()
    time.sleep(0.05)  # the waiter blocks: a voluntary switch of a live thread
    during = context_switches(os.getpid())
    done.set()
    waiter.join()
    assert during is not None
    assert during[0] > before[0]
    assert context_switches(None) is None


def test_the_controllers_counters_are_read_per_label_set_and_differenced() -> None:
    metrics = ControllerMetrics()
    before = realmetrics.controller_counters(metrics.exposition().decode())
    for _ in range(3):
        metrics.problem("NoCapacity")
    metrics.conflict("write")
    metrics.ungated(latency_seconds=0.5)
    after = realmetrics.controller_counters(metrics.exposition().decode())
    done = {k: v for k, v in realmetrics.counters_delta(before, after).items() if v}
    assert done == {
        "placement_problems_total{reason=NoCapacity}": 3.0,
        "conflicts_total{kind=write}": 1.0,
        "pods_ungated_total{}": 1.0,
    }
    assert realmetrics.controller_counters("") == {}  # the stand-ins serve no metrics


def _taint(api: KubeClusterApi, name: str, taints: list[dict[str, str]]) -> None:
    api.patch(NODES, name=name, patch={"spec": {"taints": taints}}, patch_type=PatchType.MERGE)


def test_rounds_wait_until_no_node_carries_a_taint_that_keeps_pods_off(
    apiserver: LocalApiServer,
) -> None:
    with connect(apiserver.url, user_agent="bench-test") as api:
        nodes = ReadyNodes(api, 2)
        nodes.create()
        try:
            not_ready = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
            _taint(api, nodes.names[1], [not_ready])
            with pytest.raises(TimeoutError, match=f"1 node.*{nodes.names[1]}"):
                nodes.wait_schedulable(timeout=0.6)
            preferred = {"key": "example.com/soon", "effect": "PreferNoSchedule"}
            timer = threading.Timer(0.3, _taint, args=(api, nodes.names[1], [preferred]))
            timer.start()
            nodes.wait_schedulable(timeout=30)  # a PreferNoSchedule taint keeps no pod off
            timer.join()
        finally:
            nodes.stop()


def test_the_product_is_set_against_its_yardsticks_round_by_round_and_by_the_median() -> None:
    def round_(path: str, repeat: int, cpu: float | None, webhook: float | None) -> dict[str, Any]:
        r: dict[str, Any] = {"path": path, "repeat": repeat}
        if cpu is not None:
            r["controller_cpu_ms_per_pod"] = cpu
        if webhook is not None:
            r["webhook"] = {"calls": 1000, "mean_ms": webhook}
        return r

    rounds = [
        round_("controller", 0, 3.0, 60.0),
        round_("stubhook", 0, 3.1, 50.0),
        round_("pregated", 0, 4.0, None),
        round_("stubcontroller", 0, 3.2, None),
        round_("controller", 1, 3.3, 44.0),
        round_("stubhook", 1, 3.0, 55.0),
        round_("pregated", 1, 3.6, None),
        round_("stubcontroller", 1, 3.0, None),
        round_("controller", 2, 3.1, 52.0),
        round_("stubhook", 2, 3.0, 50.0),
        round_("pregated", 2, 3.9, None),  # its stand-in round failed: no pair
    ]
    found = real.yardstick_ratios(rounds)
    assert found["controller_cpu_pregated_vs_stand_in"] == {
        "per_round": [1.25, 1.2],
        "median": 1.23,
        "goal": 1.3,
    }
    assert found["webhook_latency_vs_stub"]["per_round"] == [1.2, 0.8, 1.04]
    assert found["webhook_latency_vs_stub"]["median"] == 1.04
    assert found["controller_cpu_controller_vs_stand_in"]["per_round"] == [0.94, 1.1]
    assert real.yardstick_ratios([round_("controller", 0, 3.0, 60.0)]) == {}  # nothing to pair
    text = real.summary(
        {"pods": 10, "nodes": 2, "gpus_per_node": 8, "model": "A100-40GB", "date": "d",
         "machine": "m", "rounds": [], "pods_per_s": {}, "ratio": None, "yardsticks": found}
    )  # fmt: skip
    assert "webhook_latency_vs_stub: per round [1.2, 0.8, 1.04], median 1.04x (within" in text
    assert "controller_cpu_pregated_vs_stand_in: per round [1.25, 1.2], median 1.23x" in text
