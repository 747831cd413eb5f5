"""No crossed slices: shadow claims end up standing for the pod that really holds their slices, and
a pod's slices are destroyed when that pod is gone — never those of another pod."""

from __future__ import annotations

from api.names import SHADOW_CLAIM_LABEL
from driver.cdi import VISIBLE_DEVICES_ENV
from driver.cluster.events import EventRecorder
from driver.cluster.ops import clear_claim_allocation
from driver.cluster.port import EVENTS
from kubeletplugin.deviceplugin.reconcile import CROSSED_NAMESPACES_REASON
from tests.shim.fake_kubelet import Admitted
from tests.shim.harness import R_1G, Reserved, ShimNode, devices_of


def uuid_by_device(node: ShimNode) -> dict[str, str]:
    return {
        d.device: d.mig_uuid or ""
        for entry in node.checkpoint().claims.values()
        for d in entry.devices
    }


def device_of(node: ShimNode, admitted: Admitted) -> str:
    """The device whose slice the pod's container really got (by the MIG UUID it was shown)."""
    uuid = admitted.answers[("main", R_1G)].envs[VISIBLE_DEVICES_ENV]
    return next(device for device, u in uuid_by_device(node).items() if u == uuid)


def owned_devices(node: ShimNode, reserved: Reserved) -> list[str]:
    """Devices of the shadow claims that stand for the pod now, checked for consistency."""
    devices = []
    for claim in node.claims_of(reserved.pod):
        meta = claim["metadata"]
        assert [o["uid"] for o in meta["ownerReferences"]] == [reserved.pod.uid]
        assert meta["labels"][SHADOW_CLAIM_LABEL] == reserved.pod.uid
        assert [r["uid"] for r in claim["status"]["reservedFor"]] == [reserved.pod.uid]
        devices += devices_of(claim)
    return devices


def two_pods(node: ShimNode) -> tuple[Reserved, Reserved]:
    a = node.reserve([("main", "1g.5gb", [["gpu-0-1g-5gb-0"]])], name="pod-a")
    b = node.reserve([("main", "1g.5gb", [["gpu-1-1g-5gb-6"]])], name="pod-b")
    return a, b


def admit_crossed(node: ShimNode, a: Reserved, b: Reserved) -> tuple[Admitted, Admitted]:
    """The kubelet knows both pods, then admits B (reserved second) first: B's Allocate cannot
    tell which pod asks, and takes the older reservation, A's."""
    node.kubelet.add_pod(a.pod)
    node.kubelet.add_pod(b.pod)
    got_b = node.kubelet.admit(b.pod)
    claim_a = node.claim(a, a.claims[0])
    assert claim_a["metadata"]["uid"] in got_b.answers[("main", R_1G)].cdi_devices[0].name
    got_a = node.kubelet.admit(a.pod)
    return got_a, got_b


def test_pods_admitted_in_the_opposite_order_own_the_slices_they_got(node: ShimNode) -> None:
    shim = node.start()
    a, b = two_pods(node)
    got_a, got_b = admit_crossed(node, a, b)
    assert device_of(node, got_b) == "gpu-0-1g-5gb-0"  # A's reservation went to B
    assert device_of(node, got_a) == "gpu-1-1g-5gb-6"

    shim.reconcile_now()
    assert owned_devices(node, a) == [device_of(node, got_a)]
    assert owned_devices(node, b) == [device_of(node, got_b)]
    for reserved in (a, b):
        for entry in node.checkpoint().claims.values():
            assert entry.shim is not None
        holders = {e.shim.pod_uid for e in node.checkpoint().claims.values() if e.shim}
        assert reserved.pod.uid in holders
    assert shim.reconcile_now().moved == []  # settled


def test_pods_of_two_namespaces_admitted_in_the_opposite_order_each_get_their_own_reservation(
    node: ShimNode,
) -> None:
    # A real kubelet lists a pod from its own admission on, one pod at a time: B's Allocate sees B
    # (without devices) and not A, so B gets its own reservation although A's is older — a claim
    # could not be moved to a pod of another namespace afterwards.
    shim = node.start()
    a = node.reserve([("main", "1g.5gb", [["gpu-0-1g-5gb-0"]])], name="web", namespace="team-a")
    b = node.reserve([("main", "1g.5gb", [["gpu-1-1g-5gb-6"]])], name="web", namespace="team-b")
    got_b = node.kubelet.admit(b.pod)
    got_a = node.kubelet.admit(a.pod)
    assert device_of(node, got_b) == "gpu-1-1g-5gb-6"
    assert device_of(node, got_a) == "gpu-0-1g-5gb-0"

    report = shim.reconcile_now()
    assert (report.moved, report.cross_namespace) == ([], [])
    assert owned_devices(node, a) == ["gpu-0-1g-5gb-0"]
    assert owned_devices(node, b) == ["gpu-1-1g-5gb-6"]


def test_the_pod_that_lost_its_reservation_gets_the_other_one_back_before_it_is_admitted(
    node: ShimNode,
) -> None:
    shim = node.start()
    a, b = two_pods(node)
    node.kubelet.add_pod(a.pod)
    node.kubelet.add_pod(b.pod)
    got_b = node.kubelet.admit(b.pod)
    shim.reconcile_now()
    assert owned_devices(node, b) == [device_of(node, got_b)] == ["gpu-0-1g-5gb-0"]
    assert owned_devices(node, a) == ["gpu-1-1g-5gb-6"]  # B's unused reservation, given to A

    got_a = node.kubelet.admit(a.pod)
    assert device_of(node, got_a) == "gpu-1-1g-5gb-6"
    assert shim.reconcile_now().moved == []
    assert sorted(node.instances()) == [(0, "1g.5gb", 0), (1, "1g.5gb", 6)]


def test_deleting_a_pod_destroys_its_slice_and_leaves_the_other_pods_alone(
    node: ShimNode,
) -> None:
    shim = node.start()
    a, b = two_pods(node)
    _, got_b = admit_crossed(node, a, b)
    shim.reconcile_now()

    node.delete_pod(a.pod)  # garbage collection deletes the claim that stands for A
    report = shim.reconcile_now()
    assert report.released == []  # the kubelet still runs A's container: its slice is in use
    assert len(node.instances()) == 2

    node.kubelet.remove_pod(a.pod)
    shim.reconcile_now()
    kept = device_of(node, got_b)
    assert kept == "gpu-0-1g-5gb-0"
    assert node.instances() == [(0, "1g.5gb", 0)]  # B's slice, made from A's reservation, stays
    assert node.cdi_files() == 1
    assert [d.device for e in node.checkpoint().claims.values() for d in e.devices] == [kept]
    assert shim.reconcile_now().released == []  # nothing freed twice

    node.delete_pod(b.pod)
    node.kubelet.remove_pod(b.pod)
    shim.reconcile_now()
    assert node.instances() == []
    assert node.cdi_files() == 0
    assert node.checkpoint().claims == {}


def test_a_crossing_between_namespaces_is_reported_on_both_pods_and_no_used_slice_is_freed(
    node: ShimNode,
) -> None:
    # A kubelet that lists both pods before admitting either (e.g. restarted with both pending):
    # B's Allocate cannot tell, takes A's older reservation, and a claim cannot move namespaces.
    shim = node.start(events=EventRecorder(api=node.api, component="test-plugin"))
    a = node.reserve([("main", "1g.5gb", [["gpu-0-1g-5gb-0"]])], name="web", namespace="team-a")
    b = node.reserve([("main", "1g.5gb", [["gpu-1-1g-5gb-6"]])], name="web", namespace="team-b")
    got_a, got_b = admit_crossed(node, a, b)
    report = shim.reconcile_now()
    claim_uids = {node.claim(r, r.claims[0])["metadata"]["uid"] for r in (a, b)}
    assert set(report.cross_namespace) == claim_uids
    assert report.moved == []
    shim.reconcile_now()  # reported once, not on every pass
    for reserved, other in ((a, b), (b, a)):
        events = node.api.list_objects(EVENTS, namespace=reserved.pod.namespace).items
        crossed = [e for e in events if e["reason"] == CROSSED_NAMESPACES_REASON]
        assert len(crossed) == 2  # as the holder of one claim and the owner of the other
        for event in crossed:
            assert event["type"] == "Warning"
            assert event["involvedObject"]["uid"] == reserved.pod.uid
            assert event["count"] == 1
        assert any(f"{other.pod.namespace}/{other.claims[0]}" in e["message"] for e in crossed)

    node.delete_pod(a.pod)  # A's claim goes; its slices are in B's container
    node.kubelet.remove_pod(a.pod)
    assert shim.reconcile_now().released == []
    assert device_of(node, got_b) == "gpu-0-1g-5gb-0"
    assert node.instances() == [(0, "1g.5gb", 0), (1, "1g.5gb", 6)]
    assert device_of(node, got_a) == "gpu-1-1g-5gb-6"


def test_a_finished_pod_is_released_when_the_controller_deallocates_its_claim(
    node: ShimNode,
) -> None:
    shim = node.start()
    reserved = node.reserve([("main", "1g.5gb", [["gpu-0-1g-5gb-2"]])])
    node.kubelet.admit(reserved.pod)
    shim.reconcile_now()
    node.kubelet.remove_pod(reserved.pod)  # Succeeded: the kubelet no longer lists it
    assert shim.reconcile_now().released == []  # its claim is still allocated: still accounted
    assert node.instances() == [(0, "1g.5gb", 2)]

    clear_claim_allocation(node.api, claim=node.claim(reserved, reserved.claims[0]))
    shim.reconcile_now()
    assert node.instances() == []
    assert node.checkpoint().claims == {}


def test_with_the_shim_off_a_pod_it_served_before_keeps_its_slice_and_is_released_later(
    node: ShimNode,
) -> None:
    """A switch to scheduler mode (--classic-shim off) while a classic pod runs: nothing is served
    any more, the running pod keeps its slice, and its slice goes when its claim is released."""
    node.start()
    reserved = node.reserve([("main", "1g.5gb", [["gpu-0-1g-5gb-2"]])])
    node.kubelet.admit(reserved.pod)
    node.crash()  # the plugin restarts with the shim off

    shim = node.start(serve=False)
    assert shim.resources == ()
    assert shim.registered() == {}
    assert shim.reconcile_now().released == []
    assert node.instances() == [(0, "1g.5gb", 2)]

    node.kubelet.remove_pod(reserved.pod)
    clear_claim_allocation(node.api, claim=node.claim(reserved, reserved.claims[0]))
    shim.reconcile_now()
    assert node.instances() == []
    assert node.checkpoint().claims == {}


def test_recycled_device_ids_do_not_hand_out_the_slice_of_a_finished_pod(node: ShimNode) -> None:
    shim = node.start()
    first = node.reserve([("main", "1g.5gb", [["gpu-0-1g-5gb-0"]])])
    got_first = node.kubelet.admit(first.pod)
    ids = got_first.ids[("main", R_1G)]
    shim.reconcile_now()
    node.kubelet.remove_pod(first.pod)  # finished; its claim not released yet

    second = node.reserve([("main", "1g.5gb", [["gpu-1-1g-5gb-1"]])])
    got_second = node.kubelet.admit(second.pod, ids={("main", R_1G): ids})  # same ids again
    assert device_of(node, got_second) == "gpu-1-1g-5gb-1"
    assert sorted(node.instances()) == [(0, "1g.5gb", 0), (1, "1g.5gb", 1)]
    shim.reconcile_now()
    assert owned_devices(node, second) == ["gpu-1-1g-5gb-1"]
    assert owned_devices(node, first) == ["gpu-0-1g-5gb-0"]

    node.delete_pod(first.pod)
    shim.reconcile_now()
    assert node.instances() == [(1, "1g.5gb", 1)]


def test_preferred_allocation_avoids_ids_still_bound_to_an_unreleased_claim(
    node: ShimNode,
) -> None:
    shim = node.start()
    first = node.reserve([("main", "1g.5gb", [["gpu-0-1g-5gb-0"]])])
    got_first = node.kubelet.admit(first.pod)
    shim.reconcile_now()
    node.kubelet.remove_pod(first.pod)
    second = node.reserve([("main", "1g.5gb", [["gpu-1-1g-5gb-1"]])])
    got_second = node.kubelet.admit(second.pod)
    assert got_second.ids[("main", R_1G)] != got_first.ids[("main", R_1G)]


def test_ids_no_container_ever_held_are_freed_after_the_grace_period(node: ShimNode) -> None:
    shim = node.start(grace=0.0)
    reserved = node.reserve([("main", "1g.5gb", [["gpu-0-1g-5gb-3"]])])
    spec = next(s for s in shim.resources if s.resource_name == R_1G)
    shim.allocator.allocate(spec, ["1g-5gb-9"])  # answered, but the kubelet never recorded it
    shim.reconcile_now()  # the first pass notes the ids unheld; with no grace, they go
    shim.reconcile_now()
    entry = next(iter(node.checkpoint().claims.values()))
    assert entry.shim is not None
    assert entry.shim.device_plugin_ids == ()
    assert entry.shim.pod_uid is None

    got = node.kubelet.admit(reserved.pod)  # the reservation is free again: same slice, adopted
    assert device_of(node, got) == "gpu-0-1g-5gb-3"
    assert node.instances() == [(0, "1g.5gb", 3)]
