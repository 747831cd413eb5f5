"""The allocation loop end to end on the local API server: DRA claims are allocated (finalizer
first, timestamp in), pods ungated, capacity respected and waited for, constraints honoured."""

from __future__ import annotations

from contextlib import ExitStack
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pytest

from api.names import DELETE_PROTECTION_FINALIZER, DRIVER_NAME, profile_device_class
from controller.allocation.results import node_selector
from controller.allocation.sync import SyncConfig
from driver.cluster import ops
from driver.cluster.kube import KubeClusterApi
from driver.cluster.port import DEVICE_CLASSES, PODS, RESOURCE_CLAIMS
from localcluster.apiserver import LocalApiServer
from tests.controller.harness import (
    NS,
    allocated_claims,
    assert_no_overlap,
    claim_object,
    cluster_api,
    condition_reason,
    create_pod_with_claim,
    pod_object,
    publish_node,
    release_claim,
    request,
    start_controller,
    ungated,
    wait_for,
)


@pytest.fixture
def api(apiserver: LocalApiServer, stack: ExitStack) -> KubeClusterApi:
    return cluster_api(apiserver, stack)


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


def test_first_available_takes_the_first_alternative_that_fits(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=1)
    create_pod_with_claim(
        api, "blocker", claim_object("blocker-claim", requests=[request(profile="1g.5gb")])
    )
    start_controller(apiserver, stack)
    wait_for(lambda: ungated(api, "blocker"))
    flexible = claim_object(
        "flex",
        requests=[
            {
                "name": "gpu",
                "firstAvailable": [
                    {"name": "big", "deviceClassName": profile_device_class("7g.40gb")},
                    {"name": "small", "deviceClassName": profile_device_class("2g.10gb")},
                ],
            }
        ],
    )
    create_pod_with_claim(api, "flex-pod", flexible)
    wait_for(lambda: ungated(api, "flex-pod"))
    (result,) = _results(api, "flex")
    assert result["request"] == "gpu/small"
    assert result["device"] == "gpu-0-2g-10gb-2"


def test_allocation_mode_all_takes_every_matching_device_of_one_node(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=2)
    gpu1 = f'device.attributes["{DRIVER_NAME}"].gpuIndex == 1'
    claim = claim_object(
        "all", requests=[request(profile="1g.5gb", selectors=[gpu1], all_devices=True)]
    )
    create_pod_with_claim(api, "all-pod", claim)
    start_controller(apiserver, stack)
    wait_for(lambda: ungated(api, "all-pod"))
    devices = sorted(r["device"] for r in _results(api, "all"))
    assert devices == [f"gpu-1-1g-5gb-{start}" for start in range(7)]


def test_selectors_narrow_devices_and_distinct_attribute_spreads_them(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=3)
    not_gpu0 = f'device.attributes["{DRIVER_NAME}"].gpuIndex != 0'
    claim = claim_object(
        "spread",
        requests=[request(profile="1g.5gb", count=2, selectors=[not_gpu0])],
        constraints=[{"distinctAttribute": f"{DRIVER_NAME}/parentUUID"}],
    )
    create_pod_with_claim(api, "spread-pod", claim)
    start_controller(apiserver, stack)
    wait_for(lambda: ungated(api, "spread-pod"))
    devices = sorted(r["device"] for r in _results(api, "spread"))
    assert devices == ["gpu-1-1g-5gb-0", "gpu-2-1g-5gb-0"]


def test_match_attribute_on_a_general_attribute(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=1, model="A100-40GB")
    publish_node(api, "node-b", gpus=1, model="H100-80GB")
    claim = claim_object(
        "same-model",
        requests=[
            request(
                "a",
                profile=None,
                device_class="mig.instaslice.dev",
                selectors=[f'device.attributes["{DRIVER_NAME}"].memorySlices == 1'],
                count=4,
            ),
            request("b", profile="1g.10gb"),
        ],
        constraints=[{"matchAttribute": f"{DRIVER_NAME}/productName"}],
    )
    create_pod_with_claim(api, "model-pod", claim)
    start_controller(apiserver, stack)
    wait_for(lambda: ungated(api, "model-pod"))
    results = _results(api, "same-model")
    assert {r["pool"] for r in results} == {"node-a"}  # 1g.10gb exists on both; 4 more 1-slice too
    assert len(results) == 5


def test_class_and_claim_configs_are_copied_with_their_source(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=1)
    parameters = {"apiVersion": "mig.instaslice.dev/v1alpha1", "kind": "MigDeviceConfig"}
    api.create(
        DEVICE_CLASSES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "configured.instaslice.dev"},
            "spec": {
                "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}],
                "config": [
                    {
                        "opaque": {
                            "driver": DRIVER_NAME,
                            "parameters": {**parameters, "env": {"A": "1"}},
                        }
                    }
                ],
            },
        },
    )
    claim = claim_object(
        "configured",
        requests=[request(profile=None, device_class="configured.instaslice.dev")],
        config=[
            {
                "requests": ["mig"],
                "opaque": {"driver": DRIVER_NAME, "parameters": {**parameters, "env": {"B": "2"}}},
            }
        ],
    )
    create_pod_with_claim(api, "configured-pod", claim)
    start_controller(apiserver, stack)
    wait_for(lambda: ungated(api, "configured-pod"))
    allocation = api.get(RESOURCE_CLAIMS, name="configured", namespace=NS)["status"]["allocation"]
    config = allocation["devices"]["config"]
    assert [(c["source"], c["requests"], c["opaque"]["parameters"]["env"]) for c in config] == [
        ("FromClass", ["mig"], {"A": "1"}),
        ("FromClaim", ["mig"], {"B": "2"}),
    ]


def test_a_shared_claim_is_allocated_once_and_pins_every_user(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=1)
    publish_node(api, "node-b", gpus=1)
    api.create(RESOURCE_CLAIMS, claim_object("shared"), namespace=NS)
    for name in ("user-1", "user-2"):
        api.create(PODS, pod_object(name, claims=["shared"]), namespace=NS)
    start_controller(apiserver, stack)
    wait_for(lambda: ungated(api, "user-1") and ungated(api, "user-2"))
    assert len(_results(api, "shared")) == 1
    assert assert_no_overlap(api) == 1


def test_a_claim_allocated_elsewhere_pins_the_pods_other_claims_to_its_node(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=1)
    publish_node(api, "node-b", gpus=1)
    claim = api.create(RESOURCE_CLAIMS, claim_object("given"), namespace=NS)
    claim = ops.add_claim_finalizer(api, claim=claim)
    ops.write_claim_allocation(
        api,
        claim=claim,
        allocation={
            "devices": {
                "results": [
                    {
                        "request": "mig",
                        "driver": DRIVER_NAME,
                        "pool": "node-b",
                        "device": "gpu-0-1g-5gb-0",
                    }
                ]
            },
            "nodeSelector": node_selector("node-b"),
        },
        allocated_at=datetime.now(UTC),
    )
    api.create(RESOURCE_CLAIMS, claim_object("fresh"), namespace=NS)
    api.create(PODS, pod_object("pinned", claims=["given", "fresh"]), namespace=NS)
    start_controller(apiserver, stack, sync=SyncConfig(adopt_grace=0.2))
    wait_for(lambda: ungated(api, "pinned"))
    assert _results(api, "fresh") == [
        {"request": "mig", "driver": DRIVER_NAME, "pool": "node-b", "device": "gpu-0-1g-5gb-1"}
    ]


def test_the_node_filter_skips_nodes_the_scheduler_would_refuse(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    taint = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    publish_node(api, "node-a", gpus=1, taints=[taint])
    publish_node(api, "node-b", gpus=1, cpu="1")
    publish_node(api, "node-c", gpus=1, labels={"zone": "z1"})
    publish_node(api, "node-d", gpus=1)
    start_controller(apiserver, stack)
    # one at a time, so first fit (nodes in name order) says which nodes the filter let through
    cases: list[tuple[str, dict[str, Any], str | None, str]] = [
        (
            "tolerates",
            {"tolerations": [{"key": "dedicated", "operator": "Exists"}]},
            None,
            "node-a",
        ),
        ("plain", {}, None, "node-b"),  # node-a's taint is not tolerated
        ("big-cpu", {}, "2", "node-c"),  # node-b has 1 CPU
        ("zoned", {"nodeSelector": {"zone": "z1"}}, None, "node-c"),
        ("zoned-2", {"nodeSelector": {"zone": "z1"}}, None, "node-c"),
        ("cpu-1", {}, "600m", "node-b"),
        ("cpu-2", {}, "600m", "node-c"),  # counted: the first one's 600m is not bound yet
    ]
    for name, spec, cpu, node in cases:
        api.create(RESOURCE_CLAIMS, claim_object(f"{name}-claim"), namespace=NS)
        api.create(PODS, pod_object(name, claims=[f"{name}-claim"], cpu=cpu, **spec), namespace=NS)
        wait_for(partial(ungated, api, name), what=name)
        assert _results(api, f"{name}-claim")[0]["pool"] == node, name


def test_a_pod_waiting_for_cpu_is_placed_when_the_pod_holding_it_goes(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=1, cpu="1")
    start_controller(apiserver, stack)
    for name in ("first", "second"):
        api.create(RESOURCE_CLAIMS, claim_object(f"{name}-claim"), namespace=NS)
        api.create(PODS, pod_object(name, claims=[f"{name}-claim"], cpu="1"), namespace=NS)
    wait_for(lambda: ungated(api, "first") or ungated(api, "second"))
    placed, waiting = ("first", "second") if ungated(api, "first") else ("second", "first")
    wait_for(lambda: condition_reason(api, waiting) == "NoCapacity", what="waits for CPU")
    api.delete(PODS, name=placed, namespace=NS)  # its slice stays allocated; its CPU is free
    wait_for(lambda: ungated(api, waiting), what="placed once the CPU is free")
    assert assert_no_overlap(api) == 2


def test_a_placed_pod_names_its_node_before_its_gate_goes(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    """docs/design.md F24: kube-scheduler finds ``status.nominatedNodeName`` already set when the
    pod becomes schedulable, so it neither writes it nor searches other nodes."""
    publish_node(api, "node-a", gpus=1)
    create_pod_with_claim(api, "p1")
    listed = api.list_objects(PODS, namespace=NS)
    start_controller(apiserver, stack)

    wait_for(lambda: ungated(api, "p1"), what="p1 ungated")
    seen: list[tuple[bool, str | None]] = []  # (gated, nominatedNodeName) of every version
    with api.watch(
        PODS, resource_version=listed.resource_version, namespace=NS, timeout_seconds=1
    ) as events:
        for event in events:
            pod = event.object
            seen.append(
                (
                    bool(pod["spec"].get("schedulingGates")),
                    pod.get("status", {}).get("nominatedNodeName"),
                )
            )
            if not seen[-1][0]:
                break
    assert seen[-1] == (False, "node-a"), seen
    assert (True, "node-a") in seen, seen  # written while the pod was still gated


def test_without_nomination_the_pod_is_placed_and_names_no_node(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    publish_node(api, "node-a", gpus=1)
    create_pod_with_claim(api, "p1")
    start_controller(apiserver, stack, sync=SyncConfig(nominate_node=False))

    wait_for(lambda: ungated(api, "p1"), what="p1 ungated")
    pod = api.get(PODS, name="p1", namespace=NS)
    assert not pod.get("status", {}).get("nominatedNodeName")
    assert len(allocated_claims(api)) == 1
