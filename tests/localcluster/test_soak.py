"""The soak's own logic, without a cluster: the fault plan, growth judgement, the capacity a waiting
pod needs, what the metrics say, and when a result passes."""

from __future__ import annotations

from collections import Counter

import pytest

from driver.errors import ConfigError
from instaslice.status import ClusterView, FreeProfile, GpuView
from localcluster.realstack import RealStack
from localcluster.soak.checks import Violation, fits, free_capacity
from localcluster.soak.faults import KINDS, NODE_KINDS, FaultRecord, plan
from localcluster.soak.ledger import telling_reason, waiting
from localcluster.soak.metrics import informer_lists, informer_objects, leading
from localcluster.soak.report import SoakResult, render
from localcluster.soak.resources import Growth, Sample, growth, limit
from localcluster.soak.stack import KUBELET_STARTS, SoakStack
from localcluster.soak.workloads import SHAPES, claim_templates, deployment, job, single_pod

NODES = ["node-0", "node-1", "node-2"]


def test_the_plan_is_seeded_and_has_every_kind_once_a_round() -> None:
    first = plan(seed=7, nodes=NODES, rounds=3)
    assert first == plan(seed=7, nodes=NODES, rounds=3)
    assert first != plan(seed=8, nodes=NODES, rounds=3)
    for start in range(0, len(first), len(KINDS)):
        assert sorted(f.kind for f in first[start : start + len(KINDS)]) == sorted(KINDS)
    for fault in first:
        if fault.kind in NODE_KINDS:
            assert fault.target in NODES[:-1]  # the last node's plugin lives the whole soak
        else:
            assert fault.target == ""
        assert 15 <= fault.pause_s <= 35


def test_a_plan_of_some_kinds_and_an_unknown_kind() -> None:
    chosen = plan(seed=1, nodes=NODES, rounds=2, kinds=("kill-leader", "reboot-node"))
    assert Counter(f.kind for f in chosen) == {"kill-leader": 2, "reboot-node": 2}
    with pytest.raises(ValueError, match="unknown fault kinds"):
        plan(seed=1, nodes=NODES, rounds=1, kinds=("kill-everything",))


def _series(role: str, pid: int, values: list[int], *, start_s: float = 0.0) -> list[Sample]:
    return [
        Sample(at_s=start_s + 10 * i, role=role, pid=pid, rss_kib=v, fds=20, threads=30)
        for i, v in enumerate(values)
    ]


def test_flat_memory_is_within_and_creeping_memory_is_not() -> None:
    flat = _series("plugin/node-2", 1, [100_000] * 120)
    creeping = _series("controller-1", 2, [100_000 + 100 * i for i in range(120)])
    results = {
        (g.role, g.figure): g for g in growth(flat + creeping, soak_s=1200, soak_warmup_s=150)
    }
    steady = results[("plugin/node-2", "rss_kib")]
    assert steady.judged
    assert steady.within
    assert steady.growth == 0
    grown = results[("controller-1", "rss_kib")]
    assert grown.judged
    assert not grown.within
    assert grown.growth > 0.05
    assert grown.slope_per_hour == pytest.approx(100 / 10 * 3600 / grown.start, rel=0.01)


def test_a_short_incarnation_is_reported_but_not_judged() -> None:
    restarted = _series("plugin/node-0", 3, [50_000 + 1000 * i for i in range(40)], start_s=900)
    results = growth(restarted, soak_s=1200, soak_warmup_s=150)
    assert results
    assert not any(g.judged for g in results)


def test_counts_may_grow_by_two_or_five_percent() -> None:
    assert limit("fds", 20) == 22
    assert limit("threads", 100) == pytest.approx(105)
    assert limit("rss_kib", 1000) == pytest.approx(1050)


def _gpu(node: str, index: int, free: dict[str, tuple[int, ...]]) -> GpuView:
    return GpuView(
        node=node,
        index=index,
        uuid=f"GPU-{node}-{index}",
        product_name="A100-SXM4-40GB",
        memory_slices=8,
        taken=(),
        free=tuple(FreeProfile(profile=p, starts=s) for p, s in free.items()),
    )


def test_capacity_for_a_pod_counts_only_ready_nodes_and_one_node_at_a_time() -> None:
    view = ClusterView(
        gpus=(
            _gpu("node-0", 0, {"1g.5gb": (0,), "3g.20gb": ()}),
            _gpu("node-0", 1, {"1g.5gb": (3,), "3g.20gb": ()}),
            _gpu("node-1", 0, {"1g.5gb": (), "3g.20gb": (4,)}),
        )
    )
    free = free_capacity(view, {"node-0", "node-1"})
    assert free == {"node-0": {"1g.5gb": 2, "3g.20gb": 0}, "node-1": {"1g.5gb": 0, "3g.20gb": 1}}
    assert fits(SHAPES["dra-2x1g5"].needs(), free)
    assert fits(SHAPES["dra-3g20"].needs(), free)
    assert not fits({"1g.5gb": 3}, free)
    assert not fits({"1g.5gb": 1, "3g.20gb": 1}, free)  # each node has one of them only
    assert not fits(SHAPES["dra-3g20"].needs(), free_capacity(view, {"node-0"}))


def test_a_pod_waits_while_gated_or_unbound_but_not_while_deleted() -> None:
    gated = {"metadata": {}, "spec": {"schedulingGates": [{"name": "instaslice.dev/placement"}]}}
    bound = {"metadata": {}, "spec": {"nodeName": "node-0"}}
    deleted = {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}, "spec": {}}
    assert waiting(gated)
    assert waiting({"metadata": {}, "spec": {}})
    assert not waiting(bound)
    assert not waiting(deleted)


SCRAPE = """# TYPE instaslice_controller_informer_objects gauge
instaslice_controller_informer_objects{informer="pods"} 12.0
# TYPE instaslice_controller_informer_lists counter
instaslice_controller_informer_lists_total{informer="pods"} 3.0
# TYPE instaslice_webhook_informer_objects gauge
instaslice_webhook_informer_objects{informer="claims"} 4.0
# TYPE instaslice_controller_leader gauge
instaslice_controller_leader 1.0
"""


def test_informer_figures_are_read_per_daemon_and_informer() -> None:
    assert informer_objects(SCRAPE) == {("controller", "pods"): 12, ("webhook", "claims"): 4}
    assert informer_lists(SCRAPE) == {("controller", "pods"): 3}


def test_the_workloads_ask_for_what_their_shape_says() -> None:
    templates = {t["metadata"]["name"]: t for t in claim_templates()}
    pair = templates["tmpl-dra-2x1g5"]["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert pair == {
        "deviceClassName": "mig-1g.5gb.instaslice.dev",
        "allocationMode": "ExactCount",
        "count": 2,
    }
    classic = single_pod("p", SHAPES["classic-2g10"], lifetime_s=30)
    limits = classic["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/mig-2g.10gb": 1}
    assert classic["metadata"]["annotations"] == {"fake-cri/exit.app": "30"}
    assert "resourceClaims" not in classic["spec"]
    tolerations = {t["key"]: t["tolerationSeconds"] for t in classic["spec"]["tolerations"]}
    assert set(tolerations) == {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
    assert deployment("d", SHAPES["dra-1g5"], replicas=2)["spec"]["replicas"] == 2
    assert job("j", SHAPES["dra-1g10"], pods=2, lifetime_s=10)["spec"]["completions"] == 2


def _result(**changes: object) -> SoakResult:
    values: dict[str, object] = {
        "seed": 1,
        "kinds": ("kill-leader",),
        "minutes": 20,
        "nodes": 3,
        "faults": [
            FaultRecord(kind="kill-leader", target="controller-0", started_s=200, recovered_s=3)
        ],
        "pods": {"ran": Counter({"pod": 10}), "did not run": Counter({"status: Evicted": 1})},
        "churn": {},
        "violations": [],
        "growth": [
            Growth(
                role=role,
                pid=1,
                phase="",
                figure="rss_kib",
                judged=True,
                start=1,
                end=1,
                growth=0,
                slope_per_hour=0,
                within=True,
            )
            for role in ("plugin/node-2", "controller-1", "webhook-1")
        ],
        "checks": 100,
        "failed_reads": 2,
        "cache_excess": {"controller-1/pods": 0.0, "webhook-1/claims": 1.0},
    }
    values.update(changes)
    return SoakResult(**values)  # type: ignore[arg-type]


def test_a_clean_result_passes_and_says_so() -> None:
    result = _result()
    assert result.passed()
    text = render(result)
    assert "PASSED" in text
    assert "kill-leader" in text
    assert "at most +1 objects beyond those that existed (webhook-1/claims)" in text


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"violations": [Violation(at_s=300, kind="overlap", text="x")]}, "overlap at 300s"),
        ({"faults": []}, "never injected"),
        ({"pods": {"ran": Counter(), "did not run": Counter({"without a reason": 2})}},
         "said nothing"),
        ({"growth": [Growth(role="controller-0", pid=1, phase="leader", figure="rss_kib", judged=True, start=100,
                            end=120, growth=0.2, slope_per_hour=0.6, within=False)]}, "grew +20"),
        ({"growth": []}, "no controller lived long enough"),
        ({"faults": [FaultRecord(kind="kill-leader", target="", started_s=1, recovered_s=None)]},
         "not whole again after kill-leader"),
        ({"faults": [FaultRecord(kind="kill-leader", target="", started_s=1, recovered_s=2,
                                 details={"error": "TimeoutError()"})]}, "failed: TimeoutError"),
    ],
    ids=["violation", "missing-fault", "silent-pod", "growth", "nothing-judged", "not-whole",
         "fault-failed"],
)  # fmt: skip
def test_what_fails_a_soak(changes: dict[str, object], problem: str) -> None:
    result = _result(**changes)
    assert not result.passed()
    assert any(problem in p for p in result.problems()), result.problems()
    assert "FAILED" in render(result)


def test_a_pod_that_did_not_run_is_counted_by_its_mosttelling_reason_reason() -> None:
    said = ["Ready: ContainersNotReady", "instaslice.dev/Placement: NoCapacity", "status: Evicted"]
    assert telling_reason(said) == "instaslice.dev/Placement: NoCapacity"
    assert telling_reason(["Ready: PodCompleted", "PodScheduled: SchedulingGated"]) == (
        "PodScheduled: SchedulingGated"
    )
    assert telling_reason(["Ready: ContainersNotReady"]) == "Ready: ContainersNotReady"


def test_a_pool_that_fills_early_is_no_leak_but_a_count_still_rising_late_is() -> None:
    def threads(role: str, pid: int, counts: list[int]) -> list[Sample]:
        return [
            Sample(at_s=10 * i, role=role, pid=pid, rss_kib=1000, fds=10, threads=n)
            for i, n in enumerate(counts)
        ]

    filled = threads("plugin/node-2", 1, [30] * 20 + [36] * 20 + [35] * 80)
    leaking = threads("plugin/node-1", 2, [30] * 60 + [30 + i // 6 for i in range(60)])
    results = {
        g.role: g
        for g in growth(filled + leaking, soak_s=1200, soak_warmup_s=0)
        if g.figure == "threads"
    }
    assert results["plugin/node-2"].within
    assert not results["plugin/node-1"].within


def _controller(
    phases: list[tuple[str, int, int, int]], *, creep_kib: int = 0, pid: int = 5
) -> list[Sample]:
    """One controller process through runs of (phase, samples, RSS KiB, descriptors), 10 s apart;
    ``creep_kib`` more RSS at every sample."""
    samples, at = [], 0
    for phase, count, rss, fds in phases:
        for _ in range(count):
            samples.append(
                Sample(at_s=10.0 * at, role="controller-1", pid=pid, rss_kib=rss + creep_kib * at,
                       fds=fds, threads=60, phase=phase)
            )  # fmt: skip
            at += 1
    return samples


def test_a_lead_change_is_a_step_not_growth_and_the_life_is_judged() -> None:
    life = _controller([("standby", 40, 70_000, 15), ("leader", 40, 78_000, 22),
                        ("standby", 40, 79_000, 15)])  # fmt: skip
    results = {(g.phase, g.figure): g for g in growth(life, soak_s=1200, soak_warmup_s=150)}
    rss = results[("standby>leader>standby", "rss_kib")]
    assert rss.judged
    assert rss.within
    assert rss.growth == 0
    for phase in ("standby", "leader"):
        for figure in ("fds", "threads"):
            assert results[(phase, figure)].judged
            assert results[(phase, figure)].within


def test_memory_creeping_through_lead_changes_is_caught() -> None:
    life = _controller([("standby", 40, 70_000, 15), ("leader", 40, 78_000, 22),
                        ("standby", 40, 79_000, 15)], creep_kib=60)  # fmt: skip
    rss = next(g for g in growth(life, soak_s=1200, soak_warmup_s=150) if g.figure == "rss_kib")
    assert rss.judged
    assert not rss.within
    assert rss.growth > 0.05


def test_a_descriptor_kept_at_each_lead_change_is_caught() -> None:
    runs = [("standby", 30, 70_000, 15)]
    for change in range(1, 6):
        runs += [("leader", 20, 78_000, 22 + change), ("standby", 20, 78_000, 15 + change)]
    results = growth(_controller(runs), soak_s=1200, soak_warmup_s=150)
    standby_fds = next(g for g in results if g.phase == "standby" and g.figure == "fds")
    assert standby_fds.judged
    assert not standby_fds.within
    assert standby_fds.end == 20


def test_leading_is_read_from_the_controller_metrics() -> None:
    assert leading(SCRAPE) is True
    assert leading(SCRAPE.replace("leader 1.0", "leader 0.0")) is False
    assert leading("") is None


def test_a_kubelet_that_fails_its_start_is_started_again_as_systemd_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stack = object.__new__(SoakStack)  # no real stack: only the start-again logic runs
    calls: list[str] = []

    def start(self: RealStack, node: str, **_: object) -> None:
        calls.append(f"start {node}")
        if calls.count(f"start {node}") < 2:
            raise ConfigError("kubelet node-0 start failed (1):\nERROR: kubelet healthz not ok")

    monkeypatch.setattr(RealStack, "start_node", start)
    monkeypatch.setattr(
        SoakStack, "stop_node", lambda self, node, **_: calls.append(f"stop {node}")
    )
    stack.start_node("node-0")
    assert calls == ["start node-0", "stop node-0", "start node-0"]

    def never(self: RealStack, node: str, **_: object) -> None:
        calls.append(f"start {node}")
        raise ConfigError("kubelet node-1 start failed (1):\nERROR: kubelet exited")

    calls.clear()
    monkeypatch.setattr(RealStack, "start_node", never)
    with pytest.raises(ConfigError, match="kubelet exited"):
        stack.start_node("node-1")
    assert calls.count("start node-1") == KUBELET_STARTS


def test_in_a_long_soak_a_process_restarted_midway_is_judged_after_fifteen_minutes() -> None:
    restarted = _series("webhook-1", 7, [70_000 + 20 * i for i in range(200)], start_s=1800)
    rss = next(
        g for g in growth(restarted, soak_s=3600, soak_warmup_s=150) if g.figure == "rss_kib"
    )
    assert rss.judged  # 31 minutes settled: less than half of the soak, more than fifteen minutes
    assert not rss.within
    short = _series("webhook-0", 8, [70_000] * 90, start_s=2700)
    assert not any(g.judged for g in growth(short, soak_s=3600, soak_warmup_s=150))
