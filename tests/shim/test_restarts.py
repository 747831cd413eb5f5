"""Kubelet restarts and plugin crashes: re-registration, and nothing leaked or freed twice."""

from __future__ import annotations

import pytest

from api.names import SHADOW_CLAIM_LABEL
from driver.gpu.emulated import EmulatedGpuBackend
from kubeletplugin.node.inventory import NodeInventory, build_inventory
from tests.kubeletplugin.harness import Crash, crash_at
from tests.shim.harness import R_1G, R_3G, ShimNode, wait_for


def test_a_restarted_kubelet_gets_every_resource_registered_again(node: ShimNode) -> None:
    shim = node.start()
    before = len(node.kubelet.registrations)
    served = {s.resource_name for s in shim.resources}

    node.kubelet.restart()  # removes our sockets, recreates kubelet.sock

    node.kubelet.wait_registered(sorted(served))
    assert len(node.kubelet.registrations) == before + len(served)
    wait_for(lambda: all(shim.registered().values()))
    for spec in shim.resources:
        assert (node.device_plugin_dir / spec.socket_name).is_socket()
    reserved = node.reserve([("main", "3g.20gb", [["gpu-0-3g-20gb-4"]])])
    node.kubelet.admit(reserved.pod)
    assert node.instances() == [(0, "3g.20gb", 4)]


def test_nothing_is_released_while_the_kubelet_cannot_say_who_holds_what(node: ShimNode) -> None:
    shim = node.start()
    reserved = node.reserve([("main", "1g.5gb", [["gpu-1-1g-5gb-0"]])])
    node.kubelet.admit(reserved.pod)
    shim.reconcile_now()
    node.kubelet.pod_resources_up = False  # restarting
    node.delete_pod(reserved.pod)
    node.kubelet.remove_pod(reserved.pod)
    assert shim.reconcile_now().released == []
    assert node.instances() == [(1, "1g.5gb", 0)]
    node.kubelet.pod_resources_up = True
    shim.reconcile_now()
    assert node.instances() == []


def test_crash_after_allocate_then_pod_deleted_while_down_leaks_nothing(node: ShimNode) -> None:
    node.start()
    reserved = node.reserve([("main", "1g.5gb", [["gpu-0-1g-5gb-4"]])])
    node.kubelet.admit(reserved.pod)
    node.crash()  # before any reconcile pass saw the holder
    node.delete_pod(reserved.pod)
    node.kubelet.remove_pod(reserved.pod)

    node.start()
    assert node.instances() == []
    assert node.cdi_files() == 0
    assert node.checkpoint().claims == {}


def test_crash_after_allocate_then_restart_records_the_real_holder(node: ShimNode) -> None:
    node.start()
    a = node.reserve([("main", "1g.5gb", [["gpu-0-1g-5gb-0"]])], name="pod-a")
    b = node.reserve([("main", "1g.5gb", [["gpu-0-1g-5gb-1"]])], name="pod-b")
    node.kubelet.add_pod(a.pod)
    node.kubelet.add_pod(b.pod)
    got_b = node.kubelet.admit(b.pod)  # takes A's (older) reservation
    node.crash()

    shim = node.start()
    wait_for(lambda: len(node.claims_of(b.pod)) == 1 and len(node.claims_of(a.pod)) == 1)
    shim.reconcile_now()
    [claim_b] = node.claims_of(b.pod)
    assert claim_b["metadata"]["uid"] in got_b.answers[("main", R_1G)].cdi_devices[0].name
    [claim_a] = node.claims_of(a.pod)
    assert claim_a["metadata"]["labels"][SHADOW_CLAIM_LABEL] == a.pod.uid
    entry = node.checkpoint().claims[claim_b["metadata"]["uid"]]
    assert entry.shim is not None
    assert entry.shim.pod_uid == b.pod.uid
    assert node.instances() == [(0, "1g.5gb", 0)]


def test_crash_inside_allocate_before_answering_leaks_nothing(node: ShimNode) -> None:
    shim = node.start(step_hook=crash_at("after-checkpoint"))
    reserved = node.reserve([("main", "1g.5gb", [["gpu-1-1g-5gb-2"]])])
    spec = next(s for s in shim.resources if s.resource_name == R_1G)
    with pytest.raises(Crash):
        shim.allocator.allocate(spec, ["1g-5gb-0"])  # the kubelet gets no answer
    node.crash()
    assert node.instances() == [(1, "1g.5gb", 2)]  # made and checkpointed, never answered

    shim = node.start(grace=0.0)
    shim.reconcile_now()
    shim.reconcile_now()
    entry = next(iter(node.checkpoint().claims.values()))
    assert entry.shim is not None
    assert entry.shim.device_plugin_ids == ()  # free for the pod's next Allocate

    got = node.kubelet.admit(reserved.pod)
    assert len(got.answers[("main", R_1G)].cdi_devices) == 1
    assert node.instances() == [(1, "1g.5gb", 2)]  # the same slice, not a second one

    node.delete_pod(reserved.pod)
    node.kubelet.remove_pod(reserved.pod)
    shim.reconcile_now()
    assert node.instances() == []
    assert node.checkpoint().claims == {}


def test_a_changed_inventory_is_streamed_to_the_kubelet(node: ShimNode) -> None:
    def inventory_of(spec: str) -> NodeInventory:
        backend = EmulatedGpuBackend(node_name=node.node.node, spec=spec)
        try:
            return build_inventory(backend.gpus())
        finally:
            backend.close()

    current = [inventory_of("2xA100-40GB")]
    shim = node.start(inventory=lambda: current[0])
    node.kubelet.wait_devices(R_1G, 14)
    current[0] = inventory_of("1xA100-40GB")  # e.g. MIG mode switched off on GPU 1
    shim.maintain()
    node.kubelet.wait_devices(R_1G, 7)
    node.kubelet.wait_devices(R_3G, 2)
    current[0] = inventory_of("1xA30-24GB")  # other profiles: A100 resources are withdrawn
    shim.maintain()
    assert {s.resource_name for s in shim.resources} == {
        "nvidia.com/mig-1g.6gb",
        "nvidia.com/mig-1g.6gb-me",
        "nvidia.com/mig-2g.12gb",
        "nvidia.com/mig-2g.12gb-me",
        "nvidia.com/mig-4g.24gb",
    }
    node.kubelet.wait_devices("nvidia.com/mig-1g.6gb", 4)
    assert not (node.device_plugin_dir / "instaslice-1g-5gb.sock").exists()
