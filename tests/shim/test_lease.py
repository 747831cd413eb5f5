"""The shim's Lease: taken once every resource is registered with the kubelet, given back when the
shim stops, taken anew (new acquireTime) by the next start — what the controller places classic
pods by (``controller/allocation/nodefilter.py``)."""

from __future__ import annotations

from api.names import (
    SHIM_LEASE_LABEL,
    SHIM_LEASE_NODE_ANNOTATION,
    SYSTEM_NAMESPACE,
    shim_lease_name,
)
from controller.allocation.nodefilter import NodeFilter
from driver.cluster.port import LEASES, JsonObject
from driver.errors import ApiNotFoundError
from kubeletplugin.deviceplugin.lease import ShimLease
from tests.controller.harness import node_object, pod_object
from tests.shim.harness import ShimNode, wait_for


def _lease(node: ShimNode) -> JsonObject | None:
    try:
        return node.api.get(
            LEASES, name=shim_lease_name(node.node.node), namespace=SYSTEM_NAMESPACE
        )
    except ApiNotFoundError:
        return None


def _holder(node: ShimNode) -> str:
    lease = _lease(node) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def test_the_lease_is_held_while_the_shim_serves_and_given_back_when_it_stops(
    node: ShimNode,
) -> None:
    node.start()
    wait_for(lambda: bool(_holder(node)))
    lease = _lease(node)
    assert lease is not None
    meta = lease["metadata"]
    assert meta["annotations"][SHIM_LEASE_NODE_ANNOTATION] == node.node.node
    assert meta["labels"][SHIM_LEASE_LABEL] == node.node.node
    first_acquired = lease["spec"]["acquireTime"]

    node.crash()  # stop() runs: the lease is given back before the sockets go
    assert _holder(node) == ""

    node.start()
    wait_for(lambda: bool(_holder(node)))
    again = _lease(node)
    assert again is not None
    assert again["spec"]["acquireTime"] != first_acquired, "a new start is a new acquireTime"


def test_a_lease_write_that_fails_is_logged_and_the_shim_serves_anyway(node: ShimNode) -> None:
    lease = ShimLease(api=node.api, node_name="n", identity="me", namespace="-not a namespace-")
    assert lease.acquire() is False
    assert lease.held is False
    lease.release()  # nothing held: nothing written, no error


def _filter_with_node() -> NodeFilter:
    nodes = NodeFilter()
    node = node_object("node-a")
    node["status"]["allocatable"]["nvidia.com/mig-1g.5gb"] = "7"
    nodes.node_changed(node)
    return nodes


def _shim_lease(holder: str, acquired: str) -> JsonObject:
    return {
        "metadata": {
            "name": shim_lease_name("node-a"),
            "annotations": {SHIM_LEASE_NODE_ANNOTATION: "node-a"},
        },
        "spec": {"holderIdentity": holder, "acquireTime": acquired},
    }


def test_the_controller_sends_no_classic_pod_to_a_node_whose_shim_gave_its_lease_back() -> None:
    nodes = _filter_with_node()
    classic = pod_object("p", classic={"nvidia.com/mig-1g.5gb": 1})
    dra = pod_object("d", claims=["c"])
    assert nodes.why_not(classic, "node-a") is None, "no lease: judged by the rest alone"
    assert nodes.shim_lease_changed(_shim_lease("plugin_1", "t1")) is True
    assert nodes.why_not(classic, "node-a") is None
    assert nodes.shim_lease_changed(_shim_lease("", "t2")) is True
    reason = nodes.why_not(classic, "node-a")
    assert reason is not None
    assert "gave its lease back" in reason
    assert nodes.why_not(dra, "node-a") is None, "DRA pods do not use the shim"
    assert nodes.shim_lease_changed(_shim_lease("plugin_2", "t3")) is True
    assert nodes.why_not(classic, "node-a") is None


def test_a_new_start_of_the_shim_ends_a_rejection_pause() -> None:
    nodes = _filter_with_node()
    nodes.shim_lease_changed(_shim_lease("plugin_1", "t1"))
    rejected = pod_object("victim", classic={"nvidia.com/mig-1g.5gb": 1}, gates=())
    rejected["spec"]["nodeName"] = "node-a"
    rejected["status"] = {"phase": "Failed", "reason": "UnexpectedAdmissionError"}
    rejected["metadata"]["uid"] = "uid-victim"
    assert nodes.classic_admission(rejected) is not None
    classic = pod_object("p", classic={"nvidia.com/mig-1g.5gb": 1})
    assert nodes.why_not(classic, "node-a") is not None
    assert nodes.shim_lease_changed(_shim_lease("plugin_1", "t1")) is False, "nothing new"
    assert nodes.why_not(classic, "node-a") is not None
    nodes.shim_lease_changed(_shim_lease("plugin_2", "t9"))  # killed, restarted: taken anew
    assert nodes.why_not(classic, "node-a") is None
