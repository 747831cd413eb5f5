"""Domain writes (gates, node selector, conditions, claim finalizer/allocation, events) over HTTP."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest

from api import wire
from api.names import DELETE_PROTECTION_FINALIZER, PLACEMENT_CONDITION, SCHEDULING_GATE
from driver.cluster import ops
from driver.cluster.events import NORMAL, WARNING, EventRecorder
from driver.cluster.kube import KubeClusterApi
from driver.cluster.port import (
    EVENTS,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    PatchType,
    gate_names,
    resource_version_of,
)
from driver.errors import ConflictError, InvalidError
from tests.cluster import objects
from tests.cluster.fakes import FakeClock

OTHER_GATE = "example.com/other"
NOW = datetime(2026, 5, 9, 7, 0, 0, tzinfo=UTC)


def _remove_gate_behind_our_back(api: KubeClusterApi, name: str, gate: str) -> None:
    current = api.get(PODS, name=name, namespace=objects.NAMESPACE)
    gates = current["spec"]["schedulingGates"]
    api.patch(
        PODS,
        name=name,
        namespace=objects.NAMESPACE,
        patch=[
            {"op": "test", "path": "/spec/schedulingGates", "value": gates},
            {
                "op": "replace",
                "path": "/spec/schedulingGates",
                "value": [g for g in gates if g["name"] != gate],
            },
        ],
        patch_type=PatchType.JSON,
    )


def test_removing_our_gate_keeps_the_others(api: KubeClusterApi) -> None:
    pod = api.create(PODS, objects.pod("p", gates=[OTHER_GATE, SCHEDULING_GATE, "third/gate"]))
    written = ops.remove_scheduling_gate(api, pod=pod)
    assert gate_names(written) == [OTHER_GATE, "third/gate"]
    again = ops.remove_scheduling_gate(api, pod=written)  # idempotent, no write
    assert resource_version_of(again) == resource_version_of(written)


def test_gate_removal_from_a_stale_pod_never_drops_or_revives_other_gates(
    api: KubeClusterApi,
) -> None:
    stale = api.create(PODS, objects.pod("p", gates=[SCHEDULING_GATE, OTHER_GATE, "third/gate"]))
    _remove_gate_behind_our_back(api, "p", "third/gate")
    written = ops.remove_scheduling_gate(api, pod=stale)
    assert gate_names(written) == [OTHER_GATE]
    assert gate_names(api.get(PODS, name="p", namespace=objects.NAMESPACE)) == [OTHER_GATE]


def test_gate_removal_of_the_last_gate_leaves_an_ungated_pod(api: KubeClusterApi) -> None:
    pod = api.create(PODS, objects.pod("p"))
    assert gate_names(ops.remove_scheduling_gate(api, pod=pod)) == []


def test_node_selector_only_while_gated(api: KubeClusterApi) -> None:
    sent = objects.pod("p")
    sent["spec"]["nodeSelector"] = {"keep": "me"}
    pod = api.create(PODS, sent)
    selected = ops.set_pod_node_selector(
        api, pod=pod, node_selector={"kubernetes.io/hostname": "n1"}
    )
    assert selected["spec"]["nodeSelector"] == {"keep": "me", "kubernetes.io/hostname": "n1"}
    ungated = ops.remove_scheduling_gate(api, pod=selected)
    with pytest.raises(InvalidError):
        ops.set_pod_node_selector(api, pod=ungated, node_selector={"x": "y"})
    with pytest.raises(InvalidError):  # a stale, still-gated view: the server's test refuses it
        ops.set_pod_node_selector(api, pod=selected, node_selector={"x": "y"})


def test_nominating_a_node_writes_status_once_and_never_a_replaced_pod(
    api: KubeClusterApi,
) -> None:
    pod = api.create(PODS, objects.pod("p"))
    nominated = ops.nominate_node(api, pod=pod, node="n1")
    assert nominated["status"]["nominatedNodeName"] == "n1"
    assert gate_names(nominated) == [SCHEDULING_GATE]  # spec untouched: a status write
    again = ops.nominate_node(api, pod=nominated, node="n1")  # already named: no write
    assert resource_version_of(again) == resource_version_of(nominated)
    api.delete(PODS, name="p", namespace=objects.NAMESPACE)
    api.create(PODS, objects.pod("p"))  # same name, another pod
    with pytest.raises(InvalidError):  # the UID ``test`` refuses the stale view
        ops.nominate_node(api, pod=pod, node="n2")
    replaced = api.get(PODS, name="p", namespace=objects.NAMESPACE)
    assert not replaced.get("status", {}).get("nominatedNodeName")


def test_pod_condition_is_set_kept_and_not_rewritten(api: KubeClusterApi) -> None:
    pod = api.create(PODS, objects.pod("p"))
    with_other = copy.deepcopy(pod)
    with_other["status"] = {
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]
    }
    pod = api.update_status(PODS, with_other)
    first = ops.set_pod_condition(
        api,
        pod=pod,
        condition_type=PLACEMENT_CONDITION,
        status="False",
        reason="NoFit",
        message="no GPU has a free 7g.40gb placement",
        now=NOW,
    )
    conditions = {c["type"]: c for c in first["status"]["conditions"]}
    assert set(conditions) == {"PodScheduled", PLACEMENT_CONDITION}
    assert conditions[PLACEMENT_CONDITION]["lastTransitionTime"] == "2026-05-09T07:00:00Z"
    same = ops.set_pod_condition(
        api,
        pod=first,
        condition_type=PLACEMENT_CONDITION,
        status="False",
        reason="NoFit",
        message="no GPU has a free 7g.40gb placement",
        now=NOW + timedelta(minutes=5),
    )
    assert resource_version_of(same) == resource_version_of(first)
    # from a stale pod: a conflict is re-read and retried; same status keeps the transition time
    changed = ops.set_pod_condition(
        api,
        pod=pod,
        condition_type=PLACEMENT_CONDITION,
        status="False",
        reason="NoFit",
        message="still no room",
        now=NOW + timedelta(minutes=10),
    )
    placement = next(c for c in changed["status"]["conditions"] if c["type"] == PLACEMENT_CONDITION)
    assert placement["message"] == "still no room"
    assert placement["lastTransitionTime"] == "2026-05-09T07:00:00Z"


def _allocation(node: str) -> wire.AllocationResult:
    return {
        "devices": {
            "results": [
                {
                    "request": "mig",
                    "driver": "mig.instaslice.dev",
                    "pool": node,
                    "device": "gpu-0-1g-5gb-0",
                }
            ]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }


def test_claim_finalizer_then_allocation_then_release(api: KubeClusterApi) -> None:
    claim = api.create(RESOURCE_CLAIMS, objects.claim("c"))
    with pytest.raises(ValueError, match="finalizer"):
        ops.write_claim_allocation(api, claim=claim, allocation=_allocation("n1"), allocated_at=NOW)
    protected = ops.add_claim_finalizer(api, claim=claim)
    assert protected["metadata"]["finalizers"] == [DELETE_PROTECTION_FINALIZER]
    assert ops.add_claim_finalizer(api, claim=protected) is protected  # no second write
    with pytest.raises(ConflictError):
        ops.add_claim_finalizer(api, claim=claim)  # would be a stale no-op anyway: stale RV

    pod = api.create(PODS, objects.pod("p"))
    allocated = ops.write_claim_allocation(
        api,
        claim=protected,
        allocation=_allocation("n1"),
        allocated_at=NOW,
        reserved_for=[ops.pod_reference(pod)],
    )
    allocation = allocated["status"]["allocation"]
    assert allocation["allocationTimestamp"] == "2026-05-09T07:00:00Z"
    assert allocation["devices"]["results"][0]["device"] == "gpu-0-1g-5gb-0"
    assert allocated["status"]["reservedFor"][0]["uid"] == pod["metadata"]["uid"]
    with pytest.raises(ConflictError):  # stale resourceVersion: the allocation was written
        ops.write_claim_allocation(
            api, claim=protected, allocation=_allocation("n2"), allocated_at=NOW
        )

    released = ops.clear_claim_allocation(api, claim=allocated)
    assert "allocation" not in released.get("status", {})
    assert not released.get("status", {}).get("reservedFor")
    with pytest.raises(ConflictError):
        ops.clear_claim_allocation(api, claim=allocated)


def test_shadow_claim_owned_by_its_pod(api: KubeClusterApi) -> None:
    pod = api.create(PODS, objects.pod("classic"))
    shadow = objects.claim("classic-mig-0")
    shadow["metadata"]["ownerReferences"] = [ops.owner_reference(PODS, pod)]
    created = api.create(RESOURCE_CLAIMS, shadow)
    owner = created["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "Pod",
        "classic",
        pod["metadata"]["uid"],
        True,
    )


def test_repeated_events_are_counted_on_one_event(api: KubeClusterApi) -> None:
    clock = FakeClock()
    recorder = EventRecorder(api=api, component="instaslice-controller", host="ctl-0", clock=clock)
    pod = api.create(PODS, objects.pod("p"))
    for _ in range(3):
        recorder.record(pod, event_type=WARNING, reason="NoFit", message="no room")
        clock.advance(1)
    recorder.record(pod, event_type=NORMAL, reason="Placed", message="on n1")
    node = api.create(NODES, objects.node("n1"))
    recorder.record(node, event_type=NORMAL, reason="Inventory", message="8 GPUs")

    events = api.list_objects(EVENTS, namespace=objects.NAMESPACE).items
    by_reason = {e["reason"]: e for e in events}
    assert set(by_reason) == {"NoFit", "Placed", "Inventory"}
    no_fit = by_reason["NoFit"]
    assert no_fit["count"] == 3
    assert no_fit["type"] == WARNING
    assert no_fit["involvedObject"]["uid"] == pod["metadata"]["uid"]
    assert no_fit["firstTimestamp"] != no_fit["lastTimestamp"]
    assert by_reason["Inventory"]["involvedObject"]["kind"] == "Node"
    assert "namespace" not in by_reason["Inventory"]["involvedObject"]
    # an expired event (deleted by its TTL) is posted afresh
    api.delete(EVENTS, name=no_fit["metadata"]["name"], namespace=objects.NAMESPACE)
    recorder.record(pod, event_type=WARNING, reason="NoFit", message="no room")
    again = [
        e
        for e in api.list_objects(EVENTS, namespace=objects.NAMESPACE).items
        if e["reason"] == "NoFit"
    ]
    assert [e["count"] for e in again] == [1]
