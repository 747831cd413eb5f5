"""The two allocation modes on real Kubernetes (README "Allocation modes", docs/deploy.md):

* switching a live cluster from controller mode to scheduler mode and back, in the documented
  order, while pods run: they keep their slices, new pods are served by the new mode;
* every sample in scheduler mode (kube-scheduler allocates; classic pods through the DeviceClasses'
  ``extendedResourceName``), with the kubelet's stale ``nvidia.com/mig-*`` entries kept out of the
  Node status by the plugin;
* the controller's hand-offs: a DRA pod without capacity, and a placed pod kube-scheduler cannot
  bind, go to kube-scheduler, which reports/allocates them itself.

The session's stack runs controller mode; each test here leaves it in controller mode again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from api import names
from driver.cluster.port import NODES, PODS, RESOURCE_CLAIMS, JsonObject
from localcluster.manifests import read_kustomization
from localcluster.realstack import RealStack
from localcluster.stack import SAMPLES_DIR
from tests.e2e.conftest import E2E_NS
from tests.e2e.helpers import (
    QUOTA_NS,
    SAMPLES_NS,
    apply,
    claim_template,
    classic_pod,
    dra_pod,
    get_pod,
    phase,
    pods,
    running,
    slices_of_pod,
    wait_for,
    wait_invariants,
    wait_pod_running,
)

HANDOFF_S = 3
KUBELET_FORGETS_S = 400.0
"""The kubelet forgets a device plugin 5 minutes after it went (``endpointStopGracePeriod``), and
updates its Node's status on its next sync (10 s); some margin on a loaded machine."""
KUBELET_STATUS_PERIOD_S = 12.0
"""A little over the kubelet's node status update period (10 s): time for it to write back what
it remembers, so that a test can see the plugin keep the stale entries out."""


def _stale_classic(stack: RealStack) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for node in stack.node_names:
        status = stack.api.get(NODES, name=node).get("status") or {}
        names_ = sorted(
            {
                name
                for field in ("capacity", "allocatable")
                for name in status.get(field) or {}
                if name.startswith(names.CLASSIC_RESOURCE_PREFIX)
            }
        )
        if names_:
            found[node] = names_
    return found


def to_scheduler_mode(stack: RealStack, *, held: dict[str, list[str]] | None = None) -> None:
    """docs/deploy.md, controller → scheduler, step by step. ``held``: node → classic resources
    pods started before the switch still hold there (they stay listed until those pods end)."""
    stack.set_extended_resource_names(on=True)
    stack.set_classic_shim(on=False)
    # The plugins clear nvidia.com/mig-* once the kubelet has forgotten the device plugin: 5
    # minutes after it went (until then, a classic pod bound through DRA would be failed by it).
    wait_for(
        stack,
        lambda: _stale_classic(stack) == (held or {}) or None,
        timeout=KUBELET_FORGETS_S / stack.timeout_scale,
        message="the plugins did not clear nvidia.com/mig-* from their Nodes",
        explain=lambda: str(_stale_classic(stack)),
    )
    stack.set_webhook(on=False)
    stack.set_allocation_mode("scheduler")


def to_controller_mode(stack: RealStack, *, handoff_after: float | None = None) -> None:
    """docs/deploy.md, scheduler → controller, step by step."""
    stack.set_allocation_mode("controller", handoff_after=handoff_after)
    stack.set_webhook(on=True)
    wait_for(stack, lambda: stack.webhook_serving() or None, message="webhook not serving")
    stack.set_classic_shim(on=True)
    stack.set_extended_resource_names(on=False)
    stack.wait_ready(classic=True)


@pytest.fixture
def modes(cluster: RealStack) -> Iterator[RealStack]:
    """The cluster, put back into controller mode (default flags) whatever the test did."""
    try:
        yield cluster
    finally:
        to_controller_mode(cluster)


def _slices(stack: RealStack, namespace: str, name: str) -> list[str]:
    return sorted(str(item.mig_uuid) for _, _, item in slices_of_pod(stack.view(), namespace, name))


def _samples() -> list[JsonObject]:
    return [o for o in read_kustomization(SAMPLES_DIR) if o.get("kind") != "Namespace"]


def _expected_pods(objects: list[JsonObject]) -> int:
    return sum(
        int((o.get("spec") or {}).get("replicas", 1))
        for o in objects
        if o.get("kind") in ("Pod", "Deployment", "StatefulSet", "Job")
    )


def _all_running(stack: RealStack, expected: int) -> bool | None:
    found = pods(stack, SAMPLES_NS) + pods(stack, QUOTA_NS)
    if len(found) >= expected and all(running(p) or phase(p) == "Succeeded" for p in found):
        return True
    return None


def _is_classic(pod: JsonObject) -> bool:
    return any(
        str(r).startswith(names.CLASSIC_RESOURCE_PREFIX)
        for c in pod["spec"].get("containers") or []
        for r in ((c.get("resources") or {}).get("limits") or {})
    )


def _shadow_claims(stack: RealStack, pod: JsonObject) -> list[JsonObject]:
    selector = f"{names.SHADOW_CLAIM_LABEL}={pod['metadata']['uid']}"
    return stack.api.list_objects(
        RESOURCE_CLAIMS, namespace=pod["metadata"]["namespace"], label_selector=selector
    ).items


def test_switching_modes_both_ways_keeps_running_pods_and_serves_every_sample(
    modes: RealStack,
) -> None:
    stack = modes
    apply(stack, [claim_template("mode-1g", profile="1g.5gb", namespace=E2E_NS)])
    apply(stack, [dra_pod("before-dra", template="mode-1g", namespace=E2E_NS)])
    apply(stack, [classic_pod("before-classic", profile="1g.5gb", namespace=E2E_NS)])
    for name in ("before-dra", "before-classic"):
        wait_pod_running(stack, E2E_NS, name)
    before = {name: _slices(stack, E2E_NS, name) for name in ("before-dra", "before-classic")}
    assert all(before.values()), before

    classic_node = str(get_pod(stack, E2E_NS, "before-classic")["spec"]["nodeName"])  # type: ignore[index]
    held = {classic_node: [names.classic_resource_name("1g.5gb")]}
    to_scheduler_mode(stack, held=held)
    # The kubelet writes its remembered device-plugin resources back; the plugin keeps them out,
    # except the one a running pre-switch classic pod holds.
    # (between a write-back and the plugin's patch the entry exists for a moment: wait, don't assert)
    time.sleep(KUBELET_STATUS_PERIOD_S)
    wait_for(
        stack,
        lambda: _stale_classic(stack) == held or None,
        message="the kubelet's stale nvidia.com/mig-* came back and stayed",
        explain=lambda: str(_stale_classic(stack)),
    )
    for name, slices in before.items():
        assert running(get_pod(stack, E2E_NS, name)), name
        assert _slices(stack, E2E_NS, name) == slices, name

    # A classic pod served by the shim before the switch gives its slice back when it goes; until
    # it has, the kubelet treats nvidia.com/mig-1g.5gb as a device-plugin resource on its node (a
    # DRA-bound classic pod there would fail), so the plugin keeps the entry and such pods wait.
    instances = sum(len(stack.mig_instances(n)) for n in stack.node_names)
    stack.api.delete(PODS, name="before-classic", namespace=E2E_NS)
    wait_for(
        stack,
        lambda: sum(len(stack.mig_instances(n)) for n in stack.node_names) < instances or None,
        message="the pre-switch classic pod's slice was not destroyed",
    )
    wait_for(
        stack,
        lambda: not _stale_classic(stack) or None,
        timeout=90,
        message="the resource of the ended pre-switch classic pod stayed in its Node's status",
        explain=lambda: str(_stale_classic(stack)),
    )

    # The samples are sized for the demo cluster on their own (first-fit packing); kube-scheduler
    # packs differently, so the pre-switch DRA pod goes first (it kept its slice: checked above).
    stack.api.delete(PODS, name="before-dra", namespace=E2E_NS)
    wait_for(stack, lambda: get_pod(stack, E2E_NS, "before-dra") is None or None)

    # Every sample, served by kube-scheduler: classic pods through a claim it created. Its packing
    # is not first-fit: created last, the three-slices-on-one-GPU pod found no GPU with three
    # free 1g.5gb on the full demo cluster (seen on the real stack) — a packing difference of the
    # modes (README "Allocation modes"), so it goes first here.
    objects = sorted(_samples(), key=lambda o: "three" not in str(o["metadata"]["name"]))
    apply(stack, objects)
    expected = _expected_pods(objects)
    wait_for(
        stack,
        lambda: _all_running(stack, expected),
        timeout=60,
        message="not every sample runs in scheduler mode",
        explain=lambda: str(
            [
                (p["metadata"]["name"], phase(p))
                for p in pods(stack, SAMPLES_NS) + pods(stack, QUOTA_NS)
            ]
        ),
    )
    for namespace in (SAMPLES_NS, QUOTA_NS):
        for pod in pods(stack, namespace):
            if running(pod) and _is_classic(pod):
                assert (pod.get("status") or {}).get("extendedResourceClaimStatus"), pod["metadata"]
                assert _shadow_claims(stack, pod) == []
    wait_invariants(stack, (SAMPLES_NS, QUOTA_NS, E2E_NS), timeout=30)

    to_controller_mode(stack)
    apply(stack, [dra_pod("after-dra", template="mode-1g", namespace=E2E_NS)])
    apply(stack, [classic_pod("after-classic", profile="1g.5gb", namespace=E2E_NS)])
    for name in ("after-dra", "after-classic"):
        wait_pod_running(stack, E2E_NS, name)
    after_classic = get_pod(stack, E2E_NS, "after-classic")
    assert after_classic is not None
    assert len(_shadow_claims(stack, after_classic)) == 1  # the controller served it
    assert not (after_classic.get("status") or {}).get("extendedResourceClaimStatus")
    wait_invariants(stack, (SAMPLES_NS, QUOTA_NS, E2E_NS), timeout=30)


def _placement(pod: JsonObject | None) -> tuple[str, str]:
    for condition in ((pod or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == names.PLACEMENT_CONDITION:
            return str(condition.get("status")), str(condition.get("reason"))
    return "", ""


def _scheduled(pod: JsonObject | None) -> tuple[str, str]:
    for condition in ((pod or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled":
            return str(condition.get("status")), str(condition.get("reason") or "")
    return "", ""


def test_the_controller_hands_a_pod_without_capacity_and_an_unbindable_pod_to_kube_scheduler(
    modes: RealStack,
) -> None:
    stack = modes
    stack.set_allocation_mode("controller", handoff_after=HANDOFF_S)
    wait_for(stack, lambda: stack.webhook_serving() or None, message="webhook not serving")
    gpus = len(stack.node_names) * int(stack.config.gpus.split("x", 1)[0])
    apply(stack, [claim_template("whole-gpu", profile="7g.40gb", namespace=E2E_NS)])
    for i in range(gpus):
        apply(stack, [dra_pod(f"full-{i}", template="whole-gpu", namespace=E2E_NS)])
    for i in range(gpus):
        wait_pod_running(stack, E2E_NS, f"full-{i}")

    # No capacity: after --handoff-after the pod is ungated with its claim unallocated, and
    # kube-scheduler reports it Unschedulable (what cluster autoscalers act on).
    apply(stack, [dra_pod("waits", template="whole-gpu", namespace=E2E_NS)])
    wait_for(
        stack,
        lambda: _placement(get_pod(stack, E2E_NS, "waits")) == ("False", "HandedOff") or None,
        message="the pod without capacity was not handed off",
    )
    wait_for(
        stack,
        lambda: _scheduled(get_pod(stack, E2E_NS, "waits")) == ("False", "Unschedulable") or None,
        message="kube-scheduler does not report the handed-off pod Unschedulable",
    )
    # Capacity comes back: kube-scheduler allocates and binds it itself.
    stack.api.delete(PODS, name="full-0", namespace=E2E_NS)
    wait_pod_running(stack, E2E_NS, "waits")
    wait_invariants(stack, (E2E_NS,), timeout=30)
    for i in range(1, gpus):
        stack.api.delete(PODS, name=f"full-{i}", namespace=E2E_NS)
    stack.api.delete(PODS, name="waits", namespace=E2E_NS)
    wait_for(
        stack,
        lambda: not pods(stack, E2E_NS) or None,
        message="the whole-GPU pods did not go",
    )
    # Every GPU free again, so that first-fit places the next pod on the first node.
    wait_for(
        stack,
        lambda: (
            not [
                c
                for c in stack.api.list_objects(RESOURCE_CLAIMS, namespace=E2E_NS).items
                if (c.get("status") or {}).get("allocation")
            ]
            or None
        ),
        message="the whole-GPU claims were not released",
    )

    # Not bindable: every node has its host port taken by a pod the controller does not model, so
    # kube-scheduler cannot bind the pod wherever the controller placed it. Past --handoff-after our
    # allocation is withdrawn (HandedOff); once a port is free, kube-scheduler allocates and binds.
    for node in stack.node_names:
        apply(stack, [_port_holder(node)])
    for node in stack.node_names:
        wait_pod_running(stack, E2E_NS, f"port-holder-{node}")
    apply(stack, [claim_template("mode-1g", profile="1g.5gb", namespace=E2E_NS)])
    apply(stack, [_with_host_port(dra_pod("needs-port", template="mode-1g", namespace=E2E_NS))])
    wait_for(
        stack,
        lambda: _placement(get_pod(stack, E2E_NS, "needs-port")) == ("False", "HandedOff") or None,
        message="the unbindable pod was not handed off",
    )
    assert "not bound" in _placement_message(get_pod(stack, E2E_NS, "needs-port"))
    free = sorted(stack.node_names)[-1]
    stack.api.delete(PODS, name=f"port-holder-{free}", namespace=E2E_NS)
    pod = wait_pod_running(stack, E2E_NS, "needs-port")
    assert pod["spec"]["nodeName"] == free
    wait_invariants(stack, (E2E_NS,), timeout=30)


def _port_holder(node: str) -> JsonObject:
    return _with_host_port(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"port-holder-{node}", "namespace": E2E_NS},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [{"name": "app", "image": "busybox:1.36"}],
            },
        }
    )


def _placement_message(pod: JsonObject | None) -> str:
    for condition in ((pod or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == names.PLACEMENT_CONDITION:
            return str(condition.get("message"))
    return ""


def _with_host_port(pod: JsonObject) -> JsonObject:
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": 8080, "hostPort": 18080}]
    return pod
