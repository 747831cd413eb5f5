"""Hand-offs to kube-scheduler (controller/allocation/handoff.py): a DRA pod without capacity past
``handoff_after`` is ungated with its claims unallocated; a placed pod kube-scheduler cannot bind
has our unreserved allocations withdrawn; classic pods are never handed over in controller mode;
in scheduler mode every gated pod is handed over and a classic pod's shadow claims are dropped."""

from __future__ import annotations

import time
from contextlib import ExitStack
from datetime import UTC, datetime
from functools import partial

import pytest

from api.names import (
    DELETE_PROTECTION_FINALIZER,
    DRIVER_NAME,
    SCHEDULING_GATE,
    classic_resource_name,
)
from controller.allocation import handoff
from controller.allocation.results import node_selector
from controller.allocation.sync import SyncConfig
from controller.app import Controller
from controller.classic import shadow
from driver.cluster import ops
from driver.cluster.kube import KubeClusterApi
from driver.cluster.port import (
    EVENTS,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    JsonObject,
    gate_names,
)
from localcluster.apiserver import LocalApiServer
from tests.controller.harness import (
    NS,
    allocated_claims,
    assert_no_overlap,
    claim_object,
    cluster_api,
    condition_reason,
    create_pod_with_claim,
    get_pod,
    placement_condition,
    pod_object,
    publish_node,
    request,
    start_controller,
    ungated,
    wait_for,
)

FULL_GPU = "7g.40gb"
"""One 7g.40gb fills an A100-40GB: with one GPU, a second such pod has no capacity."""


@pytest.fixture
def api(apiserver: LocalApiServer, stack: ExitStack) -> KubeClusterApi:
    return cluster_api(apiserver, stack)


def _full_gpu_claim(name: str) -> JsonObject:
    return claim_object(name, requests=[request(profile=FULL_GPU)])


def _allocated(api: KubeClusterApi, claim: str) -> bool:
    obj = api.get(RESOURCE_CLAIMS, name=claim, namespace=NS)
    return bool((obj.get("status") or {}).get("allocation"))


def _handed_off(api: KubeClusterApi, pod: str) -> bool:
    return condition_reason(api, pod) == "HandedOff"


def _handoffs(controller: Controller, reason: str) -> float:
    text = controller.metrics.exposition().decode()
    for line in text.splitlines():
        if line.startswith(f'instaslice_controller_pods_handed_off_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_a_dra_pod_without_capacity_is_handed_to_kube_scheduler_after_the_timeout(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=1)
    create_pod_with_claim(api, "first", _full_gpu_claim("first-claim"))
    controller = start_controller(apiserver, stack, sync=SyncConfig(handoff_after=1.0))
    wait_for(lambda: ungated(api, "first"), what="the first pod placed")

    create_pod_with_claim(api, "second", _full_gpu_claim("second-claim"))
    wait_for(lambda: ungated(api, "second"), what="the second pod handed over")
    wait_for(lambda: condition_reason(api, "second") == "HandedOff", what="the condition")
    # The NoCapacity condition lasts only about handoff_after (polling may miss it under load);
    # the Warning event it left is the durable record that the pod waited gated first.
    wait_for(lambda: "NoCapacity" in _event_reasons(api, "second"), what="NoCapacity first")

    condition = placement_condition(get_pod(api, "second"))
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", "HandedOff")
    assert "no capacity" in condition["message"]
    assert "kube-scheduler" in condition["message"]
    assert not _allocated(api, "second-claim")  # kube-scheduler allocates it, not us
    assert _handoffs(controller, "no-capacity") == 1.0
    wait_for(lambda: "HandedOff" in _event_reasons(api, "second"), what="the HandedOff event")

    # Capacity comes back: the pod is kube-scheduler's now; we do not allocate its claim.
    api.delete(PODS, name="first", namespace=NS)
    first = api.get(RESOURCE_CLAIMS, name="first-claim", namespace=NS)
    ops.clear_claim_allocation(api, claim=first)
    create_pod_with_claim(api, "third", claim_object("third-claim"))
    wait_for(lambda: ungated(api, "third"), what="a new pod placed on the freed GPU")
    assert not _allocated(api, "second-claim")
    assert_no_overlap(api)


def test_a_classic_pod_without_capacity_stays_gated(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=1)
    create_pod_with_claim(api, "first", _full_gpu_claim("first-claim"))
    start_controller(apiserver, stack, sync=SyncConfig(handoff_after=0.3))
    wait_for(lambda: ungated(api, "first"), what="the first pod placed")

    api.create(
        PODS, pod_object("classic", classic={classic_resource_name(FULL_GPU): 1}), namespace=NS
    )
    wait_for(lambda: condition_reason(api, "classic") == "NoCapacity", what="NoCapacity")
    time.sleep(1.5)  # well past handoff_after (and the condition's whole-second timestamp)
    assert not ungated(api, "classic")
    assert condition_reason(api, "classic") == "NoCapacity"


def _mark_unschedulable(api: KubeClusterApi, name: str) -> None:
    """What kube-scheduler writes when it cannot bind a pod."""
    ops.set_pod_condition(
        api,
        pod=get_pod(api, name),
        condition_type="PodScheduled",
        status="False",
        reason="Unschedulable",
        message="0/1 nodes are available: 1 node(s) had untolerated taint {gpu: broken}.",
        now=datetime.now(UTC),
    )


def test_a_placed_pod_kube_scheduler_cannot_bind_has_its_allocation_withdrawn(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=1)
    create_pod_with_claim(api, "stuck")
    controller = start_controller(apiserver, stack, sync=SyncConfig(handoff_after=0.5))
    wait_for(lambda: ungated(api, "stuck"), what="placed")
    assert _allocated(api, "stuck-claim")

    _mark_unschedulable(api, "stuck")
    wait_for(lambda: not _allocated(api, "stuck-claim"), what="the allocation withdrawn")
    wait_for(lambda: condition_reason(api, "stuck") == "HandedOff", what="the condition")
    condition = placement_condition(get_pod(api, "stuck"))
    assert condition is not None
    assert "not bound" in condition["message"]
    assert "node-a" in condition["message"]
    assert _handoffs(controller, "not-bound") == 1.0
    assert allocated_claims(api) == []


def test_a_claim_another_consumer_reserves_is_kept(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    """Another pod shares the claim: withdrawing it could strand that consumer; it stays. (A claim
    reserved for the unbound pod alone is withdrawn: the controller reserves its claims for their
    pod in the allocation write, so that is the normal state of a placed claim.)"""
    publish_node(api, "node-a", gpus=1)
    create_pod_with_claim(api, "held")
    controller = start_controller(apiserver, stack, sync=SyncConfig(handoff_after=0.3))
    wait_for(lambda: ungated(api, "held"), what="placed")
    claim = api.get(RESOURCE_CLAIMS, name="held-claim", namespace=NS)
    claim["status"]["reservedFor"] = [
        ops.pod_reference(get_pod(api, "held")),
        {"resource": "pods", "name": "sharer", "uid": "uid-sharer"},
    ]
    api.update_status(RESOURCE_CLAIMS, claim)

    _mark_unschedulable(api, "held")
    time.sleep(1.5)  # past handoff_after
    assert _allocated(api, "held-claim")
    assert _handoffs(controller, "not-bound") == 0.0


def test_scheduler_mode_hands_every_gated_pod_over_and_drops_shadow_claims(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=1)
    create_pod_with_claim(api, "dra")
    profile_resource = classic_resource_name("1g.5gb")
    pod = api.create(PODS, pod_object("classic", classic={profile_resource: 1}), namespace=NS)
    # A shadow claim left from controller mode (created, protected, allocated) before the switch.
    body = shadow.shadow_claim(
        pod, shadow.ClassicRequest(container="main", profile="1g.5gb", count=1)
    )
    body["metadata"]["finalizers"] = [DELETE_PROTECTION_FINALIZER]
    left = api.create(RESOURCE_CLAIMS, body, namespace=NS)
    device = next(
        d["name"]
        for s in api.list_objects(RESOURCE_SLICES).items
        for d in s["spec"].get("devices") or []
        if d["name"].startswith("gpu-0-1g-5gb-")
    )
    ops.write_claim_allocation(
        api,
        claim=left,
        allocation={
            "devices": {
                "results": [
                    {"request": "mig", "driver": DRIVER_NAME, "pool": "node-a", "device": device}
                ]
            },
            "nodeSelector": node_selector("node-a"),
        },
        allocated_at=datetime.now(UTC),
        reserved_for=[ops.pod_reference(pod)],
    )
    assert len(allocated_claims(api)) == 1

    controller = start_controller(apiserver, stack, sync=SyncConfig(scheduler_mode=True))
    for name in ("dra", "classic"):
        wait_for(partial(ungated, api, name), what=f"{name} handed over")
        wait_for(partial(_handed_off, api, name), what="condition")
    assert allocated_claims(api) == []

    # The shadow claim holds nothing any more (kube-scheduler makes its own claim for the pod).
    kept = api.get(RESOURCE_CLAIMS, name=left["metadata"]["name"], namespace=NS)
    assert not (kept.get("status") or {}).get("allocation")
    assert not (kept.get("status") or {}).get("reservedFor")
    assert _handoffs(controller, "scheduler-mode") == 2.0
    # No nodeSelector was added: kube-scheduler chooses the node.
    assert "nodeSelector" not in get_pod(api, "classic")["spec"]
    assert SCHEDULING_GATE not in gate_names(get_pod(api, "classic"))


_SINCE = "2026-05-09T07:35:25Z"
_UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "lastTransitionTime": _SINCE,
}


def _unbound_pod(**changes: object) -> JsonObject:
    pod: JsonObject = {
        "metadata": {"name": "p"},
        "spec": {"resourceClaims": [{"name": "c", "resourceClaimName": "x"}], "containers": []},
        "status": {"phase": "Pending", "conditions": [_UNSCHEDULABLE]},
    }
    for path, value in changes.items():
        section, _, field = path.partition("__")
        pod[section][field] = value
    return pod


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (_unbound_pod(), datetime(2026, 5, 9, 7, 35, 25, tzinfo=UTC)),
        (_unbound_pod(spec__schedulingGates=[{"name": SCHEDULING_GATE}]), None),
        (_unbound_pod(spec__nodeName="node-a"), None),
        (_unbound_pod(spec__resourceClaims=[]), None),
        (_unbound_pod(status__phase="Failed"), None),
        (_unbound_pod(metadata__deletionTimestamp=_SINCE), None),
        (_unbound_pod(status__conditions=[{**_UNSCHEDULABLE, "status": "True"}]), None),
        (_unbound_pod(status__conditions=[{**_UNSCHEDULABLE, "reason": "SchedulingGated"}]), None),
    ],
    ids=[
        "unschedulable",
        "gated",
        "bound",
        "no-claims",
        "finished",
        "deleting",
        "scheduled",
        "not-looked-at-yet",
    ],
)
def test_unbound_since_is_set_only_for_live_ungated_unbound_claim_pods(
    pod: JsonObject, expected: datetime | None
) -> None:
    assert handoff.unbound_since(pod) == expected


def _event_reasons(api: KubeClusterApi, pod: str) -> set[str]:
    events = api.list_objects(EVENTS, namespace=NS, field_selector=f"involvedObject.name={pod}")
    return {str(e.get("reason")) for e in events.items}
