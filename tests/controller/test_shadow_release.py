"""Shadow claims of classic pods that are gone: released by us (``controller.classic.release``).

No kube-controller-manager claim controller runs here, which is what a stale one amounts to: when
the garbage collector deletes a shadow claim whose pod its cache still holds, it keeps the claim's
reservation, allocation and finalizer, and nothing ever makes it look again. Our controller must
release such claims on the pod's delete event, on the claim's own events, and when it starts
leading — but never while the pod still exists and is only terminating.
"""

from __future__ import annotations

from contextlib import ExitStack
from datetime import UTC, datetime

import pytest

from api import wire
from api.names import DELETE_PROTECTION_FINALIZER, DRIVER_NAME, SHADOW_CLAIM_LABEL
from controller.allocation.results import node_selector
from controller.allocation.sync import SyncConfig
from controller.classic import shadow
from controller.classic.release import PodFate, pod_fate
from driver.cluster import ops
from driver.cluster.kube import KubeClusterApi
from driver.cluster.port import PODS, RESOURCE_CLAIMS, RESOURCE_SLICES, JsonObject
from driver.cluster.views import PodView
from driver.errors import ApiNotFoundError, ConflictError
from driver.resourceslices import complete_pools, parse_devices
from localcluster.apiserver import LocalApiServer
from tests.controller.harness import (
    NS,
    assert_no_overlap,
    claim_object,
    cluster_api,
    get_pod,
    pod_object,
    publish_node,
    start_controller,
    ungated,
    wait_for,
)

WHOLE_GPU = {"nvidia.com/mig-7g.40gb": 1}
ONE_SLICE = {"nvidia.com/mig-1g.5gb": 1}
HOLD = "example.com/hold"
"""A finalizer of our own: a pod carrying it stays, terminating, after it is deleted."""


@pytest.fixture
def api(apiserver: LocalApiServer, stack: ExitStack) -> KubeClusterApi:
    api = cluster_api(apiserver, stack)
    publish_node(api, "node-a", gpus=1)
    return api


def _shadow_claims(api: KubeClusterApi, uid: str) -> list[JsonObject]:
    return api.list_objects(
        RESOURCE_CLAIMS, namespace=NS, label_selector=f"{SHADOW_CLAIM_LABEL}={uid}"
    ).items


def _placed(api: KubeClusterApi, name: str) -> JsonObject:
    """The pod once ungated; its shadow claim is allocated and reserved for it."""
    wait_for(lambda: ungated(api, name), what=f"pod {name} ungated")
    pod = get_pod(api, name)
    (claim,) = _shadow_claims(api, pod["metadata"]["uid"])
    assert claim["status"]["reservedFor"] == [ops.pod_reference(pod)]
    assert DELETE_PROTECTION_FINALIZER in claim["metadata"]["finalizers"]
    return pod


def _delete(api: KubeClusterApi, name: str) -> None:
    api.delete(PODS, name=name, namespace=NS)


def _no_claims(api: KubeClusterApi, uid: str) -> bool:
    return not _shadow_claims(api, uid)


def test_a_deleted_pods_shadow_claim_is_released_and_its_deletion_completes(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    api.create(PODS, pod_object("first", classic=WHOLE_GPU), namespace=NS)
    start_controller(apiserver, stack)
    first = _placed(api, "first")
    api.create(PODS, pod_object("second", classic=WHOLE_GPU), namespace=NS)

    _delete(api, "first")
    wait_for(
        lambda: _no_claims(api, first["metadata"]["uid"]),
        what="the deleted pod's shadow claim gone (reservation, allocation, finalizer lifted)",
    )
    _placed(api, "second")  # the GPU it held was freed
    assert assert_no_overlap(api) == 1


def test_a_terminating_pod_keeps_its_shadow_claim_until_it_is_gone(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    held = pod_object("held", classic=ONE_SLICE)
    held["metadata"]["finalizers"] = [HOLD]
    api.create(PODS, held, namespace=NS)
    api.create(PODS, pod_object("canary", classic=ONE_SLICE), namespace=NS)
    start_controller(apiserver, stack)
    held, canary = _placed(api, "held"), _placed(api, "canary")

    _delete(api, "held")
    _delete(api, "canary")
    wait_for(lambda: _no_claims(api, canary["metadata"]["uid"]), what="the canary's claim gone")
    terminating = get_pod(api, "held")
    assert terminating["metadata"]["deletionTimestamp"]
    (claim,) = _shadow_claims(api, held["metadata"]["uid"])
    assert claim["status"]["allocation"], "the node may still use the slice"
    assert claim["status"]["reservedFor"] == [ops.pod_reference(held)]

    terminating["metadata"]["finalizers"] = []
    api.update(PODS, terminating)  # the last finalizer: the pod is gone
    wait_for(lambda: _no_claims(api, held["metadata"]["uid"]), what="the gone pod's claim gone")
    assert assert_no_overlap(api) == 0


def test_a_new_leader_releases_the_claim_of_a_pod_recreated_under_its_name_but_not_the_new_one(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    api.create(PODS, pod_object("web-0", classic=WHOLE_GPU), namespace=NS)
    with ExitStack() as first_leader:
        start_controller(apiserver, first_leader, identity="first")
        old = _placed(api, "web-0")
    # while no controller runs: the pod is replaced (a StatefulSet's), the GC marks the old
    # claim deleted, and nothing releases it
    _delete(api, "web-0")
    wait_for(
        lambda: all(
            c["metadata"].get("deletionTimestamp")
            for c in _shadow_claims(api, old["metadata"]["uid"])
        ),
        what="the old claim marked deleted by the garbage collector",
    )
    api.create(PODS, pod_object("web-0", classic=WHOLE_GPU), namespace=NS)

    start_controller(apiserver, stack, identity="second")
    wait_for(lambda: _no_claims(api, old["metadata"]["uid"]), what="the old pod's claim gone")
    new = _placed(api, "web-0")  # on the GPU the old one held
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    (claim,) = _shadow_claims(api, new["metadata"]["uid"])
    assert not claim["metadata"].get("deletionTimestamp")
    assert assert_no_overlap(api) == 1


def _device(api: KubeClusterApi, profile: str) -> str:
    slices = api.list_objects(RESOURCE_SLICES).items
    devices = [d for pool in complete_pools(slices).values() for d in parse_devices(pool)]
    return next(d.name for d in devices if d.profile == profile)


def test_a_shadow_claim_whose_pod_the_controller_never_saw_is_released_on_its_own_events(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    controller = start_controller(apiserver, stack)
    wait_for(lambda: controller.allocator.leading_ready, what="the controller leading")
    ghost: wire.ResourceClaimConsumerReference = {
        "resource": "pods",
        "name": "ghost",
        "uid": "0f0f0f0f-dead-4bad-9bad-000000000001",
    }
    orphan = claim_object("ghost-main-7g.40gb")
    orphan["metadata"]["labels"] = {SHADOW_CLAIM_LABEL: ghost["uid"]}
    orphan["metadata"]["finalizers"] = [DELETE_PROTECTION_FINALIZER]
    orphan = api.create(RESOURCE_CLAIMS, orphan, namespace=NS)
    allocation: wire.AllocationResult = {
        "devices": {
            "results": [
                {
                    "request": "mig",
                    "driver": DRIVER_NAME,
                    "pool": "node-a",
                    "device": _device(api, "7g.40gb"),
                }
            ]
        },
        "nodeSelector": node_selector("node-a"),
    }
    ops.write_claim_allocation(
        api,
        claim=orphan,
        allocation=allocation,
        allocated_at=datetime.now(UTC),
        reserved_for=[ghost],
    )
    wait_for(
        lambda: not _claim(api, "ghost-main-7g.40gb").get("status"),
        what="the orphan's reservation and allocation cleared",
    )
    api.create(PODS, pod_object("next", classic=WHOLE_GPU), namespace=NS)
    _placed(api, "next")

    api.delete(RESOURCE_CLAIMS, name="ghost-main-7g.40gb", namespace=NS)
    wait_for(lambda: _gone(api, "ghost-main-7g.40gb"), what="the orphan's finalizer lifted")
    assert assert_no_overlap(api) == 1


def _claim(api: KubeClusterApi, name: str) -> JsonObject:
    return api.get(RESOURCE_CLAIMS, name=name, namespace=NS)


def _gone(api: KubeClusterApi, name: str) -> bool:
    try:
        _claim(api, name)
    except ApiNotFoundError:
        return True
    return False


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("none", PodFate.ALIVE),
        ("terminating", PodFate.ALIVE),
        ("succeeded", PodFate.FINISHED),
        ("deleted", PodFate.GONE),
        ("recreated", PodFate.GONE),
    ],
    ids=lambda v: v if isinstance(v, str) else v.value,
)
def test_pod_fate_asks_the_api_by_name_and_checks_the_uid(
    api: KubeClusterApi, change: str, expected: PodFate
) -> None:
    body = pod_object("p", classic=ONE_SLICE)
    body["metadata"]["finalizers"] = [HOLD]
    pod = api.create(PODS, body, namespace=NS)
    uid = pod["metadata"]["uid"]
    if change == "succeeded":
        api.update_status(PODS, {**pod, "status": {"phase": "Succeeded"}})
    if change in ("terminating", "deleted", "recreated"):
        _delete(api, "p")
    if change in ("deleted", "recreated"):
        pod = get_pod(api, "p")
        pod["metadata"]["finalizers"] = []
        api.update(PODS, pod)
    if change == "recreated":
        api.create(PODS, pod_object("p", classic=ONE_SLICE), namespace=NS)
    assert pod_fate(api, namespace=NS, name="p", uid=uid) is expected


def test_release_keeps_the_allocation_while_another_consumer_reserves_the_claim(
    api: KubeClusterApi,
) -> None:
    gone: wire.ResourceClaimConsumerReference = {
        "resource": "pods",
        "name": "gone",
        "uid": "uid-gone",
    }
    other: wire.ResourceClaimConsumerReference = {
        "resource": "pods",
        "name": "other",
        "uid": "uid-other",
    }
    claim = claim_object("shared")
    claim["metadata"]["finalizers"] = [DELETE_PROTECTION_FINALIZER]
    claim = api.create(RESOURCE_CLAIMS, claim, namespace=NS)
    allocation: wire.AllocationResult = {
        "devices": {
            "results": [
                {
                    "request": "mig",
                    "driver": DRIVER_NAME,
                    "pool": "node-a",
                    "device": _device(api, "1g.5gb"),
                }
            ]
        },
        "nodeSelector": node_selector("node-a"),
    }
    claim = ops.write_claim_allocation(
        api,
        claim=claim,
        allocation=allocation,
        allocated_at=datetime.now(UTC),
        reserved_for=[gone, other],
    )
    api.delete(RESOURCE_CLAIMS, name="shared", namespace=NS)

    assert shadow.release(api, _claim(api, "shared"), pod_uid="uid-gone") is False
    kept = _claim(api, "shared")
    assert kept["status"]["reservedFor"] == [other]
    assert kept["status"]["allocation"]
    assert kept["metadata"]["finalizers"] == [DELETE_PROTECTION_FINALIZER]

    assert shadow.release(api, kept, pod_uid="uid-other") is True
    assert _gone(api, "shared"), "unreserved and unallocated, the finalizer is lifted"


def _release_as_kube_controller_manager(api: KubeClusterApi, uid: str) -> None:
    """What kube-controller-manager's claim controller does when it syncs the shadow claim of a
    finished pod (docs/design.md F6): drop the pod from reservedFor and the allocation, lift the
    finalizer, delete the claim (its controller owner is done). It may run before or after ours."""
    for _ in range(5):
        claims = _shadow_claims(api, uid)
        if not claims:
            return
        (claim,) = claims
        try:
            claim = ops.clear_claim_allocation(api, claim=claim)
            claim["metadata"]["finalizers"] = []
            api.update(RESOURCE_CLAIMS, claim)
            api.delete(RESOURCE_CLAIMS, name=claim["metadata"]["name"], namespace=NS)
            return
        except ApiNotFoundError:
            return
        except ConflictError:
            continue  # our controller wrote first: read again, as a real controller would


@pytest.mark.parametrize("kcm_first", [True, False], ids=["kcm-first", "ours-first"])
def test_a_finished_pods_shadow_claim_ends_released_whichever_controller_syncs_it_first(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack, kcm_first: bool
) -> None:
    api.create(PODS, pod_object("job", classic=WHOLE_GPU), namespace=NS)
    api.create(PODS, pod_object("next", classic=WHOLE_GPU), namespace=NS)
    start_controller(apiserver, stack)
    wait_for(lambda: ungated(api, "job") != ungated(api, "next"), what="one of two placed")
    done, waiting = ("job", "next") if ungated(api, "job") else ("next", "job")
    pod = get_pod(api, done)
    uid = pod["metadata"]["uid"]
    if kcm_first:
        # kube-controller-manager syncs the claim between the pod finishing and our controller
        # seeing it: emulate it by finishing the pod and releasing at once, in that order
        api.update_status(PODS, {**pod, "status": {**pod.get("status", {}), "phase": "Succeeded"}})
        _release_as_kube_controller_manager(api, uid)
    else:
        api.update_status(PODS, {**pod, "status": {**pod.get("status", {}), "phase": "Succeeded"}})
        wait_for(
            lambda: (
                not any(c.get("status", {}).get("allocation") for c in _shadow_claims(api, uid))
            ),
            what="our controller released the finished pod's shadow claim",
        )
        _release_as_kube_controller_manager(api, uid)
    wait_for(lambda: _no_claims(api, uid), what="the finished pod's shadow claim gone")
    wait_for(lambda: ungated(api, waiting), what="the freed GPU reused")
    assert assert_no_overlap(api) == 1


def test_a_finished_pod_looked_at_while_a_lease_renew_is_late_is_released_once_it_lands(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    """``is_leader()`` blinks False while a renew is overdue and comes back with no new term (no
    ``start_leading`` to requeue anything): a finished pod looked at in the blink must be looked
    at again, or its slices stay taken until the pod is deleted."""
    controller = start_controller(apiserver, stack, sync=SyncConfig(not_leader_retry=0.2))
    allocator = controller.allocator
    api.create(PODS, pod_object("job", classic=WHOLE_GPU), namespace=NS)
    pod = _placed(api, "job")
    uid = pod["metadata"]["uid"]
    renewed = [False]
    allocator._is_leader = lambda: renewed[0]  # the renew is late: not provably the leader
    looked_at: list[str] = []
    release = allocator._shadows.release_finished

    def recording_release(finished: PodView) -> None:
        looked_at.append(finished.name)
        release(finished)

    allocator._shadows.release_finished = recording_release  # type: ignore[method-assign,assignment]
    api.update_status(PODS, {**pod, "status": {**pod.get("status", {}), "phase": "Succeeded"}})
    wait_for(lambda: looked_at, what="the finished pod looked at during the blink")
    assert all(c["status"].get("allocation") for c in _shadow_claims(api, uid))
    renewed[0] = True  # the late renew succeeded: leader again, same term
    wait_for(
        lambda: not any(c["status"].get("allocation") for c in _shadow_claims(api, uid)),
        what="the finished pod's shadow claim released after the blink",
    )
