"""A placement freed in the API before the node destroyed its old slice: the next prepare there (a
classic ``Allocate`` or a DRA prepare) releases the stale shim claim first — never a slice a live
claim or a running container still owns, and never on an unknown answer."""

from __future__ import annotations

import logging

import pytest

from api.checkpoint import ShimBinding
from api.names import DELETE_PROTECTION_FINALIZER
from driver.cdi import VISIBLE_DEVICES_ENV
from driver.cluster.ops import clear_claim_allocation
from driver.cluster.port import RESOURCE_CLAIMS
from driver.ids import ClaimUid
from kubeletplugin.deviceplugin.allocate import AllocateError, AllocateLaterError
from kubeletplugin.model import ClaimRef
from tests.shim.fake_kubelet import AdmissionError
from tests.shim.harness import R_1G, Reserved, ShimNode

PLACEMENT = "gpu-0-1g-5gb-0"
OLD_IDS = ("1g-5gb-3",)


def prepared_by_the_shim(node: ShimNode, *, held: bool) -> Reserved:
    """A classic pod whose slice the shim made and whose holder it recorded (what ``Allocate`` and
    a reconcile pass leave), prepared directly so that no reconcile pass is triggered; ``held``:
    the kubelet runs its container with the ids."""
    old = node.reserve([("main", "1g.5gb", [[PLACEMENT]])], name="old")
    claim = node.claim(old, old.claims[0])
    assert node.plugin is not None
    node.plugin.state.prepare_claim(
        ClaimRef(uid=ClaimUid(claim["metadata"]["uid"]), namespace="default", name=old.claims[0]),
        visible_devices_env=False,
        shim=ShimBinding(
            resource_name=R_1G,
            device_plugin_ids=OLD_IDS,
            pod_uid=old.pod.uid,
            container_name="main",
        ),
    )
    if held:
        node.kubelet.hold(old.pod, {("main", R_1G): OLD_IDS})
    assert node.instances() == [(0, "1g.5gb", 0)]
    return old


def deleted(node: ShimNode, reserved: Reserved) -> None:
    """The pod is deleted; as kube-controller-manager does then, its shadow claim's reservation and
    allocation are cleared and the delete-protection finalizer lifted: the claim is gone."""
    node.delete_pod(reserved.pod)
    obj = node.claim(reserved, reserved.claims[0])
    obj = clear_claim_allocation(node.api, claim=obj)
    obj["metadata"]["finalizers"] = [
        f for f in obj["metadata"]["finalizers"] if f != DELETE_PROTECTION_FINALIZER
    ]
    node.api.update(RESOURCE_CLAIMS, obj)
    node.apiserver.settle()
    assert node.claims_of(reserved.pod) == []


def finished(node: ShimNode, reserved: Reserved) -> None:
    """The pod finished; the controller deallocates its shadow claim (docs/design.md F6)."""
    clear_claim_allocation(node.api, claim=node.claim(reserved, reserved.claims[0]))


@pytest.mark.parametrize("released", [deleted, finished], ids=["pod-deleted", "pod-finished"])
def test_allocate_releases_the_stale_slice_at_its_placement_and_succeeds(
    node: ShimNode, released: object, caplog: pytest.LogCaptureFixture
) -> None:
    node.start()
    old = prepared_by_the_shim(node, held=False)
    node.kubelet.remove_pod(old.pod)
    assert callable(released)
    released(node, old)
    new = node.reserve([("main", "1g.5gb", [[PLACEMENT]])], name="new")  # the freed placement
    caplog.set_level(logging.INFO, logger="kubeletplugin.state.overlaps")

    admitted = node.kubelet.admit(new.pod)

    new_uid = node.claim(new, new.claims[0])["metadata"]["uid"]
    assert new_uid in admitted.answers[("main", R_1G)].cdi_devices[0].name
    assert node.instances() == [(0, "1g.5gb", 0)]
    assert list(node.checkpoint().claims) == [new_uid]
    assert node.cdi_files() == 1
    entry = node.checkpoint().claims[new_uid]
    assert admitted.answers[("main", R_1G)].envs[VISIBLE_DEVICES_ENV] == entry.devices[0].mig_uuid
    assert f"releasing claim default/{old.claims[0]} before preparing" in caplog.text


def test_a_stale_claim_whose_slice_a_container_still_holds_is_not_released(
    node: ShimNode,
) -> None:
    node.start()
    old = prepared_by_the_shim(node, held=True)  # e.g. a pod of another namespace got it
    deleted(node, old)
    new = node.reserve([("main", "1g.5gb", [[PLACEMENT]])], name="new")

    with pytest.raises(AdmissionError) as refused:
        node.kubelet.admit(new.pod)
    message = str(refused.value)
    assert f"overlaps {PLACEMENT} of claim default/{old.claims[0]}" in message
    assert "the claim was deleted, but container default/old[main] still holds its slices" in (
        message
    )
    assert node.instances() == [(0, "1g.5gb", 0)]
    assert [e.name for e in node.checkpoint().claims.values()] == [old.claims[0]]


def test_a_live_claim_at_the_placement_is_never_released(node: ShimNode) -> None:
    shim = node.start()
    old = prepared_by_the_shim(node, held=False)  # its claim is still allocated
    new = node.reserve([("main", "1g.5gb", [[PLACEMENT]])], name="new")  # a double allocation
    spec = next(s for s in shim.resources if s.resource_name == R_1G)
    with pytest.raises(AllocateError, match="its claim still holds it") as refused:
        shim.allocator.allocate(spec, ["1g-5gb-0"])
    assert not refused.value.retryable
    assert node.instances() == [(0, "1g.5gb", 0)]
    assert [e.name for e in node.checkpoint().claims.values()] == [old.claims[0]]
    assert node.claims_of(new.pod)


def test_nothing_is_released_while_pod_resources_cannot_be_asked(node: ShimNode) -> None:
    shim = node.start()
    old = prepared_by_the_shim(node, held=False)
    node.kubelet.remove_pod(old.pod)
    deleted(node, old)
    new = node.reserve([("main", "1g.5gb", [[PLACEMENT]])], name="new")
    spec = next(s for s in shim.resources if s.resource_name == R_1G)
    node.kubelet.pod_resources_up = False  # the kubelet is restarting

    with pytest.raises(AllocateLaterError) as later:
        shim.allocator.allocate(spec, ["1g-5gb-0"])
    assert later.value.retryable
    assert "cannot be told now (retryable)" in str(later.value)
    assert "kubelet is restarting" in str(later.value)
    assert node.instances() == [(0, "1g.5gb", 0)]
    assert [e.name for e in node.checkpoint().claims.values()] == [old.claims[0]]

    node.kubelet.pod_resources_up = True
    node.kubelet.admit(new.pod)  # the kubelet's retry (a new pod, for a real kubelet) succeeds
    assert [e.name for e in node.checkpoint().claims.values()] == [new.claims[0]]


def test_a_dra_prepare_at_the_placement_of_a_stale_shim_claim_releases_it(node: ShimNode) -> None:
    node.start()
    old = prepared_by_the_shim(node, held=False)
    node.kubelet.remove_pod(old.pod)
    deleted(node, old)
    dra = node.node.claim([PLACEMENT], name="dra-claim")  # the controller reused the placement

    answer = node.node.kubelet().prepare([dra])[dra.uid]

    assert answer.error == ""
    assert [d[2] for d in answer.devices] == [PLACEMENT]
    assert list(node.checkpoint().claims) == [dra.uid]
    assert node.instances() == [(0, "1g.5gb", 0)]
    assert node.cdi_files() == 1
