"""The allocation loop end to end on the local API server: DRA claims are allocated (finalizer
first, timestamp in), pods ungated, capacity respected and waited for, constraints honoured."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from api.names import DELETE_PROTECTION_FINALIZER, DRIVER_NAME
from driver.cluster.kube import KubeClusterApi
from driver.cluster.port import PODS, RESOURCE_CLAIMS
from localcluster.apiserver import LocalApiServer
from tests.controller.harness import (
    NS,
    allocated_claims,
    assert_no_overlap,
    claim_object,
    client,
    condition_reason,
    create_device_classes,
    create_pod_with_claim,
    publish_node,
    release_claim,
    request,
    start_controller,
    ungated,
    wait_for,
)


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


@pytest.fixture
def api(apiserver: LocalApiServer, stack: ExitStack) -> KubeClusterApi:
    api = stack.enter_context(client(apiserver))
    create_device_classes(api)
    return api


def test_single_pod_gets_an_allocation_with_finalizer_and_timestamp_then_is_ungated(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=1)
    create_pod_with_claim(api, "p1")
    start_controller(apiserver, stack)

    wait_for(lambda: ungated(api, "p1"), what="p1 ungated")
    claim = api.get(RESOURCE_CLAIMS, name="p1-claim", namespace=NS)
    assert DELETE_PROTECTION_FINALIZER in claim["metadata"]["finalizers"]
    allocation = claim["status"]["allocation"]
    assert allocation["allocationTimestamp"].endswith("Z")
    (result,) = allocation["devices"]["results"]
    assert result == {
        "request": "mig",
        "driver": DRIVER_NAME,
        "pool": "node-a",
        "device": "gpu-0-1g-5gb-0",
    }
    assert allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"] == [
        {"key": "metadata.name", "operator": "In", "values": ["node-a"]}
    ]
    assert assert_no_overlap(api) == 1


def test_seven_1g_fill_an_a100_the_eighth_waits_and_is_placed_when_one_goes(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=1)
    for i in range(8):
        create_pod_with_claim(api, f"p{i}")
    start_controller(apiserver, stack)

    wait_for(lambda: len(allocated_claims(api)) == 7, what="7 allocations")
    waiting = wait_for(
        lambda: [f"p{i}" for i in range(8) if condition_reason(api, f"p{i}") == "NoCapacity"],
        what="the 8th pod reported NoCapacity",
    )
    assert len(waiting) == 1
    assert sum(ungated(api, f"p{i}") for i in range(8)) == 7
    assert_no_overlap(api)

    victim = next(f"p{i}" for i in range(8) if f"p{i}" not in waiting)
    api.delete(PODS, name=victim, namespace=NS)
    release_claim(api, f"{victim}-claim")
    wait_for(lambda: ungated(api, waiting[0]), what="the waiting pod placed")
    assert wait_for(lambda: condition_reason(api, waiting[0]) == "Placed")
    assert assert_no_overlap(api) == 7


def _results(api: KubeClusterApi, claim: str) -> list[dict[str, str]]:
    obj = api.get(RESOURCE_CLAIMS, name=claim, namespace=NS)
    return list(obj["status"]["allocation"]["devices"]["results"])


def test_mixed_profiles_share_gpus_without_overlap(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=3)
    # 18 of 24 memory slices, in an order the workers do not keep: fits whatever the order
    profiles = ["3g.20gb", "2g.10gb", "1g.5gb", "7g.40gb", "1g.10gb", "1g.5gb+me"]
    for i, profile in enumerate(profiles):
        create_pod_with_claim(
            api, f"p{i}", claim_object(f"p{i}-claim", requests=[request(profile=profile)])
        )
    start_controller(apiserver, stack)

    wait_for(lambda: all(ungated(api, f"p{i}") for i in range(len(profiles))), what="all placed")
    assert assert_no_overlap(api) == len(profiles)
    placed = {r["device"] for i in range(len(profiles)) for r in _results(api, f"p{i}-claim")}
    assert any(d.endswith("-7g-40gb-0") for d in placed)


def test_three_slices_of_one_claim_on_one_gpu_by_match_attribute(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=2)
    # GPU 0 is mostly taken: only 2 slices left there, so the three must all go to GPU 1
    create_pod_with_claim(
        api,
        "big",
        claim_object(
            "big-claim", requests=[request(profile="3g.20gb"), request("b", profile="2g.10gb")]
        ),
    )
    start_controller(apiserver, stack)
    wait_for(lambda: ungated(api, "big"), what="big placed")
    three = claim_object(
        "three-claim",
        requests=[request(profile="1g.5gb", count=3)],
        constraints=[{"matchAttribute": f"{DRIVER_NAME}/parentUUID"}],
    )
    create_pod_with_claim(api, "three", three)
    wait_for(lambda: ungated(api, "three"), what="three placed")
    devices = [r["device"] for r in _results(api, "three-claim")]
    assert len(devices) == 3
    assert {d.split("-")[1] for d in devices} == {"1"}, devices
    assert_no_overlap(api)
