"""Who gets a freed slice: priority order, preemption through the Eviction API, reservations.

Pods on the local API server run no kubelet: a pod "runs" once ungated, an evicted pod is deleted,
and its claim is released by the test as kube-controller-manager would (``release_claim``).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable
from contextlib import ExitStack, suppress
from datetime import UTC, datetime
from typing import Any

import pytest

from api.names import HOLD_ANNOTATION
from controller.allocation.sync import SyncConfig
from driver.cluster import ops
from driver.cluster.kube import KubeClusterApi
from driver.cluster.port import (
    EVENTS,
    POD_DISRUPTION_BUDGETS,
    PODS,
    PRIORITY_CLASSES,
    RESOURCE_CLAIMS,
    JsonObject,
)
from driver.errors import AlreadyExistsError, ApiNotFoundError
from instaslice.status import read_view, render_view
from localcluster.apiserver import LocalApiServer
from tests.controller.harness import (
    NS,
    assert_no_overlap,
    claim_object,
    cluster_api,
    condition_reason,
    get_pod,
    pod_object,
    publish_node,
    release_claim,
    request,
    start_controller,
    ungated,
    wait_for,
)

NO_PREEMPTION = SyncConfig(preemption=False, starvation_after=None)


@pytest.fixture
def api(apiserver: LocalApiServer, stack: ExitStack) -> KubeClusterApi:
    return cluster_api(apiserver, stack)


SYSTEM_CLASSES = {2_000_000_000: "system-cluster-critical", 2_000_001_000: "system-node-critical"}


def priority_spec(api: KubeClusterApi, priority: int, *, never: bool = False) -> dict[str, Any]:
    """The pod spec fields that give it ``priority``: a PriorityClass of that value (made when
    missing; the Priority admission plugin resolves it), none for the default 0."""
    if priority == 0 and not never:
        return {}
    if priority in SYSTEM_CLASSES:
        return {"priorityClassName": SYSTEM_CLASSES[priority]}
    name = f"prio-{'m' if priority < 0 else ''}{abs(priority)}{'-never' if never else ''}"
    body: JsonObject = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": priority,
    }
    if never:
        body["preemptionPolicy"] = "Never"
    with suppress(AlreadyExistsError):
        api.create(PRIORITY_CLASSES, body)
    return {"priorityClassName": name}


def create_pod(
    api: KubeClusterApi,
    name: str,
    *,
    profile: str = "1g.5gb",
    priority: int = 0,
    never: bool = False,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> None:
    """A claim for one slice of ``profile`` and a gated pod of ``priority`` using it."""
    api.create(
        RESOURCE_CLAIMS,
        claim_object(f"{name}-claim", requests=[request(profile=profile)]),
        namespace=NS,
    )
    body = pod_object(
        name, claims=[f"{name}-claim"], **priority_spec(api, priority, never=never), **spec
    )
    if labels:
        body["metadata"]["labels"] = labels
    api.create(PODS, body, namespace=NS)


def mark_ready(api: KubeClusterApi, name: str) -> None:
    """What the kubelet reports of a running pod (a PodDisruptionBudget counts Ready pods)."""
    pod = get_pod(api, name)
    pod.setdefault("status", {})["phase"] = "Running"
    pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    api.update_status(PODS, pod)


def gone(api: KubeClusterApi, name: str) -> bool:
    try:
        get_pod(api, name)
    except ApiNotFoundError:
        return True
    return False


def release_gone(api: KubeClusterApi, names: Iterable[str]) -> list[str]:
    """Release the claims of the pods among ``names`` that were evicted; their names."""
    released = []
    for name in names:
        if gone(api, name):
            with suppress(ApiNotFoundError):
                release_claim(api, f"{name}-claim")
            released.append(name)
    return released


def device_of(api: KubeClusterApi, claim: str) -> str:
    obj = api.get(RESOURCE_CLAIMS, name=claim, namespace=NS)
    (result,) = obj["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def fill_gpu(api: KubeClusterApi, priorities: list[int], *, prefix: str = "low") -> list[str]:
    """Seven 1g.5gb pods, ungated in order onto the one A100's slices 0..6."""
    names = []
    for i, priority in enumerate(priorities):
        name = f"{prefix}{i}"
        create_pod(api, name, priority=priority)
        wait_for(lambda n=name: ungated(api, n), what=f"{name} placed")  # type: ignore[misc]
        names.append(name)
    return names


def one_victim_for_unschedulable(api: KubeClusterApi, name: str, running: list[str]) -> None:
    """Report the pod Unschedulable as kube-scheduler would, then the one pod evicted for it,
    which must be among the first three of ``running`` (the lowest priority in these tests)."""
    ops.set_pod_condition(
        api,
        pod=get_pod(api, name),
        condition_type="PodScheduled",
        status="False",
        reason="Unschedulable",
        message="0/1 nodes are available: 1 cannot allocate all claims.",
        now=datetime.now(UTC),
    )
    wait_for(lambda: any(gone(api, n) for n in running), timeout=15, what="a victim evicted")
    time.sleep(0.5)
    evicted = [n for n in running if gone(api, n)]
    assert len(evicted) == 1
    assert evicted[0] in running[:3]


def events_for(api: KubeClusterApi, name: str, reason: str) -> list[JsonObject]:
    return [
        e
        for e in api.list_objects(EVENTS, namespace=NS).items
        if e.get("reason") == reason and (e.get("involvedObject") or {}).get("name") == name
    ]


def test_freed_slices_go_to_the_highest_priority_then_the_oldest(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=1)
    start_controller(apiserver, stack, sync=NO_PREEMPTION)
    running = fill_gpu(api, [0] * 7)
    # created in this order; served high, then mid-old, then mid-new, then low
    for name, priority in (("low", -5), ("mid-old", 10), ("mid-new", 10), ("high", 1000)):
        create_pod(api, name, priority=priority)
        wait_for(lambda n=name: condition_reason(api, n) == "NoCapacity", what=name)  # type: ignore[misc]
    served = []
    for victim in running[:4]:
        api.delete(PODS, name=victim, namespace=NS)
        release_claim(api, f"{victim}-claim")
        placed = wait_for(
            lambda: [
                n
                for n in ("low", "mid-old", "mid-new", "high")
                if n not in served and ungated(api, n)
            ],
            what="one waiting pod placed",
        )
        assert len(placed) == 1, placed
        served.extend(placed)
    assert served == ["high", "mid-old", "mid-new", "low"]
    assert_no_overlap(api)


def test_a_pod_behind_in_order_does_not_take_room_a_pod_ahead_fits(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    """The freed slice is taken by the waiting high-priority pod even though a new low-priority
    pod asks for it at the same moment."""
    publish_node(api, "node-a", gpus=1)
    start_controller(apiserver, stack, sync=NO_PREEMPTION)
    running = fill_gpu(api, [0] * 7)
    create_pod(api, "high", priority=100)
    wait_for(lambda: condition_reason(api, "high") == "NoCapacity", what="high waits")
    api.delete(PODS, name=running[0], namespace=NS)
    release_claim(api, f"{running[0]}-claim")
    create_pod(api, "newcomer", priority=0)
    wait_for(lambda: ungated(api, "high"), what="high placed")
    wait_for(lambda: condition_reason(api, "newcomer") == "NoCapacity", what="newcomer waits")
    assert not ungated(api, "newcomer")
    assert_no_overlap(api)


def _expected_victims(priorities: list[int], protected: set[int]) -> set[int]:
    """Brute force: the 2g.10gb placements of an A100-40GB start at 0, 2 and 4; the best pair of
    occupants by kube-scheduler's score (no budget violated, lowest highest priority, lowest sum)."""
    best: tuple[int, int] | None = None
    choice: set[int] = set()
    for start in (0, 2, 4):
        pair = {start, start + 1}
        if pair & protected:
            continue
        key = (max(priorities[i] for i in pair), sum(priorities[i] for i in pair))
        if best is None or key < best:
            best, choice = key, pair
    return choice


@pytest.mark.parametrize(
    ("priorities", "protected"),
    [
        ([5, 5, 0, 0, 1, 1, 0], set()),
        ([5, 5, 0, 0, 1, 1, 0], {2}),
        ([3, 0, 0, 2, 2, 1, 0], set()),
    ],
    ids=["lowest-pair", "budget-protects-one", "aligned-pair-only"],
)
def test_preemption_evicts_the_minimal_lowest_priority_victims(
    apiserver: LocalApiServer,
    api: KubeClusterApi,
    stack: ExitStack,
    priorities: list[int],
    protected: set[int],
) -> None:
    publish_node(api, "node-a", gpus=1)
    start_controller(apiserver, stack)
    names = []
    for i, priority in enumerate(priorities):
        name = f"low{i}"
        create_pod(api, name, priority=priority, labels={"app": f"a{i}"})
        wait_for(lambda n=name: ungated(api, n), what=f"{name} placed")  # type: ignore[misc]
        mark_ready(api, name)
        names.append(name)
    for i in sorted(protected):
        api.create(
            POD_DISRUPTION_BUDGETS,
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": f"keep-{i}", "namespace": NS},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": f"a{i}"}}},
            },
            namespace=NS,
        )
        wait_for(
            lambda i=i: (  # type: ignore[misc]
                api.get(POD_DISRUPTION_BUDGETS, name=f"keep-{i}", namespace=NS).get("status") or {}
            ).get("observedGeneration"),
            what="budget counted",
        )
    expected = {f"low{i}" for i in _expected_victims(priorities, protected)}
    create_pod(api, "high", profile="2g.10gb", priority=1000)
    wait_for(lambda: any(gone(api, n) for n in names), what="victims evicted")
    wait_for(lambda: set(release_gone(api, names)) == expected, timeout=5, what="exact victims")
    wait_for(lambda: ungated(api, "high"), what="high placed")
    assert sorted(n for n in names if gone(api, n)) == sorted(expected)
    start = min(int(n.removeprefix("low")) for n in expected)
    assert device_of(api, "high-claim") == f"gpu-0-2g-10gb-{start}"
    for name in expected:
        assert events_for(api, name, "Preempted"), name
    assert get_pod(api, "high")["status"].get("nominatedNodeName") == "node-a"
    assert_no_overlap(api)


def test_preemption_policy_never_evicts_nothing_and_still_comes_first(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=1)
    start_controller(apiserver, stack)
    running = fill_gpu(api, [0] * 7)
    create_pod(api, "low-waiting", priority=0)
    create_pod(api, "polite", priority=1000, never=True)
    for name in ("low-waiting", "polite"):
        wait_for(lambda n=name: condition_reason(api, n) == "NoCapacity", what=name)  # type: ignore[misc]
    assert not any(gone(api, n) for n in running)
    api.delete(PODS, name=running[3], namespace=NS)
    release_claim(api, f"{running[3]}-claim")
    wait_for(lambda: ungated(api, "polite"), what="polite placed")
    assert not ungated(api, "low-waiting")
    assert not any(gone(api, n) for n in running if n != running[3])


def test_a_budget_that_forbids_every_eviction_is_named_and_nothing_is_evicted(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=1)
    start_controller(apiserver, stack)
    running = []
    for i in range(7):
        create_pod(api, f"low{i}", priority=0, labels={"app": "batch"})
        wait_for(lambda i=i: ungated(api, f"low{i}"), what="placed")  # type: ignore[misc]
        mark_ready(api, f"low{i}")
        running.append(f"low{i}")
    api.create(
        POD_DISRUPTION_BUDGETS,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "batch", "namespace": NS},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "batch"}}},
        },
        namespace=NS,
    )
    wait_for(
        lambda: (
            api.get(POD_DISRUPTION_BUDGETS, name="batch", namespace=NS).get("status") or {}
        ).get("observedGeneration"),
        what="budget counted",
    )
    create_pod(api, "high", priority=1000)

    def message() -> str:
        pod = get_pod(api, "high")
        for condition in pod.get("status", {}).get("conditions") or []:
            if condition.get("type") == "instaslice.dev/Placement":
                return str(condition.get("message", ""))
        return ""

    wait_for(lambda: "PodDisruptionBudget default/batch" in message(), what="budget named")
    assert not any(gone(api, n) for n in running)


def test_a_large_request_gets_a_reservation_and_runs_before_the_stream_of_small_ones(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    """Same priority everywhere: a 7g.40gb pod waits behind a stream of 1g.5gb pods that would
    keep the GPU from ever emptying; past the starvation bound the GPU is reserved for it."""
    publish_node(api, "node-a", gpus=1)
    start_controller(apiserver, stack, sync=SyncConfig(preemption=False, starvation_after=0.5))
    running = fill_gpu(api, [0] * 7)
    create_pod(api, "large", profile="7g.40gb")
    wait_for(lambda: condition_reason(api, "large") == "NoCapacity", what="large waits")
    stream = itertools.count()
    pending: list[str] = []
    for _ in range(40):  # each step one small pod ends and a new one arrives
        if ungated(api, "large"):
            break
        running.extend(n for n in pending if ungated(api, n))
        pending = [n for n in pending if n not in running]
        if running:
            ended = running.pop(0)
            api.delete(PODS, name=ended, namespace=NS)
            release_claim(api, f"{ended}-claim")
        newcomer = f"small{next(stream)}"
        create_pod(api, newcomer)
        pending.append(newcomer)
        time.sleep(0.2)
    wait_for(lambda: ungated(api, "large"), timeout=10, what="large placed")
    assert not any(ungated(api, n) for n in pending), "a small pod took the reserved GPU"
    hold = json.loads(get_pod(api, "large")["metadata"]["annotations"][HOLD_ANNOTATION])
    assert hold["kind"] == "reservation"
    assert hold["gpus"] == [0]
    assert device_of(api, "large-claim") == "gpu-0-7g-40gb-0"
    assert events_for(api, "large", "Reserved")
    assert_no_overlap(api)


def test_a_reservation_survives_a_leader_change(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    """The new leader reads the hold from the pod's annotation: a freed slice of the reserved GPU
    still goes to nobody of equal priority."""
    publish_node(api, "node-a", gpus=1)
    sync = SyncConfig(preemption=False, starvation_after=0.5)
    with ExitStack() as first:
        start_controller(apiserver, first, identity="a", leader_election=True, sync=sync)
        running = fill_gpu(api, [0] * 7)
        create_pod(api, "large", profile="7g.40gb")
        wait_for(lambda: condition_reason(api, "large") == "NoCapacity", what="large waits")
        api.delete(PODS, name=running[0], namespace=NS)  # wakes it past the bound
        release_claim(api, f"{running[0]}-claim")
        wait_for(
            lambda: HOLD_ANNOTATION in (get_pod(api, "large")["metadata"].get("annotations") or {}),
            what="reservation recorded",
        )
    start_controller(apiserver, stack, identity="b", leader_election=True, sync=sync)
    api.delete(PODS, name=running[1], namespace=NS)
    release_claim(api, f"{running[1]}-claim")
    create_pod(api, "newcomer")
    wait_for(lambda: condition_reason(api, "newcomer") is not None, timeout=15, what="newcomer")
    assert not ungated(api, "newcomer")
    for victim in running[2:]:
        api.delete(PODS, name=victim, namespace=NS)
        release_claim(api, f"{victim}-claim")
    wait_for(lambda: ungated(api, "large"), timeout=15, what="large placed")
    assert device_of(api, "large-claim") == "gpu-0-7g-40gb-0"
    assert_no_overlap(api)


def test_instaslice_status_shows_a_hold(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=1)
    start_controller(apiserver, stack, sync=SyncConfig(preemption=False, starvation_after=0.2))
    fill_gpu(api, [0] * 7)
    create_pod(api, "large", profile="7g.40gb")
    wait_for(lambda: condition_reason(api, "large") == "Reserved", timeout=15, what="reserved")
    text = render_view(read_view(api))
    assert "Held for waiting pods:" in text
    assert "node-a GPU 0: reservation for default/large since " in text


def test_classic_pods_preempt_and_are_preempted(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    """A classic nvidia.com/mig-1g.5gb pod of high priority evicts one classic pod of low
    priority; the victim's shadow claim is released and the preemptor placed there."""
    publish_node(api, "node-a", gpus=1)
    start_controller(apiserver, stack)
    low = [f"classic-low{i}" for i in range(7)]
    for name in low:
        api.create(
            PODS,
            pod_object(name, classic={"nvidia.com/mig-1g.5gb": 1}),
            namespace=NS,
        )
        wait_for(lambda n=name: ungated(api, n), what=f"{name} placed")  # type: ignore[misc]
    api.create(
        PODS,
        pod_object("classic-high", classic={"nvidia.com/mig-1g.5gb": 1}, **priority_spec(api, 100)),
        namespace=NS,
    )
    wait_for(lambda: ungated(api, "classic-high"), timeout=15, what="the preemptor placed")
    evicted = [n for n in low if gone(api, n)]
    assert len(evicted) == 1
    assert events_for(api, evicted[0], "Preempted")
    assert_no_overlap(api)


def test_scheduler_mode_preempts_for_a_pod_kube_scheduler_reports_unschedulable(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=1)
    with ExitStack() as placing:  # the fleet filled as kube-scheduler would have
        start_controller(apiserver, placing, sync=NO_PREEMPTION)
        running = fill_gpu(api, [0, 0, 0, 5, 5, 5, 5])
    start_controller(apiserver, stack, sync=SyncConfig(scheduler_mode=True))
    api.create(RESOURCE_CLAIMS, claim_object("high-claim"), namespace=NS)
    api.create(
        PODS,
        pod_object("high", claims=["high-claim"], gates=(), **priority_spec(api, 1000)),
        namespace=NS,
    )
    one_victim_for_unschedulable(api, "high", running)
    assert get_pod(api, "high")["status"].get("nominatedNodeName") == "node-a"


def test_no_reservation_when_one_departure_would_let_the_pod_in(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    """Two 3g.20gb pods fill an A100 (with a 1g.5gb); a third 3g.20gb waits: the order serves it
    at the first departure, so no GPU is reserved for it however long it waits."""
    publish_node(api, "node-a", gpus=1)
    start_controller(apiserver, stack, sync=SyncConfig(preemption=False, starvation_after=0.2))
    for name in ("a", "b"):
        create_pod(api, name, profile="3g.20gb")
        wait_for(lambda n=name: ungated(api, n), what=name)  # type: ignore[misc]
    create_pod(api, "c", profile="3g.20gb")
    wait_for(lambda: condition_reason(api, "c") == "NoCapacity", what="c waits")
    time.sleep(1.0)  # past the bound, and its deadline pass
    assert condition_reason(api, "c") == "NoCapacity"
    assert HOLD_ANNOTATION not in (get_pod(api, "c")["metadata"].get("annotations") or {})


def test_a_victim_stuck_terminating_is_waited_for_a_bounded_time_then_another_is_chosen(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    """The lowest-priority victim never goes (a finalizer keeps it terminating): once its grace
    period and the slack have passed, the preemptor looks again, leaves the terminating pod
    alone (evicted once) and evicts the next best victim."""
    publish_node(api, "node-a", gpus=1)
    start_controller(apiserver, stack, sync=SyncConfig(preemption_slack=0.5))
    names = []
    for i in range(7):
        name = f"low{i}"
        create_pod(api, name, priority=0 if i == 0 else 1, terminationGracePeriodSeconds=0)
        wait_for(lambda n=name: ungated(api, n), what=name)  # type: ignore[misc]
        names.append(name)
    stuck = get_pod(api, "low0")
    stuck["metadata"]["finalizers"] = ["test.instaslice.dev/stuck"]
    api.update(PODS, stuck)
    create_pod(api, "high", priority=100)
    wait_for(lambda: get_pod(api, "low0")["metadata"].get("deletionTimestamp"), what="evicted")
    second = wait_for(
        lambda: [n for n in names[1:] if gone(api, n)], timeout=15, what="a second victim"
    )
    assert len(second) == 1
    release_gone(api, second)
    wait_for(lambda: ungated(api, "high"), what="high placed")
    assert len(events_for(api, "low0", "Preempted")) == 1
    pod = get_pod(api, "low0")
    pod["metadata"]["finalizers"] = []
    api.update(PODS, pod)


def test_priorities_at_the_int32_limits_order_and_preempt(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=1)
    start_controller(apiserver, stack)
    running = []
    for i in range(7):
        name = f"low{i}"
        create_pod(api, name, priority=-(2**31) if i == 3 else 1_000_000_000)
        wait_for(lambda n=name: ungated(api, n), what=name)  # type: ignore[misc]
        running.append(name)
    create_pod(api, "top", priority=2_000_001_000)  # system-node-critical, above user classes
    wait_for(lambda: gone(api, "low3"), what="the lowest evicted")
    release_gone(api, ["low3"])
    wait_for(lambda: ungated(api, "top"), what="top placed")
    assert [n for n in running if gone(api, n)] == ["low3"]


def test_among_equal_victim_sets_one_whose_victim_can_move_elsewhere_is_chosen(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    """node-a's one candidate is a 3g.20gb pod (no free 3g.20gb placement anywhere: it could not
    run again), node-b's a 2g.10gb pod (node-c has a free 2g.10gb placement: its replacement runs
    at once). Both sets score the same by kube-scheduler's rules; the one that moves wins."""
    for node, labels in (("node-a", {"pool": "x"}), ("node-b", {"pool": "x"}), ("node-c", {})):
        publish_node(api, node, gpus=1, labels=labels)
    start_controller(apiserver, stack)
    layout = [
        ("victim-b", "node-b", "2g.10gb", 0),
        ("victim-a", "node-a", "3g.20gb", 0),
        ("keep-a", "node-a", "3g.20gb", 1000),
        ("keep-b1", "node-b", "2g.10gb", 1000),
        ("keep-b2", "node-b", "3g.20gb", 1000),
        ("keep-c1", "node-c", "1g.5gb", 1000),
        ("keep-c2", "node-c", "3g.20gb", 1000),
    ]
    for name, node, profile, priority in layout:
        create_pod(
            api,
            name,
            profile=profile,
            priority=priority,
            nodeSelector={"kubernetes.io/hostname": node},
        )
        wait_for(lambda n=name: ungated(api, n), what=name)  # type: ignore[misc]
    create_pod(api, "urgent", profile="2g.10gb", priority=1000, nodeSelector={"pool": "x"})
    wait_for(lambda: gone(api, "victim-b") or gone(api, "victim-a"), what="a victim")
    release_gone(api, ["victim-a", "victim-b"])
    wait_for(lambda: ungated(api, "urgent"), what="urgent placed")
    assert gone(api, "victim-b")
    assert not gone(api, "victim-a")


def test_scheduler_mode_preempts_for_a_classic_pod_kube_scheduler_reports_unschedulable(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    """With ``extendedResourceName`` kube-scheduler makes a classic pod's claim only once it can
    allocate it; the controller weighs the pod's classic requests as the claim they would be."""
    publish_node(api, "node-a", gpus=1)
    with ExitStack() as placing:
        start_controller(apiserver, placing, sync=NO_PREEMPTION)
        running = fill_gpu(api, [0, 0, 0, 5, 5, 5, 5])
    start_controller(apiserver, stack, sync=SyncConfig(scheduler_mode=True))
    api.create(
        PODS,
        pod_object(
            "classic-high",
            classic={"nvidia.com/mig-1g.5gb": 1},
            gates=(),
            **priority_spec(api, 1000),
        ),
        namespace=NS,
    )
    one_victim_for_unschedulable(api, "classic-high", running)
