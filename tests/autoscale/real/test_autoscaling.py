"""cluster-autoscaler 1.36 and InstaSlice on real Kubernetes, in both allocation modes.

Three scenarios, in this order (the session starts in scheduler mode; the last one switches to
controller mode, which is cheap one way and slow the other):

1. scheduler mode, a group at size 1: a burst of MIG pods — DRA claims and classic requests
   served through ``extendedResourceName`` — that does not fit grows the group whose GPUs have the
   profile (not the other), every pod runs with its own slices; once the pods end the idle nodes
   go, and nothing of theirs stays behind;
2. scheduler mode, a group at size 0: its template carries no ResourceSlices, so pods with DRA
   claims alone bring no node (the autoscaler says why on the pod), a classic request does (the
   template's ``nvidia.com/mig-*``), and once the autoscaler has seen a node of the group Ready for
   a minute it keeps that node's slices as the group's template: DRA claims then bring a node from
   0 too;
3. controller mode: pods the controller cannot place are handed off after ``--handoff-after``,
   the autoscaler adds a node, the pods run; classic pods are never handed off but ride along on
   the new node. Fragmentation: a 7g.40gb pod pending while enough memory slices are free on two
   GPUs — the autoscaler adds a node; with the group at its maximum, ``instaslice defrag --apply``
   frees a GPU instead and no node is added. Scale-down: with the autoscaler's default threshold a
   node whose pod holds a slice stays (one slice counts as a full GPU); with the group's threshold
   at 1 a node whose pod can move is drained (the slice released) and removed, while a node whose
   bare pod holds a slice stays; at the end the group is at 0 and no removed node left a MIG
   instance, a CDI spec, a checkpoint entry, an allocated claim or a ResourceSlice.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence

from api import names
from driver.cluster.port import PODS, JsonObject
from tests.autoscale.real.conftest import A100, H100, Autoscaled
from tests.autoscale.real.steps import (
    PodClock,
    autoscaler_events,
    group_nodes,
    ready_for,
    removal_problems,
    set_scale_down_disabled,
    summary,
    until,
    wait_group_size,
)
from tests.e2e.conftest import E2E_NS
from tests.e2e.helpers import (
    apply,
    claim_template,
    classic_pod,
    delete_everything,
    dra_pod,
    get_pod,
    pods,
    scale,
    wait_invariants,
)
from tests.real.test_modes import to_controller_mode, to_scheduler_mode

SCALE_UP_S = 480.0
"""Pending → Running through a scale-up on this shared 2-core machine, with a wide margin."""
SCALE_DOWN_S = 360.0
NODE_READY_MINUTE_S = 70.0
"""cluster-autoscaler copies a node of a group as its template once it has been Ready for a
minute (``stabilizationDelay``); some margin for its next loop."""
HANDOFF_S = 10.0
"""The controller's ``--handoff-after`` here: cluster-autoscaler's scan interval."""
INVARIANTS_S = 60.0


def _ns_empty(cluster: Autoscaled) -> None:
    delete_everything(cluster.stack, [E2E_NS])
    until(
        cluster.stack,
        lambda: not pods(cluster.stack, E2E_NS) or None,
        timeout=180,
        message="the scenario's pods did not go",
    )


def _scale_up_figures(
    cluster: Autoscaled, clock: PodClock, pods_: Sequence[str], *, new_nodes: set[str], since: float
) -> dict[str, object]:
    """Pending → bound and → Running of the pods that ran on new nodes; how many nodes the
    autoscaler asked for, and when the first, counted from ``since`` (the burst)."""
    scaled = [p for p in pods_ if clock.node_of.get(p) in new_nodes]
    requested = [
        e.at - since
        for e in cluster.provider.history()
        if e.at >= since and e.what == "requested" and e.node in new_nodes
    ]
    return {
        "pending_to_bound": summary(clock.pending_to_bound(scaled)),
        "pending_to_running": summary(clock.pending_to_running(scaled)),
        "nodes_requested": len(
            {e.node for e in cluster.provider.history() if e.at >= since and e.what == "requested"}
        ),
        "nodes_added": len(new_nodes),
        "first_increase_after_s": round(min(requested), 1) if requested else None,
    }


def _ensure_scheduler_mode(cluster: Autoscaled) -> None:
    if cluster.stack.classic_shim_on:
        to_scheduler_mode(cluster.stack)


# --- 1 -------------------------------------------------------------------------------------------


def test_scheduler_mode_burst_grows_the_group_that_fits_from_size_one_and_idle_nodes_go(
    autoscaled: Autoscaled,
) -> None:
    cluster, stack, provider = autoscaled, autoscaled.stack, autoscaled.provider
    _ensure_scheduler_mode(cluster)
    (first,) = wait_group_size(stack, provider, A100.id, 1, timeout=SCALE_DOWN_S)
    # the autoscaler takes a node Ready for a minute as the group's template, slices included
    until(
        stack,
        lambda: ready_for(stack, first) >= NODE_READY_MINUTE_S or None,
        timeout=NODE_READY_MINUTE_S + 60,
        message=f"{first} not Ready for a minute",
    )
    clock = PodClock(stack, E2E_NS)
    clock.create([claim_template("burst-1g", profile="1g.5gb", namespace=E2E_NS)])
    dra = [dra_pod(f"s-dra-{i}", template="burst-1g", namespace=E2E_NS) for i in range(8)]
    classic = [classic_pod(f"s-classic-{i}", profile="1g.5gb", namespace=E2E_NS) for i in range(8)]
    since = time.monotonic()
    clock.create([p for pair in zip(dra, classic, strict=True) for p in pair])
    burst = sorted(clock.created)

    clock.wait_running(16, timeout=SCALE_UP_S, prefix="s-")
    nodes = wait_group_size(stack, provider, A100.id, 3, timeout=120)
    assert group_nodes(provider, H100.id) == []  # no 1g.5gb there: the other group never grew
    new = set(nodes) - {first}
    assert {clock.node_of[p] for p in burst} <= set(nodes)
    wait_invariants(stack, [E2E_NS], timeout=INVARIANTS_S)  # own slices, no overlap
    for pod in pods(stack, E2E_NS):
        if pod["metadata"]["name"].startswith("s-classic-"):  # kube-scheduler made its claim
            assert (pod.get("status") or {}).get("extendedResourceClaimStatus"), pod["metadata"]
    triggered = [r for p in burst for r, _ in autoscaler_events(stack, E2E_NS, p)]
    assert "TriggeredScaleUp" in triggered, triggered
    cluster.figures["scheduler_mode_from_size_1"] = _scale_up_figures(
        cluster, clock, burst, new_nodes=new, since=since
    )

    gone_since = time.monotonic()
    _ns_empty(cluster)
    (left,) = wait_group_size(stack, provider, A100.id, A100.min_size, timeout=SCALE_DOWN_S)
    removed = set(nodes) - {left}
    assert removal_problems(stack, cluster.launcher, removed) == []
    cluster.figures["scheduler_mode_idle_nodes_removed_after_s"] = round(
        time.monotonic() - gone_since, 1
    )


# --- 2 -------------------------------------------------------------------------------------------


def test_scheduler_mode_from_zero_classic_requests_bring_a_node_claims_once_one_was_seen(
    autoscaled: Autoscaled,
) -> None:
    cluster, stack, provider = autoscaled, autoscaled.stack, autoscaled.provider
    _ensure_scheduler_mode(cluster)
    wait_group_size(stack, provider, H100.id, 0, timeout=SCALE_DOWN_S)
    figures: dict[str, object] = {}
    clock = PodClock(stack, E2E_NS)
    clock.create([claim_template("zero-2g", profile="2g.20gb", namespace=E2E_NS)])

    # DRA claims alone: the h100 template has no ResourceSlices, so no simulated node has a
    # device for them, and the autoscaler says so on the pod
    asked = time.monotonic()
    clock.create([dra_pod(f"z-dra-{i}", template="zero-2g", namespace=E2E_NS) for i in range(2)])
    reasons = until(
        stack,
        lambda: (
            [e for e in autoscaler_events(stack, E2E_NS, "z-dra-0") if e[0] == "NotTriggerScaleUp"]
            or None
        ),
        timeout=180,
        message="cluster-autoscaler said nothing about the claim-only pod",
    )
    time.sleep(2 * cluster.autoscaler.settings.scan_interval_s)
    assert not [e for e in provider.history() if e.group == H100.id and e.at >= asked]
    figures["claims_only_at_zero"] = {"scaled_up": False, "autoscaler_said": reasons[0][1]}

    # a classic request fits the template's nvidia.com/mig-2g.20gb: the group grows from 0, and
    # the claim-only pods run on the new node too
    since = time.monotonic()
    clock.create([classic_pod("z-classic-0", profile="2g.20gb", namespace=E2E_NS)])
    clock.wait_running(3, timeout=SCALE_UP_S, prefix="z-")
    (h100,) = wait_group_size(stack, provider, H100.id, 1, timeout=120)
    assert {clock.node_of[p] for p in clock.created} == {h100}
    wait_invariants(stack, [E2E_NS], timeout=INVARIANTS_S)
    figures["classic_from_zero"] = _scale_up_figures(
        cluster, clock, ["z-classic-0"], new_nodes={h100}, since=since
    )

    # once the autoscaler has seen the node Ready for a minute, it keeps it as the group's template
    until(
        stack,
        lambda: ready_for(stack, h100) >= NODE_READY_MINUTE_S or None,
        timeout=NODE_READY_MINUTE_S + 60,
        message=f"{h100} not Ready for a minute",
    )
    _ns_empty(cluster)
    wait_group_size(stack, provider, H100.id, 0, timeout=SCALE_DOWN_S)
    assert removal_problems(stack, cluster.launcher, [h100]) == []

    # ... and from that template, claims alone bring a node from 0
    again = PodClock(stack, E2E_NS)
    again.create([claim_template("zero-2g", profile="2g.20gb", namespace=E2E_NS)])
    since = time.monotonic()
    again.create([dra_pod(f"c-dra-{i}", template="zero-2g", namespace=E2E_NS) for i in range(2)])
    again.wait_running(2, timeout=SCALE_UP_S, prefix="c-")
    (second,) = wait_group_size(stack, provider, H100.id, 1, timeout=120)
    wait_invariants(stack, [E2E_NS], timeout=INVARIANTS_S)
    figures["claims_from_zero_with_remembered_template"] = _scale_up_figures(
        cluster, again, sorted(again.created), new_nodes={second}, since=since
    )
    _ns_empty(cluster)
    wait_group_size(stack, provider, H100.id, 0, timeout=SCALE_DOWN_S)
    assert removal_problems(stack, cluster.launcher, [second]) == []
    cluster.figures["scheduler_mode_from_size_0"] = figures


# --- 3 -------------------------------------------------------------------------------------------


def _placement(pod: JsonObject | None) -> str:
    for condition in ((pod or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == names.PLACEMENT_CONDITION:
            return str(condition.get("reason"))
    return ""


def _deployment(name: str, *, template: str, replicas: int) -> JsonObject:
    pod = dra_pod(name, template=template, namespace=E2E_NS)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": E2E_NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod["spec"]},
        },
    }


def _pinned(pod: JsonObject, node: str) -> JsonObject:
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return pod


def _on(cluster: Autoscaled, prefix: str) -> dict[str, str]:
    """Running pods whose names start with ``prefix`` → their node."""
    return {
        str(p["metadata"]["name"]): str(p["spec"].get("nodeName"))
        for p in pods(cluster.stack, E2E_NS)
        if str(p["metadata"]["name"]).startswith(prefix)
        and (p.get("status") or {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    }


def _defrag(cluster: Autoscaled, profile: str) -> tuple[int, str]:
    """``instaslice defrag --apply``, as an operator runs it."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "instaslice",
            "defrag",
            "--profile",
            profile,
            "--apply",
            "--yes",
            "--kubeconfig",
            str(cluster.stack.kubeconfig),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def test_controller_mode_hand_off_fragmentation_and_scale_down(autoscaled: Autoscaled) -> None:
    cluster, stack, provider = autoscaled, autoscaled.stack, autoscaled.provider
    to_controller_mode(stack, handoff_after=HANDOFF_S)
    (first,) = wait_group_size(stack, provider, A100.id, A100.min_size, timeout=SCALE_DOWN_S)
    figures: dict[str, object] = {"handoff_after_s": HANDOFF_S}
    added = _burst_handed_off(cluster, first, figures)
    # first-fit goes through nodes in name order: the fill goes on the first, what moves on the other
    first, second = sorted([first, added])
    third = _fragmented_7g(cluster, first, second, figures)
    _scale_down(cluster, first, second, figures)
    assert removal_problems(stack, cluster.launcher, [first, second, third]) == []
    cluster.figures["controller_mode"] = figures


def _burst_handed_off(cluster: Autoscaled, first: str, figures: dict[str, object]) -> str:
    """12 claims and 2 classic requests for the 7 slices of ``first``: what the controller cannot
    place is handed off, the autoscaler adds a node for the DRA pods, the classic ones ride along.
    Returns the new node."""
    stack, provider = cluster.stack, cluster.provider
    clock = PodClock(stack, E2E_NS)
    clock.create([claim_template("burst-1g", profile="1g.5gb", namespace=E2E_NS)])
    since = time.monotonic()
    apply(stack, [_deployment("burst", template="burst-1g", replicas=12)])
    clock.create(
        [classic_pod(f"classic-{i}", profile="1g.5gb", namespace=E2E_NS) for i in range(2)]
    )
    clock.expect("burst-", at=since)
    clock.wait_running(14, timeout=SCALE_UP_S)
    (second,) = set(wait_group_size(stack, provider, A100.id, 2, timeout=120)) - {first}
    handed_off = [p for p in clock.created if _placement(get_pod(stack, E2E_NS, p)) == "HandedOff"]
    assert handed_off, "no pod was handed off"
    assert not [p for p in handed_off if p.startswith("classic-")]  # classic pods never are
    wait_invariants(stack, [E2E_NS], timeout=INVARIANTS_S)
    result = _scale_up_figures(
        cluster, clock, sorted(clock.created), new_nodes={second}, since=since
    )
    figures["scale_up"] = {**result, "handed_off": len(handed_off)}
    return second


def _fragmented_7g(cluster: Autoscaled, first: str, second: str, figures: dict[str, object]) -> str:
    """5 slices taken on ``first``'s GPU, 2 on ``second``'s: 9 memory slices free, no GPU with
    the 8 a 7g.40gb needs; the two on ``second`` can move (a Deployment; first-fit, which goes
    through nodes in name order, puts them there while ``first`` is full and puts them back on
    ``first`` when they are moved). The autoscaler adds a
    node for the 7g.40gb pod; with the group at its maximum, ``instaslice defrag`` frees
    ``second``'s GPU instead. Returns the node the autoscaler added (removed again since)."""
    stack, provider = cluster.stack, cluster.provider
    set_scale_down_disabled(stack, [first, second], disabled=True)
    _ns_empty(cluster)
    apply(stack, [claim_template("one-1g", profile="1g.5gb", namespace=E2E_NS)])
    fill = [dra_pod(f"fill-{i}", template="one-1g", namespace=E2E_NS) for i in range(7)]
    apply(stack, [_pinned(pod, first) for pod in fill])
    until(
        stack, lambda: len(_on(cluster, "fill-")) == 7 or None, timeout=SCALE_UP_S, message="fill"
    )
    apply(stack, [_deployment("movers", template="one-1g", replicas=2)])
    until(
        stack,
        lambda: set(_on(cluster, "movers-").values()) == {second} or None,
        timeout=SCALE_UP_S,
        message="the movers did not run on the second node",
    )
    for i in (5, 6):
        stack.api.delete(PODS, name=f"fill-{i}", namespace=E2E_NS)
    until(
        stack,
        lambda: len(stack.mig_instances(first)) == 5 or None,
        timeout=120,
        message="the two fill pods' slices were not destroyed",
    )
    apply(stack, [claim_template("whole-7g", profile="7g.40gb", namespace=E2E_NS)])

    # what the autoscaler does: the 7g.40gb pod is handed off and gets a node of its own
    big = PodClock(stack, E2E_NS)
    since = time.monotonic()
    big.create([dra_pod("big-1", template="whole-7g", namespace=E2E_NS)])
    big.wait_running(1, timeout=SCALE_UP_S, prefix="big-1")
    third = big.node_of["big-1"]
    assert third not in (first, second)
    figures["fragmented_7g_without_defrag"] = _scale_up_figures(
        cluster, big, ["big-1"], new_nodes={third}, since=since
    )
    stack.api.delete(PODS, name="big-1", namespace=E2E_NS)
    wait_group_size(stack, provider, A100.id, 2, timeout=SCALE_DOWN_S)
    assert removal_problems(stack, cluster.launcher, [third]) == []

    # with the group at its maximum, defragmenting frees the second GPU and no node is added
    provider.groups.set_limits(A100.id, min_size=A100.min_size, max_size=2)
    since = time.monotonic()
    big.create([dra_pod("big-2", template="whole-7g", namespace=E2E_NS)])
    until(
        stack,
        lambda: _placement(get_pod(stack, E2E_NS, "big-2")) == "NoCapacity" or None,
        timeout=120,
        message="the 7g.40gb pod was not found without capacity",
    )
    code, out = _defrag(cluster, "7g.40gb")
    assert code == 0, out
    assert out.count(": evicted") == 2, out
    big.wait_running(1, timeout=SCALE_UP_S, prefix="big-2")
    assert big.node_of["big-2"] == second
    until(
        stack,
        lambda: set(_on(cluster, "movers-").values()) == {first} or None,
        timeout=SCALE_UP_S,
        message="the moved pods did not run again on the first node",
    )
    assert not [e for e in provider.history() if e.at >= since and e.what == "requested"]
    wait_invariants(stack, [E2E_NS], timeout=INVARIANTS_S)
    figures["fragmented_7g_with_defrag"] = {
        "pending_to_running": summary(big.pending_to_running(["big-2"])),
        "nodes_added": 0,
        "defrag": out.strip().splitlines(),
    }
    return third


def _scale_down(cluster: Autoscaled, first: str, second: str, figures: dict[str, object]) -> None:
    """``first`` holds one slice of a Deployment's pod, ``second`` one of a bare pod. With the
    autoscaler's default threshold neither goes: one MIG slice makes a GPU count as fully used.
    With the group's threshold at 1, ``first`` is drained (its slice released before it goes) and
    removed; ``second`` stays while its bare pod runs; once idle the group goes to 0."""
    stack, provider, autoscaler = cluster.stack, cluster.provider, cluster.autoscaler
    settings = autoscaler.settings
    stack.api.delete(PODS, name="big-2", namespace=E2E_NS)
    for i in range(5):
        stack.api.delete(PODS, name=f"fill-{i}", namespace=E2E_NS)
    apply(stack, [_pinned(dra_pod("holder", template="one-1g", namespace=E2E_NS), second)])
    scale(stack, "Deployment", E2E_NS, "movers", 1)
    until(
        stack,
        lambda: (len(_on(cluster, "movers-")) == 1 and "holder" in _on(cluster, "holder")) or None,
        timeout=SCALE_UP_S,
        message="one mover and the holder do not run",
    )
    provider.groups.set_limits(A100.id, min_size=0, max_size=A100.max_size)
    set_scale_down_disabled(stack, [first, second], disabled=False)
    time.sleep(settings.scale_down_unneeded_s + 3 * settings.scan_interval_s)
    assert sorted(group_nodes(provider, A100.id)) == [first, second]
    verdicts = autoscaler.log_lines(f"Node {first} unremovable", "100% of allocatable")
    assert verdicts, "the autoscaler gave no reason to keep the node with one slice"
    figures["one_slice_counts_as"] = verdicts[-1].split("unremovable: ", 1)[1]

    provider.groups.set_scale_down_utilization_threshold(A100.id, 1.0)
    judged = time.monotonic()
    wait_group_size(stack, provider, A100.id, 1, timeout=SCALE_DOWN_S)
    assert group_nodes(provider, A100.id) == [second]  # the holder's node stays
    assert removal_problems(stack, cluster.launcher, [first]) == []
    figures["drained_node_removed_after_s"] = round(time.monotonic() - judged, 1)
    until(
        stack,
        lambda: set(_on(cluster, "movers-").values()) == {second} or None,
        timeout=SCALE_UP_S,
        message="the drained mover did not run again on the holder's node",
    )
    # while the holder runs its node stays, however long it is underused
    time.sleep(settings.scale_down_unneeded_s + 3 * settings.scan_interval_s)
    assert group_nodes(provider, A100.id) == [second]
    assert "holder" in _on(cluster, "holder")
    _ns_empty(cluster)
    wait_group_size(stack, provider, A100.id, 0, timeout=SCALE_DOWN_S)
    provider.groups.set_scale_down_utilization_threshold(A100.id, None)
    wait_invariants(stack, [E2E_NS], timeout=INVARIANTS_S)
