"""A node whose kubelet rejected a classic pod at admission (our device-plugin shim was not
serving) gets no classic pod for a while: the kubelet fails such pods for good, so sending the next
waiting pod there would fail it too (found on real kubelets during a plugin restart)."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import pytest

from controller.allocation.nodefilter import ADMISSION_REJECTED, NodeFilter
from driver.cluster.kube import KubeClusterApi, configuration_for_url
from driver.cluster.port import PODS, RESOURCE_CLAIMS, JsonObject
from localcluster.apiserver import LocalApiServer
from localcluster.cluster.client import LocalClusterClient
from tests.controller.harness import (
    NS,
    cluster_api,
    get_pod,
    node_object,
    pod_object,
    publish_node,
    start_controller,
    ungated,
    wait_for,
)

ONE_SLICE = {"nvidia.com/mig-1g.5gb": 1}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _on(pod: JsonObject, node: str, **status: Any) -> JsonObject:
    return {**pod, "metadata": {**pod["metadata"], "uid": f"uid-{pod['metadata']['name']}"},
            "spec": {**pod["spec"], "nodeName": node}, "status": status}  # fmt: skip


def _rejected(name: str, node: str) -> JsonObject:
    return _on(
        pod_object(name, classic=ONE_SLICE, gates=()),
        node,
        phase="Failed",
        reason=ADMISSION_REJECTED,
        message="Allocate failed due to rpc error: code = Unavailable",
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def nodes(clock: Clock) -> NodeFilter:
    nodes = NodeFilter(clock=clock, backoff_s=10.0, backoff_max_s=25.0)
    for name in ("node-a", "node-b"):
        node = node_object(name)
        node["status"]["allocatable"]["nvidia.com/mig-1g.5gb"] = "7"
        nodes.node_changed(node)
    return nodes


def test_a_rejection_pauses_classic_pods_on_that_node_only(nodes: NodeFilter, clock: Clock) -> None:
    assert nodes.classic_admission(_rejected("victim", "node-a")) == 10.0
    waiting = pod_object("next", classic=ONE_SLICE)
    reason = nodes.why_not(waiting, "node-a")
    assert reason is not None
    assert "rejected a classic pod at admission" in reason
    assert nodes.why_not(waiting, "node-b") is None, "other nodes are not concerned"
    dra = pod_object("dra", claims=["c"])
    assert nodes.why_not(dra, "node-a") is None, "the kubelet retries DRA prepares: no pause"
    clock.now += 10.5
    assert nodes.why_not(waiting, "node-a") is None, "the pause ends"


def test_further_rejections_lengthen_the_pause_up_to_the_cap(
    nodes: NodeFilter, clock: Clock
) -> None:
    pauses = [nodes.classic_admission(_rejected(f"victim-{i}", "node-a")) for i in range(4)]
    assert pauses == [10.0, 20.0, 25.0, 25.0]
    clock.now += 24
    assert nodes.why_not(pod_object("next", classic=ONE_SLICE), "node-a") is not None


def test_a_classic_pod_running_on_the_node_ends_the_pause(nodes: NodeFilter) -> None:
    nodes.classic_admission(_rejected("victim", "node-a"))
    running = _on(pod_object("served", classic=ONE_SLICE, gates=()), "node-a", phase="Running")
    assert nodes.classic_admission(running) is None
    assert nodes.why_not(pod_object("next", classic=ONE_SLICE), "node-a") is None
    assert nodes.classic_admission(_rejected("again", "node-a")) == 10.0, "counted afresh"


@pytest.mark.parametrize(
    "status",
    [
        {"phase": "Failed", "reason": "OutOfcpu"},
        {"phase": "Failed"},
        {"phase": "Succeeded"},
        {"phase": "Pending"},
    ],
    ids=["other-admission-reason", "container-failed", "succeeded", "pending"],
)
def test_other_pod_fates_pause_nothing(nodes: NodeFilter, status: dict[str, str]) -> None:
    pod = _on(pod_object("p", classic=ONE_SLICE, gates=()), "node-a", **status)
    assert nodes.classic_admission(pod) is None
    assert nodes.why_not(pod_object("next", classic=ONE_SLICE), "node-a") is None


def test_a_rejected_dra_pod_pauses_nothing(nodes: NodeFilter) -> None:
    dra = _on(
        pod_object("dra", claims=["c"], gates=()),
        "node-a",
        phase="Failed",
        reason=ADMISSION_REJECTED,
    )
    assert nodes.classic_admission(dra) is None


def test_the_controller_sends_the_next_classic_pod_elsewhere_after_a_rejection(
    apiserver: LocalApiServer, stack: ExitStack
) -> None:
    api: KubeClusterApi = cluster_api(apiserver, stack)
    publish_node(api, "node-a", gpus=1)
    publish_node(api, "node-b", gpus=1)
    start_controller(apiserver, stack)
    api.create(PODS, pod_object("first", classic=ONE_SLICE), namespace=NS)
    wait_for(lambda: ungated(api, "first"), what="first placed")
    first = get_pod(api, "first")
    node = first["spec"]["nodeSelector"]["kubernetes.io/hostname"]
    # what the kubelet does when the shim's socket is dead: bind, then fail the pod for good
    binder = LocalClusterClient(configuration=configuration_for_url(apiserver.url))
    stack.callback(binder.close)
    binder.bind_pod(namespace=NS, name="first", uid=first["metadata"]["uid"], node=node)
    first = get_pod(api, "first")
    first["status"] = {"phase": "Failed", "reason": ADMISSION_REJECTED, "message": "Allocate"}
    api.update_status(PODS, first)
    wait_for(
        lambda: (
            not any(
                c.get("status", {}).get("allocation")
                for c in api.list_objects(RESOURCE_CLAIMS, namespace=NS).items
            )
        ),
        what="the failed pod's shadow claim released",
    )
    api.create(PODS, pod_object("second", classic=ONE_SLICE), namespace=NS)
    wait_for(lambda: ungated(api, "second"), what="second placed")
    second = get_pod(api, "second")
    other = "node-b" if node == "node-a" else "node-a"
    assert second["spec"]["nodeSelector"]["kubernetes.io/hostname"] == other
