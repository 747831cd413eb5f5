"""Classic ``nvidia.com/mig-<profile>: N`` pods: shadow claims owned by the pod, allocated with
``reservedFor`` the pod (docs/design.md F6), the pod pinned by ``nodeSelector`` while gated, then
ungated; and shadow claims of finished pods released by us."""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from api.names import (
    DELETE_PROTECTION_FINALIZER,
    SHADOW_CLAIM_CONTAINER_ANNOTATION,
    SHADOW_CLAIM_LABEL,
    SHADOW_CLAIM_PROFILE_LABEL,
    profile_device_class,
)
from controller.classic import shadow
from driver.cluster.kube import KubeClusterApi
from driver.cluster.port import PODS, RESOURCE_CLAIMS, JsonObject
from localcluster.apiserver import LocalApiServer
from tests.controller.harness import (
    NS,
    assert_no_overlap,
    cluster_api,
    get_pod,
    pod_object,
    publish_node,
    start_controller,
    ungated,
    wait_for,
)


@pytest.fixture
def api(apiserver: LocalApiServer, stack: ExitStack) -> KubeClusterApi:
    api = cluster_api(apiserver, stack)
    publish_node(api, "node-a", gpus=1, labels={"kubernetes.io/hostname": "host-a"})
    return api


def _shadow_claims(api: KubeClusterApi, pod: JsonObject) -> list[JsonObject]:
    return api.list_objects(
        RESOURCE_CLAIMS,
        namespace=NS,
        label_selector=f"{SHADOW_CLAIM_LABEL}={pod['metadata']['uid']}",
    ).items


def test_classic_pod_gets_shadow_claims_a_node_selector_and_is_ungated(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    pod = pod_object("classic", classic={"nvidia.com/mig-1g.5gb": 2})
    pod["spec"]["initContainers"] = [
        {
            "name": "warmup",
            "image": "busybox:1",
            "resources": {"limits": {"nvidia.com/mig-1g.5gb-me": "1"}},
        }
    ]
    api.create(PODS, pod, namespace=NS)
    start_controller(apiserver, stack)

    wait_for(lambda: ungated(api, "classic"), what="classic pod ungated")
    placed = get_pod(api, "classic")
    assert placed["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "host-a"}
    claims = {
        c["metadata"]["annotations"][SHADOW_CLAIM_CONTAINER_ANNOTATION]: c
        for c in _shadow_claims(api, placed)
    }
    assert set(claims) == {"main", "warmup"}
    main, warmup = claims["main"], claims["warmup"]
    assert main["metadata"]["labels"][SHADOW_CLAIM_PROFILE_LABEL] == "1g.5gb"
    assert warmup["metadata"]["labels"][SHADOW_CLAIM_PROFILE_LABEL] == "1g.5gb_me"
    assert warmup["metadata"]["annotations"][SHADOW_CLAIM_PROFILE_LABEL] == "1g.5gb+me"
    (owner,) = main["metadata"]["ownerReferences"]
    assert owner["uid"] == placed["metadata"]["uid"]
    assert owner["controller"] is True
    assert owner["blockOwnerDeletion"] is True
    (req,) = main["spec"]["devices"]["requests"]
    assert req["exactly"]["deviceClassName"] == profile_device_class("1g.5gb")
    assert req["exactly"]["count"] == 2
    for claim in (main, warmup):
        assert DELETE_PROTECTION_FINALIZER in claim["metadata"]["finalizers"]
        assert claim["status"]["allocation"]["allocationTimestamp"]
        assert claim["status"]["reservedFor"] == [
            {"resource": "pods", "name": "classic", "uid": placed["metadata"]["uid"]}
        ]
    assert len(main["status"]["allocation"]["devices"]["results"]) == 2
    assert assert_no_overlap(api) == 3


def test_shadow_claims_are_created_once_however_often_we_retry(api: KubeClusterApi) -> None:
    created = api.create(
        PODS, pod_object("twice", classic={"nvidia.com/mig-2g.10gb": 1}), namespace=NS
    )
    requests = shadow.classic_requests(created, profiles={"nvidia.com/mig-2g.10gb": "2g.10gb"})
    first = shadow.ensure_shadow_claims(api, created, requests, cached=lambda ns, name: None)
    second = shadow.ensure_shadow_claims(api, created, requests, cached=lambda ns, name: None)
    assert [c["metadata"]["uid"] for c in first] == [c["metadata"]["uid"] for c in second]
    assert len(_shadow_claims(api, created)) == 1


def test_a_finished_classic_pod_has_its_shadow_claims_released(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    api.create(PODS, pod_object("job", classic={"nvidia.com/mig-7g.40gb": 1}), namespace=NS)
    api.create(PODS, pod_object("next", classic={"nvidia.com/mig-7g.40gb": 1}), namespace=NS)
    start_controller(apiserver, stack)
    wait_for(lambda: ungated(api, "job") != ungated(api, "next"), what="one of two placed")
    done, waiting = ("job", "next") if ungated(api, "job") else ("next", "job")

    pod = get_pod(api, done)
    api.update_status(PODS, {**pod, "status": {**pod.get("status", {}), "phase": "Succeeded"}})
    wait_for(
        lambda: not any(c.get("status", {}).get("allocation") for c in _shadow_claims(api, pod)),
        what="the finished pod's shadow claim released",
    )
    wait_for(lambda: ungated(api, waiting), what="the freed GPU reused")
    assert assert_no_overlap(api) == 1
