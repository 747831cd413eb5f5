"""The resourceclaim controller against the local API server: claims from templates, reservations
released when pods finish or go, allocation cleared only for protected claims (docs/design.md F1, F3,
F6)."""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Callable
from typing import Any

import pytest

from driver.cluster.port import PODS, RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS, PatchType
from driver.errors import ApiNotFoundError
from localcluster.cluster.claimcontroller import generate_name_base
from localcluster.cluster.runner import LocalCluster
from tests.localcluster_cluster.conftest import NS, allocation, claim, pod, template

GATE = "instaslice.dev/placement"


def _get(cluster: LocalCluster, resource: Any, name: str) -> dict[str, Any] | None:
    assert cluster.api is not None
    try:
        return cluster.api.get(resource, name=name, namespace=NS)
    except ApiNotFoundError:
        return None


def _reserve(
    cluster: LocalCluster, name: str, pod_obj: dict[str, Any], node: str = "node-a"
) -> None:
    assert cluster.api is not None
    current = cluster.api.get(RESOURCE_CLAIMS, name=name, namespace=NS)
    updated = copy.deepcopy(current)
    updated["status"] = {
        "allocation": allocation(node),
        "reservedFor": [
            {
                "resource": "pods",
                "name": pod_obj["metadata"]["name"],
                "uid": pod_obj["metadata"]["uid"],
            }
        ],
    }
    cluster.api.update_status(RESOURCE_CLAIMS, updated)


def _finish(cluster: LocalCluster, name: str, phase: str = "Succeeded") -> None:
    assert cluster.api is not None
    current = cluster.api.get(PODS, name=name, namespace=NS)
    cluster.api.update_status(PODS, {**current, "status": {**current["status"], "phase": phase}})


def test_claim_from_template_is_named_owned_recorded_and_goes_with_the_pod(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster()
    api = cluster.api
    assert api is not None
    api.create(RESOURCE_CLAIM_TEMPLATES, template())
    created = api.create(
        PODS,
        pod("p", claims=[{"name": "gpu", "resourceClaimTemplateName": "tpl"}], gates=[GATE]),
    )

    def recorded() -> str | None:
        got = _get(cluster, PODS, "p") or {}
        statuses = got.get("status", {}).get("resourceClaimStatuses") or []
        return statuses[0]["resourceClaimName"] if statuses else None

    name = cluster.wait_for(recorded)
    assert re.fullmatch(r"p-gpu-[bcdfghjklmnpqrstvwxz2456789]{5}", name)
    generated = _get(cluster, RESOURCE_CLAIMS, name)
    assert generated is not None
    assert generated["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": created["metadata"]["uid"],
         "controller": True, "blockOwnerDeletion": True}
    ]  # fmt: skip
    assert generated["metadata"]["annotations"] == {"resource.kubernetes.io/pod-claim-name": "gpu"}
    assert generated["metadata"]["labels"] == {"from": "template"}
    assert generated["spec"] == template()["spec"]["spec"]
    assert len(api.list_objects(RESOURCE_CLAIMS, namespace=NS).items) == 1

    api.delete(PODS, name="p", namespace=NS)
    cluster.wait_for(lambda: _get(cluster, RESOURCE_CLAIMS, name) is None)


@pytest.mark.parametrize(
    ("pod_name", "claim_name", "expected"),
    [
        ("p", "gpu", "p-gpu-"),
        ("a" * 60, "b" * 20, "a" * 42 + "-" + "b" * 14 + "-"),
    ],
    ids=["short", "shortened-in-proportion"],
)
def test_generate_name_base(pod_name: str, claim_name: str, expected: str) -> None:
    assert generate_name_base(pod_name, claim_name) == expected


@pytest.mark.parametrize(
    ("protected", "allocation_kept"),
    [(True, False), (False, True)],
    ids=["with-finalizer-deallocated", "without-finalizer-stays-allocated"],
)
def test_finished_pod_is_unreserved(
    make_cluster: Callable[..., LocalCluster], protected: bool, allocation_kept: bool
) -> None:
    cluster = make_cluster()
    api = cluster.api
    assert api is not None
    api.create(RESOURCE_CLAIMS, claim("shared", finalizer=protected))
    user = api.create(
        PODS, pod("user", claims=[{"name": "gpu", "resourceClaimName": "shared"}], gates=[GATE])
    )
    _reserve(cluster, "shared", user)
    _finish(cluster, "user")

    def released() -> dict[str, Any] | None:
        got = _get(cluster, RESOURCE_CLAIMS, "shared")
        if got is None or got.get("status", {}).get("reservedFor"):
            return None
        if protected and "finalizers" in got["metadata"]:
            return None
        return got

    got = cluster.wait_for(released)
    assert ("allocation" in got.get("status", {})) is allocation_kept
    assert not got["metadata"].get("finalizers")


def _shadow_of_finished_pod(cluster: LocalCluster) -> dict[str, Any]:
    """A classic pod's shadow claim (owned by the pod, not named by it), reserved, then the pod
    finishes."""
    api = cluster.api
    assert api is not None
    classic = api.create(PODS, pod("classic", gates=[GATE]))
    shadow = claim("shadow", finalizer=True)
    shadow["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "classic",
         "uid": classic["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    ]  # fmt: skip
    api.create(RESOURCE_CLAIMS, shadow)
    _reserve(cluster, "shadow", classic)
    _finish(cluster, "classic")
    return classic


def _released_or_untouched(got: dict[str, Any] | None, pod_uid: str) -> bool:
    """docs/design.md F6: the two states kube-controller-manager may leave such a claim in."""
    if got is None or got["metadata"].get("deletionTimestamp"):
        return True  # synced after the pod finished: unreserved, deallocated, deleted
    status = got.get("status") or {}
    return [r.get("uid") for r in status.get("reservedFor") or []] == [pod_uid] and bool(
        status.get("allocation")
    )


def test_shadow_claim_of_a_finished_classic_pod_is_released_or_left_never_half_done(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """docs/design.md F6: the pod does not name the claim, so the pod's own events do not revisit it;
    whether the claim's last sync ran before or after the pod finished decides whether it is still
    reserved. Both orders happen, so both are allowed — a claim dropped from reservedFor but still
    allocated, or deallocated but not deleted while its owner is done, is not."""
    cluster = make_cluster()
    api = cluster.api
    assert api is not None
    classic = _shadow_of_finished_pod(cluster)
    # a marker pod going the same way proves the controller has acted on later events
    api.create(RESOURCE_CLAIMS, claim("marker", finalizer=True))
    marker = api.create(
        PODS, pod("marker", claims=[{"name": "gpu", "resourceClaimName": "marker"}], gates=[GATE])
    )
    _reserve(cluster, "marker", marker)
    _finish(cluster, "marker")
    cluster.wait_for(
        lambda: (
            not (_get(cluster, RESOURCE_CLAIMS, "marker") or {}).get("status", {}).get("allocation")
        )
    )
    uid = classic["metadata"]["uid"]
    cluster.wait_for(lambda: _released_or_untouched(_get(cluster, RESOURCE_CLAIMS, "shadow"), uid))


def test_shadow_claim_of_a_finished_classic_pod_is_released_on_its_next_event(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """Any later event on the claim (here a label) makes the claim controller sync it: the done
    pod leaves reservedFor, the allocation and finalizer go, and — its controller owner being
    done — the claim is deleted. An event the controller handles before its pod informer has seen
    the pod finish changes nothing (the pod's own events do not revisit the claim), so the claim is
    touched again until it goes."""
    cluster = make_cluster()
    api = cluster.api
    assert api is not None
    _shadow_of_finished_pod(cluster)
    touches = itertools.count()

    def released_after_a_touch() -> bool:
        try:
            api.patch(
                RESOURCE_CLAIMS,
                name="shadow",
                namespace=NS,
                patch={"metadata": {"labels": {"touched": str(next(touches))}}},
                patch_type=PatchType.MERGE,
            )
        except ApiNotFoundError:
            return True
        try:
            return cluster.wait_for(lambda: _get(cluster, RESOURCE_CLAIMS, "shadow") is None, 2.0)
        except TimeoutError:
            return False

    cluster.wait_for(released_after_a_touch, timeout=30.0, interval=0.0)


def test_generated_claim_of_a_finished_pod_is_deleted(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster()
    api = cluster.api
    assert api is not None
    api.create(RESOURCE_CLAIM_TEMPLATES, template())
    created = api.create(
        PODS, pod("job", claims=[{"name": "gpu", "resourceClaimTemplateName": "tpl"}], gates=[GATE])
    )
    name = cluster.wait_for(
        lambda: ((_get(cluster, PODS, "job") or {}).get("status", {}).get("resourceClaimStatuses")
                 or [{}])[0].get("resourceClaimName")
    )  # fmt: skip
    generated = _get(cluster, RESOURCE_CLAIMS, name)
    assert generated is not None
    protected = copy.deepcopy(generated)
    protected["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    api.update(RESOURCE_CLAIMS, protected)
    _reserve(cluster, name, created)
    _finish(cluster, "job")
    cluster.wait_for(lambda: _get(cluster, RESOURCE_CLAIMS, name) is None)
    assert _get(cluster, PODS, "job") is not None


def test_claim_being_deleted_loses_its_finalizer_once_unreserved(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster()
    api = cluster.api
    assert api is not None
    api.create(RESOURCE_CLAIMS, claim("standalone", finalizer=True))
    user = api.create(
        PODS, pod("user", claims=[{"name": "gpu", "resourceClaimName": "standalone"}], gates=[GATE])
    )
    _reserve(cluster, "standalone", user)
    api.delete(RESOURCE_CLAIMS, name="standalone", namespace=NS)
    stuck = _get(cluster, RESOURCE_CLAIMS, "standalone")
    assert stuck is not None
    assert "deletionTimestamp" in stuck["metadata"]
    api.delete(PODS, name="user", namespace=NS)
    cluster.wait_for(lambda: _get(cluster, RESOURCE_CLAIMS, "standalone") is None)
