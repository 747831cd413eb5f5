"""Priority, preemption and reservations on real Kubernetes: PriorityClasses resolved by
kube-apiserver's Priority admission plugin, PodDisruptionBudgets counted by kube-controller-
manager's disruption controller, evictions through the real Eviction API, pods run by real
kubelets. The stack: 2 nodes x 2 emulated A100-40GB, so eight 3g.20gb pods fill it."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Sequence

import pytest

from api import names
from driver.cluster.port import POD_DISRUPTION_BUDGETS, PODS, JsonObject, Resource
from driver.errors import ApiNotFoundError
from localcluster.realstack import RealStack
from tests.e2e.conftest import E2E_NS
from tests.e2e.helpers import (
    apply,
    claim_template,
    classic_pod,
    dra_pod,
    get_pod,
    is_gated,
    placement_reason,
    pods,
    running,
    scale,
    wait_for,
    wait_pod_running,
    wait_running,
)
from tests.real.test_failures import kill_the_leader
from tests.real.test_modes import to_controller_mode, to_scheduler_mode

PRIORITY_CLASSES = Resource(
    group="scheduling.k8s.io",
    version="v1",
    plural="priorityclasses",
    kind="PriorityClass",
    namespaced=False,
)
CLASSES = {"e2e-low": 100, "e2e-mid": 500, "e2e-high": 1000}
NEVER = "e2e-high-never"
HOLD_S = 3.0


@pytest.fixture
def classes(cluster: RealStack) -> Iterator[RealStack]:
    """PriorityClasses for the scenario (and its PodDisruptionBudgets removed after it)."""
    made = [*CLASSES, NEVER]
    for name, value in [*CLASSES.items(), (NEVER, 1000)]:
        body: JsonObject = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        if name == NEVER:
            body["preemptionPolicy"] = "Never"
        with contextlib.suppress(Exception):
            cluster.api.delete(PRIORITY_CLASSES, name=name)
        cluster.api.create(PRIORITY_CLASSES, body)
    try:
        yield cluster
    finally:
        for pdb in cluster.api.list_objects(POD_DISRUPTION_BUDGETS, namespace=E2E_NS).items:
            with contextlib.suppress(ApiNotFoundError):
                cluster.api.delete(
                    POD_DISRUPTION_BUDGETS, name=pdb["metadata"]["name"], namespace=E2E_NS
                )
        for name in made:
            with contextlib.suppress(ApiNotFoundError):
                cluster.api.delete(PRIORITY_CLASSES, name=name)


def pod(
    name: str, *, priority_class: str, template: str = "half", labels: dict[str, str] | None = None
) -> JsonObject:
    body = dra_pod(name, template=template, namespace=E2E_NS)
    body["spec"]["priorityClassName"] = priority_class
    body["spec"]["terminationGracePeriodSeconds"] = 1
    if labels:
        body["metadata"]["labels"] = labels
    return body


def gone(stack: RealStack, name: str) -> bool:
    found = get_pod(stack, E2E_NS, name)
    return found is None or bool(found["metadata"].get("deletionTimestamp"))


def budget(name: str, *, app: str, min_available: int) -> JsonObject:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": E2E_NS},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}},
    }


def fill(stack: RealStack, spec: Sequence[tuple[str, str, str | None]]) -> None:
    """Eight 3g.20gb pods (name, class, app label) placed one by one (their order is the order
    first-fit gives them the GPUs), all running."""
    apply(stack, [claim_template("half", profile="3g.20gb", namespace=E2E_NS)])
    for name, priority_class, app in spec:
        apply(
            stack, [pod(name, priority_class=priority_class, labels={"app": app} if app else None)]
        )
        wait_for(
            stack,
            lambda n=name: not is_gated(get_pod(stack, E2E_NS, n)),  # type: ignore[misc]
            message=f"{name} not placed",
        )
    wait_running(stack, E2E_NS, len(spec))


def test_a_high_priority_pod_preempts_one_unprotected_lowest_priority_pod_and_runs(
    classes: RealStack,
) -> None:
    cluster = classes
    spec = [
        ("mid-0", "e2e-mid", None),
        ("low-kept-0", "e2e-low", "kept"),
        ("mid-1", "e2e-mid", None),
        ("low-kept-1", "e2e-low", "kept"),
        ("mid-2", "e2e-mid", None),
        ("low-free-0", "e2e-low", "free"),
        ("mid-3", "e2e-mid", None),
        ("low-free-1", "e2e-low", "free"),
    ]
    fill(cluster, spec)
    # the victims' class goes away while they run: their spec.priority stays (docs/design.md F26)
    cluster.api.delete(PRIORITY_CLASSES, name="e2e-low")
    cluster.api.create(POD_DISRUPTION_BUDGETS, budget("kept", app="kept", min_available=2))
    wait_for(
        cluster,
        lambda: (
            (
                cluster.api.get(POD_DISRUPTION_BUDGETS, name="kept", namespace=E2E_NS).get("status")
                or {}
            ).get("currentHealthy")
            == 2
        ),
        message="kube-controller-manager did not count the budget",
    )
    started = time.monotonic()
    apply(cluster, [pod("urgent", priority_class="e2e-high")])
    wait_pod_running(cluster, E2E_NS, "urgent")
    to_running = time.monotonic() - started
    evicted = sorted(name for name, _, _ in spec if gone(cluster, name))
    assert len(evicted) == 1, evicted
    assert evicted[0].startswith("low-free-"), evicted
    events = [
        e
        for e in cluster.events(E2E_NS)
        if e.get("reason") == "Preempted"
        and (e.get("involvedObject") or {}).get("name") == evicted[0]
    ]
    assert events, "the victim has no Preempted event"
    print(f"preemption: urgent Running {to_running:.1f}s after creation; victims {evicted}")


def test_preemption_policy_never_evicts_nothing_and_gets_the_next_freed_slice(
    classes: RealStack,
) -> None:
    cluster = classes
    spec = [(f"low-{i}", "e2e-low", None) for i in range(8)]
    fill(cluster, spec)
    apply(cluster, [pod("waiting-low", priority_class="e2e-low")])
    wait_for(cluster, lambda: placement_reason(cluster, E2E_NS, "waiting-low") == "NoCapacity")
    apply(cluster, [pod("polite", priority_class=NEVER)])
    wait_for(cluster, lambda: placement_reason(cluster, E2E_NS, "polite") == "NoCapacity")
    time.sleep(HOLD_S)
    assert not any(gone(cluster, name) for name, _, _ in spec)
    cluster.api.delete(PODS, name="low-3", namespace=E2E_NS)
    wait_pod_running(cluster, E2E_NS, "polite")
    assert is_gated(get_pod(cluster, E2E_NS, "waiting-low"))


def test_waiting_pods_are_placed_in_priority_order_as_slices_free_one_at_a_time(
    classes: RealStack,
) -> None:
    """Twenty waiting pods of four priorities (none may preempt: the running ones are of the
    highest class); every slice freed goes to the first of them in priority, then age order.
    The hand-off is off: a pod handed to kube-scheduler is served in kube-scheduler's order."""
    cluster = classes
    cluster.restart_controllers(["--handoff-after", "0"])
    cluster.wait_ready()
    values = {"e2e-o0": 10, "e2e-o1": 20, "e2e-o2": 30, "e2e-o3": 40}
    for name, value in values.items():
        with contextlib.suppress(Exception):
            cluster.api.delete(PRIORITY_CLASSES, name=name)
        cluster.api.create(
            PRIORITY_CLASSES,
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
                "preemptionPolicy": "Never",
            },
        )
    try:
        fill(cluster, [(f"run-{i}", "e2e-high", None) for i in range(8)])
        waiting = [(f"w-{i:02d}", f"e2e-o{(i * 7) % 4}") for i in range(20)]
        for name, priority_class in waiting:
            apply(cluster, [pod(name, priority_class=priority_class)])
            time.sleep(0.05)
        wait_for(
            cluster,
            lambda: all(placement_reason(cluster, E2E_NS, n) == "NoCapacity" for n, _ in waiting),
            message="the waiting pods did not all report NoCapacity",
        )
        expected = [n for n, c in sorted(waiting, key=lambda w: (-values[w[1]], w[0]))]
        placed: list[str] = []
        running_names = [f"run-{i}" for i in range(8)]
        for _ in range(len(waiting)):
            ended = running_names.pop(0)
            cluster.api.delete(PODS, name=ended, namespace=E2E_NS)
            newly = wait_for(
                cluster,
                lambda: (
                    [
                        n
                        for n, _ in waiting
                        if n not in placed and not is_gated(get_pod(cluster, E2E_NS, n))
                    ]
                    or None
                ),
                message="no waiting pod placed after a slice freed",
            )
            assert len(newly) == 1, newly
            placed.extend(newly)
            running_names.append(newly[0])
        assert placed == expected
    finally:
        cluster.restart_controllers()
        cluster.wait_ready()  # the next test's pods need the webhook serving again
        for name in values:
            with contextlib.suppress(ApiNotFoundError):
                cluster.api.delete(PRIORITY_CLASSES, name=name)


def test_the_leader_killed_mid_preemption_evicts_no_more_and_the_preemptor_runs(
    classes: RealStack,
) -> None:
    cluster = classes
    spec = [(f"low-{i}", "e2e-low", None) for i in range(8)]
    fill(cluster, spec)
    apply(cluster, [pod("urgent", priority_class="e2e-high")])
    wait_for(
        cluster,
        lambda: (
            names.HOLD_ANNOTATION
            in (
                (get_pod(cluster, E2E_NS, "urgent") or {}).get("metadata", {}).get("annotations")
                or {}
            )
        ),
        message="no hold recorded on the preemptor",
    )
    kill_the_leader(cluster)
    wait_pod_running(cluster, E2E_NS, "urgent")
    time.sleep(HOLD_S)
    evicted = [name for name, _, _ in spec if gone(cluster, name)]
    assert len(evicted) == 1, evicted
    hold = json.loads(
        get_pod(cluster, E2E_NS, "urgent")["metadata"]["annotations"][names.HOLD_ANNOTATION]  # type: ignore[index]
    )
    assert hold["victims"] == [f"{E2E_NS}/{evicted[0]}"]
    assert sum(running(p) for p in pods(cluster, E2E_NS)) == 8


STREAM_LIFETIME_S = 12.0
STARVATION_AFTER_S = 10.0
WITHOUT_CAP_S = 60.0


def _large_wait(cluster: RealStack, tag: str, *, cap: float) -> float | None:
    """A 7g.40gb pod created into a fleet kept full by a stream of 1g.5gb pods of the same
    priority (lifetimes spread around ``STREAM_LIFETIME_S``, four always waiting): seconds until
    it runs, or None if not within ``cap``."""
    apply(cluster, [claim_template("one", profile="1g.5gb", namespace=E2E_NS)])
    apply(cluster, [claim_template("whole", profile="7g.40gb", namespace=E2E_NS)])
    made = 0

    def top_up() -> None:
        nonlocal made
        found = pods(cluster, E2E_NS, label=f"stream={tag}")
        for p in found:
            if p.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                with contextlib.suppress(ApiNotFoundError):
                    cluster.api.delete(PODS, name=p["metadata"]["name"], namespace=E2E_NS)
        live = [p for p in found if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]
        waiting = sum(1 for p in live if is_gated(p))
        for _ in range(max(0, 4 - waiting) if len(live) >= 28 else 32 - len(live)):
            lifetime = STREAM_LIFETIME_S * (0.5 + (made * 0.37) % 1.0)
            body = dra_pod(
                f"{tag}-s{made}",
                template="one",
                namespace=E2E_NS,
                annotations=cluster.exit_annotations("app", lifetime),
            )
            body["metadata"]["labels"] = {"stream": tag}
            body["spec"]["terminationGracePeriodSeconds"] = 1
            body["spec"]["restartPolicy"] = "Never"
            apply(cluster, [body])
            made += 1

    deadline = time.monotonic() + 90
    while sum(running(p) for p in pods(cluster, E2E_NS, label=f"stream={tag}")) < 28:
        assert time.monotonic() < deadline, "the stream never filled the fleet"
        top_up()
        time.sleep(0.5)
    large = dra_pod(f"{tag}-large", template="whole", namespace=E2E_NS)
    large["spec"]["terminationGracePeriodSeconds"] = 1
    started = time.monotonic()
    apply(cluster, [large])
    while time.monotonic() - started < cap:
        if running(get_pod(cluster, E2E_NS, f"{tag}-large")):
            return time.monotonic() - started
        top_up()
        time.sleep(0.5)
    return None


def test_a_whole_gpu_pod_runs_within_the_starvation_bound_plus_one_lifetime_under_a_stream(
    cluster: RealStack,
) -> None:
    try:
        cluster.restart_controllers(["--starvation-after", f"{STARVATION_AFTER_S:g}"])
        cluster.wait_ready()
        with_reservation = _large_wait(cluster, "with", cap=120)
        assert with_reservation is not None, "the 7g.40gb pod never ran"
        # bound + the longest stream lifetime + the real stack's own start-up of pods
        assert with_reservation <= STARVATION_AFTER_S + 1.5 * STREAM_LIFETIME_S + 20
        cluster.restart_controllers(["--starvation-after", "0"])
        cluster.wait_ready()
        for p in pods(cluster, E2E_NS):
            with contextlib.suppress(ApiNotFoundError):
                cluster.api.delete(PODS, name=p["metadata"]["name"], namespace=E2E_NS)
        wait_for(cluster, lambda: not pods(cluster, E2E_NS), message="pods not gone")
        without = _large_wait(cluster, "without", cap=WITHOUT_CAP_S)
    finally:
        cluster.restart_controllers()
        cluster.wait_ready()
    shown = f"{without:.1f}s" if without is not None else f"not placed within {WITHOUT_CAP_S:g}s"
    print(
        f"7g.40gb under a 1g.5gb stream: {with_reservation:.1f}s with --starvation-after "
        f"{STARVATION_AFTER_S:g} (lifetimes up to {1.5 * STREAM_LIFETIME_S:g}s); without "
        f"reservations: {shown}"
    )


CHURN_S = float(os.environ.get("INSTASLICE_PRIORITY_CHURN_S", "120"))
"""How long the two-priority churn runs (the issue's figure: 600)."""


def _deployment(name: str, *, priority_class: str, replicas: int) -> JsonObject:
    template = pod(f"{name}-pod", priority_class=priority_class, labels={"app": name})
    spec = template["spec"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": E2E_NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }


def test_churn_with_two_priorities_evicts_no_pod_twice_and_never_preempts_back(
    classes: RealStack,
) -> None:
    """A low-priority Deployment fills the fleet; a high-priority one is scaled up and down
    again and again. Every scale-up preempts low pods, whose Deployment re-creates them; they
    wait (equal priority never preempts) and run again once the high pods go."""
    cluster = classes
    apply(cluster, [claim_template("half", profile="3g.20gb", namespace=E2E_NS)])
    apply(cluster, [_deployment("batch", priority_class="e2e-low", replicas=8)])
    wait_running(cluster, E2E_NS, 8, label="app=batch")
    apply(cluster, [_deployment("serve", priority_class="e2e-high", replicas=0)])
    sizes = [3, 0, 2, 4, 1, 0]
    started = time.monotonic()
    steps = 0
    slowest = 0.0
    while time.monotonic() - started < CHURN_S:
        replicas = sizes[steps % len(sizes)]
        scale(cluster, "Deployment", E2E_NS, "serve", replicas)
        step_started = time.monotonic()
        wait_for(
            cluster,
            lambda r=replicas: (
                sum(  # type: ignore[misc]
                    running(p) for p in pods(cluster, E2E_NS, label="app=serve")
                )
                == r
                and len(pods(cluster, E2E_NS, label="app=serve")) == r
            ),
            timeout=60,
            message=f"serve did not reach {replicas} running",
        )
        slowest = max(slowest, time.monotonic() - step_started)
        steps += 1
    scale(cluster, "Deployment", E2E_NS, "serve", 0)
    wait_running(cluster, E2E_NS, 8, label="app=batch")
    preempted = [
        e
        for e in cluster.events(E2E_NS)
        if e.get("reason") == "Preempted"
        and str((e.get("involvedObject") or {}).get("name")).startswith(("batch-", "serve-"))
    ]
    victims = [str((e.get("involvedObject") or {}).get("uid")) for e in preempted]
    names_ = {str((e.get("involvedObject") or {}).get("name")) for e in preempted}
    assert victims, "no preemption happened"
    assert len(victims) == len(set(victims)), "a pod was evicted twice"
    assert all(n.startswith("batch-") for n in names_), f"not only batch pods evicted: {names_}"
    print(
        f"churn {CHURN_S:.0f}s: {steps} scale steps, {len(victims)} evictions, every one a "
        f"low-priority pod evicted once; slowest step to Running {slowest:.1f}s"
    )


@pytest.fixture
def scheduler_mode(classes: RealStack) -> Iterator[RealStack]:
    """kube-scheduler allocates (no webhook, the controller in scheduler mode) for DRA pods; the
    classic shim stays as it is (no classic pod here), so no five-minute switch."""
    classes.set_webhook(on=False)
    classes.set_allocation_mode("scheduler")
    try:
        yield classes
    finally:
        classes.set_allocation_mode("controller")
        classes.set_webhook(on=True)
        wait_for(classes, lambda: classes.webhook_serving() or None, message="webhook down")
        classes.wait_ready()


def test_scheduler_mode_the_controller_preempts_for_a_pod_kube_scheduler_cannot_place(
    scheduler_mode: RealStack,
) -> None:
    """kube-scheduler's preemption frees no DRA devices: the pod is Unschedulable until our
    controller evicts a lower-priority holder; kube-scheduler then allocates and binds it."""
    cluster = scheduler_mode
    apply(cluster, [claim_template("half", profile="3g.20gb", namespace=E2E_NS)])
    spec = [(f"low-{i}", "e2e-low" if i % 2 else "e2e-mid", None) for i in range(8)]
    apply(cluster, [pod(name, priority_class=c) for name, c, _ in spec])
    wait_running(cluster, E2E_NS, 8)
    started = time.monotonic()
    apply(cluster, [pod("urgent", priority_class="e2e-high")])
    wait_pod_running(cluster, E2E_NS, "urgent")
    to_running = time.monotonic() - started
    evicted = [name for name, _, _ in spec if gone(cluster, name)]
    assert len(evicted) == 1, evicted
    assert int(evicted[0].removeprefix("low-")) % 2 == 1, "not a lowest-priority victim"
    print(f"scheduler mode: urgent Running {to_running:.1f}s after creation; victims {evicted}")


def test_scheduler_mode_the_controller_preempts_for_a_classic_pod(classes: RealStack) -> None:
    """extendedResourceName on, the shim off: kube-scheduler serves nvidia.com/mig-* requests
    through DRA and reports a classic pod without room Unschedulable; the controller evicts a
    lower-priority holder and kube-scheduler then places the pod."""
    cluster = classes
    to_scheduler_mode(cluster)
    try:
        spec = [(f"low-{i}", "e2e-low" if i % 2 else "e2e-mid") for i in range(8)]
        for name, priority_class in spec:
            body = classic_pod(name, profile="3g.20gb", namespace=E2E_NS)
            body["spec"]["priorityClassName"] = priority_class
            body["spec"]["terminationGracePeriodSeconds"] = 1
            apply(cluster, [body])
        wait_running(cluster, E2E_NS, 8)
        urgent = classic_pod("urgent", profile="3g.20gb", namespace=E2E_NS)
        urgent["spec"]["priorityClassName"] = "e2e-high"
        started = time.monotonic()
        apply(cluster, [urgent])
        wait_pod_running(cluster, E2E_NS, "urgent")
        to_running = time.monotonic() - started
        evicted = [name for name, _ in spec if gone(cluster, name)]
        assert len(evicted) == 1, evicted
        assert int(evicted[0].removeprefix("low-")) % 2 == 1, "not a lowest-priority victim"
        print(f"scheduler mode, classic: urgent Running {to_running:.1f}s; victims {evicted}")
        for p in pods(cluster, E2E_NS):
            with contextlib.suppress(ApiNotFoundError):
                cluster.api.delete(PODS, name=p["metadata"]["name"], namespace=E2E_NS)
        wait_for(cluster, lambda: not pods(cluster, E2E_NS) or None, message="pods not gone")
    finally:
        to_controller_mode(cluster)
