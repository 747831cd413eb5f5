"""Pods that cannot be placed say why (condition + event, one reason per kind of problem) and
disturb no other pod; foreign gates are respected; pods that need nothing of ours are ungated."""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from api.names import DRIVER_NAME, SCHEDULING_GATE
from controller.app import Controller
from driver.cluster.kube import KubeClusterApi
from driver.cluster.port import (
    DEVICE_CLASSES,
    EVENTS,
    PODS,
    RESOURCE_CLAIMS,
    JsonObject,
    gate_names,
)
from localcluster.apiserver import LocalApiServer
from tests.controller.harness import (
    KUEUE_GATE,
    NS,
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


@pytest.fixture
def api(apiserver: LocalApiServer, stack: ExitStack) -> KubeClusterApi:
    api = cluster_api(apiserver, stack)
    publish_node(api, "node-a", gpus=2)
    return api


@pytest.fixture
def controller(apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack) -> Controller:
    return start_controller(apiserver, stack)


BAD_REQUESTS = [
    # (a selector that does not compile is refused by the API server itself: tests/localcluster)
    pytest.param(
        claim_object(
            "bad", requests=[request(selectors=["device.attributes['other.dev'].x == 1"])]
        ),
        "InvalidSelector",
        "CEL runtime error",
        id="selector-runtime-error",
    ),
    pytest.param(
        claim_object("bad", requests=[request(profile="1g.5gb", count=15)]),
        "Unsatisfiable",
        "",
        id="more-slices-than-the-node-has",
    ),
    pytest.param(
        claim_object(
            "bad",
            requests=[request(profile="1g.5gb", count=8)],
            constraints=[{"matchAttribute": f"{DRIVER_NAME}/parentUUID"}],
        ),
        "Unsatisfiable",
        "",
        id="more-slices-than-one-gpu-holds",
    ),
    pytest.param(
        claim_object(
            "bad",
            requests=[request(selectors=[f'device.attributes["{DRIVER_NAME}"].gpuIndex == 9'])],
        ),
        "Unsatisfiable",
        "no published device matches",
        id="selector-matches-nothing",
    ),
    pytest.param(
        claim_object(
            "bad",
            requests=[request(profile="7g.40gb"), request("b", profile="1g.5gb", count=14)],
        ),
        "Unsatisfiable",
        "",
        id="together-more-than-the-node",
    ),
    pytest.param(
        claim_object(
            "bad",
            config=[
                {
                    "opaque": {
                        "driver": DRIVER_NAME,
                        "parameters": {
                            "apiVersion": "mig.instaslice.dev/v1alpha1",
                            "kind": "MigDeviceConfig",
                            "bogus": 1,
                        },
                    }
                }
            ],
        ),
        "InvalidRequest",
        "bogus",
        id="bad-opaque-config",
    ),
]


@pytest.mark.parametrize(("claim", "reason", "words"), BAD_REQUESTS)
def test_a_bad_request_gets_its_reason_and_does_not_disturb_others(
    api: KubeClusterApi, controller: Controller, claim: JsonObject, reason: str, words: str
) -> None:
    create_pod_with_claim(api, "bad-pod", claim)
    create_pod_with_claim(api, "good-pod")
    wait_for(lambda: ungated(api, "good-pod"), what="the good pod placed")
    wait_for(lambda: condition_reason(api, "bad-pod") == reason, what=f"reason {reason}")
    condition = placement_condition(get_pod(api, "bad-pod"))
    assert condition is not None
    assert condition["status"] == "False"
    assert words in condition["message"]
    assert not ungated(api, "bad-pod")
    events = api.list_objects(EVENTS, namespace=NS).items
    assert any(
        e["involvedObject"]["name"] == "bad-pod"
        and e["reason"] == reason
        and e["type"] == "Warning"
        for e in events
    )
    assert assert_no_overlap(api) == 1


def test_unknown_classic_profile_is_reported(api: KubeClusterApi, controller: Controller) -> None:
    api.create(PODS, pod_object("odd", classic={"nvidia.com/mig-9g.99gb": 1}), namespace=NS)
    wait_for(lambda: condition_reason(api, "odd") == "UnknownProfile", what="UnknownProfile")
    assert "nvidia.com/mig-9g.99gb" in str(placement_condition(get_pod(api, "odd")))


def test_a_missing_device_class_waits_and_is_placed_once_it_exists(
    api: KubeClusterApi, controller: Controller
) -> None:
    claim = claim_object("late", requests=[request(device_class="late-class.instaslice.dev")])
    create_pod_with_claim(api, "late-pod", claim)
    wait_for(lambda: condition_reason(api, "late-pod") == "DeviceClassNotFound")
    api.create(
        DEVICE_CLASSES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "late-class.instaslice.dev"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}]},
        },
    )
    wait_for(lambda: ungated(api, "late-pod"), what="placed after the class appeared")
    # the condition is written after the gate is lifted (its own status write)
    wait_for(lambda: condition_reason(api, "late-pod") == "Placed", what="condition Placed")


def test_a_kueue_gated_pod_is_left_alone_until_kueue_lifts_its_gate(
    api: KubeClusterApi, controller: Controller
) -> None:
    api.create(RESOURCE_CLAIMS, claim_object("queued-claim"), namespace=NS)
    api.create(
        PODS,
        pod_object("queued", claims=["queued-claim"], gates=[KUEUE_GATE, SCHEDULING_GATE]),
        namespace=NS,
    )
    create_pod_with_claim(api, "other")  # proves the controller is working meanwhile
    wait_for(lambda: ungated(api, "other"))
    claim = api.get(RESOURCE_CLAIMS, name="queued-claim", namespace=NS)
    assert not (claim.get("status") or {}).get("allocation")
    assert not claim["metadata"].get("finalizers")
    assert gate_names(get_pod(api, "queued")) == [KUEUE_GATE, SCHEDULING_GATE]

    pod = get_pod(api, "queued")
    pod["spec"]["schedulingGates"] = [{"name": SCHEDULING_GATE}]
    api.update(PODS, pod)  # Kueue admits the workload
    wait_for(lambda: ungated(api, "queued"), what="placed once admitted")
    assert assert_no_overlap(api) == 2


def test_pods_whose_claims_are_not_ours_are_ungated(
    api: KubeClusterApi, controller: Controller
) -> None:
    api.create(
        DEVICE_CLASSES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "gpu.example.com"},
            "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]},
        },
    )
    foreign = claim_object("foreign", requests=[request(device_class="gpu.example.com")])
    create_pod_with_claim(api, "foreign-pod", foreign)
    wait_for(lambda: ungated(api, "foreign-pod"), what="ungated without an allocation")
    claim = api.get(RESOURCE_CLAIMS, name="foreign", namespace=NS)
    assert not (claim.get("status") or {}).get("allocation")


def test_a_pod_waits_for_a_claim_that_does_not_exist_yet(
    api: KubeClusterApi, controller: Controller
) -> None:
    api.create(PODS, pod_object("early", claims=["early-claim"]), namespace=NS)
    create_pod_with_claim(api, "witness")
    wait_for(lambda: ungated(api, "witness"))
    assert not ungated(api, "early")
    assert placement_condition(get_pod(api, "early")) is None  # waiting is not a problem
    api.create(RESOURCE_CLAIMS, claim_object("early-claim"), namespace=NS)
    wait_for(lambda: ungated(api, "early"), what="placed once its claim exists")
