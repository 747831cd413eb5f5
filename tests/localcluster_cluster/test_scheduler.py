"""The binding-only scheduler: waits for allocation, follows the allocation's node, respects
selectors, taints and resources, reserves claims, and refuses like kube-scheduler 1.36 does when an
allocation lacks its timestamp (docs/design.md F2)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from driver.cluster.ops import remove_scheduling_gate
from driver.cluster.port import PODS, RESOURCE_CLAIMS
from localcluster.cluster.kubelet import NodeSpec
from localcluster.cluster.runner import LocalCluster
from tests.localcluster_cluster.conftest import NS, allocation, claim, pod

TWO_NODES = (
    NodeSpec(
        "node-a", cpu="4", taints=({"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},)
    ),
    NodeSpec("node-b", cpu="16", labels={"zone": "b"}),
)


def _pod(cluster: LocalCluster, name: str) -> dict[str, Any]:
    assert cluster.api is not None
    return cluster.api.get(PODS, name=name, namespace=NS)


def _scheduled_condition(cluster: LocalCluster, name: str) -> dict[str, Any] | None:
    for condition in _pod(cluster, name).get("status", {}).get("conditions") or []:
        if condition["type"] == "PodScheduled":
            return dict(condition)
    return None


def _allocate(cluster: LocalCluster, name: str, node: str, *, timestamp: bool = True) -> None:
    assert cluster.api is not None
    current = cluster.api.get(RESOURCE_CLAIMS, name=name, namespace=NS)
    updated = copy.deepcopy(current)
    updated["status"] = {"allocation": allocation(node, timestamp=timestamp)}
    cluster.api.update_status(RESOURCE_CLAIMS, updated)


def test_binds_only_after_allocation_and_to_the_allocated_node(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster(TWO_NODES)
    api = cluster.api
    assert api is not None
    api.create(RESOURCE_CLAIMS, claim("gpu", finalizer=True))
    created = api.create(
        PODS,
        pod(
            "p",
            claims=[{"name": "gpu", "resourceClaimName": "gpu"}],
            tolerations=[{"key": "dedicated", "operator": "Exists"}],
        ),
    )
    waiting = cluster.wait_for(lambda: _scheduled_condition(cluster, "p"))
    assert waiting["status"] == "False"
    assert waiting["reason"] == "Unschedulable"
    assert "not allocated" in waiting["message"]
    assert not _pod(cluster, "p")["spec"].get("nodeName")

    _allocate(cluster, "gpu", "node-b")
    cluster.wait_for(lambda: _pod(cluster, "p")["spec"].get("nodeName"))
    assert _pod(cluster, "p")["spec"]["nodeName"] == "node-b"
    reserved = api.get(RESOURCE_CLAIMS, name="gpu", namespace=NS)["status"]["reservedFor"]
    assert reserved == [{"resource": "pods", "name": "p", "uid": created["metadata"]["uid"]}]


@pytest.mark.parametrize(
    ("spec", "requests", "expected"),
    [
        ({"nodeSelector": {"zone": "b"}}, None, "node-b"),
        ({}, None, "node-b"),  # node-a's taint is not tolerated
        (
            {
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu"}],
                "nodeSelector": {"kubernetes.io/hostname": "node-a"},
            },
            None,
            "node-a",
        ),
        ({"tolerations": [{"operator": "Exists"}]}, {"cpu": "8"}, "node-b"),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchFields": [
                                        {
                                            "key": "metadata.name",
                                            "operator": "NotIn",
                                            "values": ["node-b"],
                                        }
                                    ]
                                }
                            ]
                        }
                    }
                },
                "tolerations": [{"operator": "Exists"}],
            },
            None,
            "node-a",
        ),
    ],
    ids=["node-selector", "taint", "toleration", "cpu", "node-affinity"],
)
def test_node_choice(
    make_cluster: Callable[..., LocalCluster],
    spec: dict[str, Any],
    requests: dict[str, str] | None,
    expected: str,
) -> None:
    cluster = make_cluster(TWO_NODES)
    assert cluster.api is not None
    cluster.api.create(PODS, pod("p", requests=requests, **spec))
    cluster.wait_for(lambda: _pod(cluster, "p")["spec"].get("nodeName"))
    assert _pod(cluster, "p")["spec"]["nodeName"] == expected


@pytest.mark.parametrize(
    ("requests", "limits", "message"),
    [
        (
            {"cpu": "100"},
            None,
            "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) had "
            "untolerated taint {dedicated: gpu}.",
        ),
        (
            None,
            {"nvidia.com/mig-1g.5gb": "1"},
            "0/2 nodes are available: 1 Insufficient "
            "nvidia.com/mig-1g.5gb, 1 node(s) had untolerated "
            "taint {dedicated: gpu}.",
        ),
    ],
    ids=["cpu", "extended-resource-not-advertised"],
)
def test_unschedulable_pod_gets_kubes_condition(
    make_cluster: Callable[..., LocalCluster],
    requests: dict[str, str] | None,
    limits: dict[str, str] | None,
    message: str,
) -> None:
    cluster = make_cluster(TWO_NODES)
    assert cluster.api is not None
    cluster.api.create(PODS, pod("big", requests=requests, limits=limits))
    condition = cluster.wait_for(lambda: _scheduled_condition(cluster, "big"))
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "False",
        "Unschedulable",
        message,
    )


def test_cpu_used_by_bound_pods_counts(make_cluster: Callable[..., LocalCluster]) -> None:
    cluster = make_cluster((NodeSpec("solo", cpu="4"),))
    assert cluster.api is not None
    cluster.api.create(PODS, pod("first", requests={"cpu": "3"}))
    cluster.wait_for(lambda: _pod(cluster, "first")["spec"].get("nodeName"))
    cluster.api.create(PODS, pod("second", requests={"cpu": "2"}))
    condition = cluster.wait_for(lambda: _scheduled_condition(cluster, "second"))
    assert condition["message"] == "0/1 nodes are available: 1 Insufficient cpu."
    cluster.api.delete(PODS, name="first", namespace=NS)
    cluster.wait_for(lambda: _pod(cluster, "second")["spec"].get("nodeName"))


def test_gated_pod_waits_for_its_gates(make_cluster: Callable[..., LocalCluster]) -> None:
    cluster = make_cluster()
    api = cluster.api
    assert api is not None
    api.create(PODS, pod("gated", gates=["example.com/kueue", "instaslice.dev/placement"]))
    cluster.wait_for(lambda: _pod(cluster, "gated")["metadata"].get("uid"))
    remove_scheduling_gate(api, pod=_pod(cluster, "gated"), gate="instaslice.dev/placement")
    api.create(PODS, pod("marker"))
    cluster.wait_for(lambda: _pod(cluster, "marker")["spec"].get("nodeName"))
    assert not _pod(cluster, "gated")["spec"].get("nodeName")
    remove_scheduling_gate(api, pod=_pod(cluster, "gated"), gate="example.com/kueue")
    cluster.wait_for(lambda: _pod(cluster, "gated")["spec"].get("nodeName"))


def test_allocation_without_timestamp_is_never_bound(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """docs/design.md F2: the scheduler's own timestamp write is refused as an allocation change."""
    cluster = make_cluster()
    api = cluster.api
    assert api is not None
    api.create(RESOURCE_CLAIMS, claim("gpu", finalizer=True))
    api.create(PODS, pod("p", claims=[{"name": "gpu", "resourceClaimName": "gpu"}]))
    _allocate(cluster, "gpu", "node-a", timestamp=False)
    condition = cluster.wait_for(
        lambda: (c := _scheduled_condition(cluster, "p")) and c["reason"] == "SchedulerError" and c
    )
    assert "immutable" in condition["message"]
    assert not _pod(cluster, "p")["spec"].get("nodeName")
    assert not api.get(RESOURCE_CLAIMS, name="gpu", namespace=NS)["status"].get("reservedFor")
