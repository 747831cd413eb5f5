"""The kubelet's calls to the shim over real unix sockets: registration, admission, multi-slice pods."""

from __future__ import annotations

import json

import pytest

from api.checkpoint import PodRef
from api.names import CDI_KIND, SHADOW_CLAIM_CONTAINER_ANNOTATION, SHADOW_CLAIM_LABEL
from driver.cdi import VISIBLE_DEVICES_ENV
from driver.cluster.port import JsonObject
from kubeletplugin.deviceplugin.advertise import advertised_counts
from kubeletplugin.deviceplugin.resources import resource_specs
from tests.shim.fake_kubelet import AdmissionError
from tests.shim.harness import R_1G, R_3G, ShimNode


def cdi_id(claim: JsonObject, device: str) -> str:
    return f"{CDI_KIND}={claim['metadata']['uid']}-{device}"


def test_every_profile_is_registered_with_its_advertised_devices(node: ShimNode) -> None:
    shim = node.start()
    assert node.plugin is not None
    counts = advertised_counts(node.plugin.publisher.inventory)
    specs = resource_specs(counts)
    assert {s.resource_name for s in shim.resources} == {s.resource_name for s in specs}
    expected = {
        "nvidia.com/mig-1g.5gb": 14,
        "nvidia.com/mig-1g.5gb-me": 2,
        "nvidia.com/mig-1g.10gb": 8,
        "nvidia.com/mig-2g.10gb": 6,
        "nvidia.com/mig-3g.20gb": 4,
        "nvidia.com/mig-4g.20gb": 2,
        "nvidia.com/mig-7g.40gb": 2,
    }
    for resource, count in expected.items():
        devices = node.kubelet.wait_devices(resource, count)
        assert devices[0].endswith("-0")
    assert sorted(node.kubelet.plugins) == sorted(expected)
    plugin = node.kubelet.plugins[R_1G]
    assert plugin.endpoint == "instaslice-1g-5gb.sock"
    assert plugin.options.pre_start_required
    assert plugin.options.get_preferred_allocation_available
    assert all(shim.registered().values())


def test_one_pod_gets_the_slice_its_shadow_claim_reserves(node: ShimNode) -> None:
    shim = node.start()
    reserved = node.reserve([("main", "1g.5gb", [["gpu-1-1g-5gb-3"]])])
    admitted = node.kubelet.admit(reserved.pod)

    claim = node.claim(reserved, reserved.claims[0])
    answer = admitted.answers[("main", R_1G)]
    assert [d.name for d in answer.cdi_devices] == [cdi_id(claim, "gpu-1-1g-5gb-3")]
    assert node.instances() == [(1, "1g.5gb", 3)]
    entry = node.checkpoint().claims[claim["metadata"]["uid"]]
    assert answer.envs == {VISIBLE_DEVICES_ENV: entry.devices[0].mig_uuid}
    assert entry.shim is not None
    assert entry.shim.resource_name == R_1G
    assert entry.shim.device_plugin_ids == admitted.ids[("main", R_1G)]
    # Made for this pod (the shadow claim's reservedFor); who holds it is not known yet.
    assert entry.pods == (PodRef(name=reserved.pod.name, uid=reserved.pod.uid),)
    assert entry.shim.pod_uid is None

    # The CDI spec leaves NVIDIA_VISIBLE_DEVICES to the answer's envs (CDI edits would override it).
    spec = json.loads(node.node.cdi_files()[0].read_text())
    env = spec["devices"][0]["containerEdits"]["env"]
    assert not any(e.startswith(VISIBLE_DEVICES_ENV + "=") for e in env)

    shim.reconcile_now()
    entry = node.checkpoint().claims[claim["metadata"]["uid"]]
    assert entry.shim is not None
    assert (entry.shim.pod_uid, entry.shim.container_name) == (reserved.pod.uid, "main")
    assert (entry.shim.pod_namespace, entry.shim.pod_name) == (
        reserved.pod.namespace,
        reserved.pod.name,
    )
    assert node.claim(reserved, reserved.claims[0])["metadata"]["labels"][SHADOW_CLAIM_LABEL] == (
        reserved.pod.uid
    )


@pytest.mark.parametrize(
    "groups",
    [
        [["gpu-0-1g-5gb-0"], ["gpu-0-1g-5gb-1"], ["gpu-0-1g-5gb-2"]],
        [["gpu-0-1g-5gb-0", "gpu-0-1g-5gb-1", "gpu-0-1g-5gb-2"]],
    ],
    ids=["three-claims", "one-claim-count-3"],
)
def test_three_slices_in_one_container_and_another_profile_in_a_second(
    node: ShimNode, groups: list[list[str]]
) -> None:
    shim = node.start()
    reserved = node.reserve(
        [("train", "1g.5gb", groups), ("sidecar", "3g.20gb", [["gpu-1-3g-20gb-4"]])]
    )
    admitted = node.kubelet.admit(reserved.pod)

    assert node.instances() == [
        (0, "1g.5gb", 0),
        (0, "1g.5gb", 1),
        (0, "1g.5gb", 2),
        (1, "3g.20gb", 4),
    ]
    train = admitted.answers[("train", R_1G)]
    sidecar = admitted.answers[("sidecar", R_3G)]
    assert len(train.cdi_devices) == 3
    assert len(sidecar.cdi_devices) == 1
    # Every slice of the container is visible to it, in one variable (docs/design.md F9).
    checkpoint = node.checkpoint()
    uuids = {
        d.device: d.mig_uuid or "" for entry in checkpoint.claims.values() for d in entry.devices
    }
    assert sorted(train.envs[VISIBLE_DEVICES_ENV].split(",")) == sorted(
        uuids[f"gpu-0-1g-5gb-{i}"] for i in range(3)
    )
    assert sidecar.envs[VISIBLE_DEVICES_ENV] == uuids["gpu-1-3g-20gb-4"]
    assert len(set(train.envs[VISIBLE_DEVICES_ENV].split(","))) == 3

    shim.reconcile_now()
    for name in reserved.claims:
        claim = node.claim(reserved, name)
        entry = checkpoint.claims[claim["metadata"]["uid"]]
        container = claim["metadata"]["annotations"][SHADOW_CLAIM_CONTAINER_ANNOTATION]
        assert entry.shim is not None
        resource = R_1G if container == "train" else R_3G
        assert set(entry.shim.device_plugin_ids) <= set(admitted.ids[(container, resource)])
    assert node.cdi_files() == len(reserved.claims)


def test_allocate_without_a_reservation_is_refused_with_a_clear_message(node: ShimNode) -> None:
    node.start()
    pod = node.classic_pod([("main", {R_1G: 1})])  # bypassed the webhook: no shadow claim
    with pytest.raises(AdmissionError) as refused:
        node.kubelet.admit(pod)
    message = str(refused.value)
    assert f"no reservation for 1 x {R_1G} on node {node.node.node}" in message
    assert "shadow claim" in message
    assert node.instances() == []
    assert node.cdi_files() == 0
    assert node.checkpoint().claims == {}


def test_a_reservation_of_another_size_is_not_split_or_merged(node: ShimNode) -> None:
    node.start()
    node.reserve([("main", "1g.5gb", [["gpu-0-1g-5gb-0"], ["gpu-0-1g-5gb-1"]])])
    pod = node.classic_pod([("main", {R_1G: 1})])
    with pytest.raises(AdmissionError, match="no reservation for 1 x"):
        node.kubelet.admit(pod)
    assert node.instances() == []


def test_the_same_allocate_again_is_answered_from_the_checkpoint(node: ShimNode) -> None:
    shim = node.start()
    node.reserve([("main", "1g.5gb", [["gpu-0-1g-5gb-5"]])])
    spec = next(s for s in shim.resources if s.resource_name == R_1G)
    first = shim.allocator.allocate(spec, ["1g-5gb-4"])  # the answer never reached the kubelet
    again = shim.allocator.allocate(spec, ["1g-5gb-4"])
    assert again == first
    assert node.instances() == [(0, "1g.5gb", 5)]


def test_the_holder_asking_again_for_its_ids_gets_the_same_answer(node: ShimNode) -> None:
    shim = node.start()
    reserved = node.reserve([("main", "1g.5gb", [["gpu-0-1g-5gb-5"]])])
    admitted = node.kubelet.admit(reserved.pod)
    shim.reconcile_now()
    spec = next(s for s in shim.resources if s.resource_name == R_1G)
    again = shim.allocator.allocate(spec, admitted.ids[("main", R_1G)])
    assert list(again.cdi_devices) == [d.name for d in admitted.answers[("main", R_1G)].cdi_devices]
    assert node.instances() == [(0, "1g.5gb", 5)]
