"""Contract: ownerReference garbage collection, deletion propagation, namespace cleanup."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from localcluster.apiserver import LocalApiServer
from tests.localcluster.helpers import NS, claim, eventually, pod

FINALIZER = "resource.kubernetes.io/delete-protection"


@pytest.fixture
def core(kube_client: Any) -> Any:
    return client.CoreV1Api(kube_client)


@pytest.fixture
def resource_api(kube_client: Any) -> Any:
    return client.ResourceV1Api(kube_client)


def _exists(read: Any, *args: Any) -> bool:
    try:
        read(*args)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _owner(obj: Any, api_version: str, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": obj.metadata.name, "uid": obj.metadata.uid},
    }


def test_deleting_a_pod_collects_the_claims_it_owns(
    apiserver: LocalApiServer, core: Any, resource_api: Any
) -> None:
    owner = core.create_namespaced_pod(NS, pod("p"))
    resource_api.create_namespaced_resource_claim(
        NS, claim("shadow", owner=_owner(owner, "v1", "Pod"))
    )
    resource_api.create_namespaced_resource_claim(NS, claim("standalone"))

    core.delete_namespaced_pod("p", NS)
    assert apiserver.settle()

    assert not _exists(resource_api.read_namespaced_resource_claim, "shadow", NS)
    assert _exists(resource_api.read_namespaced_resource_claim, "standalone", NS)


def test_collected_claim_with_finalizer_waits_for_it(
    apiserver: LocalApiServer, core: Any, resource_api: Any
) -> None:
    owner = core.create_namespaced_pod(NS, pod("p"))
    body = claim("shadow", owner=_owner(owner, "v1", "Pod"))
    body["metadata"]["finalizers"] = [FINALIZER]
    resource_api.create_namespaced_resource_claim(NS, body)

    core.delete_namespaced_pod("p", NS)
    assert apiserver.settle()
    held = resource_api.read_namespaced_resource_claim("shadow", NS)
    resource_api.patch_namespaced_resource_claim(
        "shadow", NS, [{"op": "remove", "path": "/metadata/finalizers"}],
        _content_type="application/json-patch+json",
    )  # fmt: skip

    assert held.metadata.deletion_timestamp is not None
    assert not _exists(resource_api.read_namespaced_resource_claim, "shadow", NS)


def test_dependent_of_an_owner_already_gone_is_collected(
    apiserver: LocalApiServer, resource_api: Any
) -> None:
    ghost = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gone", "uid": "no-such-uid"}}

    resource_api.create_namespaced_resource_claim(NS, claim("orphan", owner=ghost))
    assert apiserver.settle()

    assert not _exists(resource_api.read_namespaced_resource_claim, "orphan", NS)


def test_dependent_with_a_remaining_owner_loses_only_the_dead_reference(
    apiserver: LocalApiServer, core: Any
) -> None:
    first = core.create_namespaced_pod(NS, pod("first"))
    second = core.create_namespaced_pod(NS, pod("second"))
    refs = [
        {"apiVersion": "v1", "kind": "Pod", "name": p.metadata.name, "uid": p.metadata.uid}
        for p in (first, second)
    ]
    core.create_namespaced_config_map(NS, {"metadata": {"name": "shared", "ownerReferences": refs}})

    core.delete_namespaced_pod("first", NS)
    assert apiserver.settle()

    kept = core.read_namespaced_config_map("shared", NS)
    assert [r.name for r in kept.metadata.owner_references] == ["second"]


def test_orphan_propagation_keeps_dependents(apiserver: LocalApiServer, core: Any) -> None:
    owner = core.create_namespaced_config_map(NS, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.create_namespaced_config_map(NS, {"metadata": {"name": "dep", "ownerReferences": [ref]}})

    core.delete_namespaced_config_map("owner", NS, propagation_policy="Orphan")
    assert apiserver.settle()

    assert not _exists(core.read_namespaced_config_map, "owner", NS)
    assert core.read_namespaced_config_map("dep", NS).metadata.owner_references is None


def test_foreground_propagation_deletes_dependents_first(
    apiserver: LocalApiServer, core: Any
) -> None:
    owner = core.create_namespaced_config_map(NS, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    dependent = {"metadata": {"name": "dep", "ownerReferences": [ref], "finalizers": ["x/y"]}}
    core.create_namespaced_config_map(NS, dependent)

    core.delete_namespaced_config_map("owner", NS, propagation_policy="Foreground")
    assert apiserver.settle()
    owner_while_dependent_held = _exists(core.read_namespaced_config_map, "owner", NS)
    core.patch_namespaced_config_map("dep", NS, {"metadata": {"finalizers": None}})
    assert apiserver.settle()

    assert owner_while_dependent_held
    assert not _exists(core.read_namespaced_config_map, "dep", NS)
    assert not _exists(core.read_namespaced_config_map, "owner", NS)


def test_collection_cascades_through_owner_chains(
    apiserver: LocalApiServer, kube_client: Any
) -> None:
    apps: Any = client.AppsV1Api(kube_client)
    core: Any = client.CoreV1Api(kube_client)
    spec = {
        "selector": {"matchLabels": {"a": "b"}},
        "template": {"metadata": {"labels": {"a": "b"}}, "spec": pod()["spec"]},
    }
    deployment = apps.create_namespaced_deployment(NS, {"metadata": {"name": "d"}, "spec": spec})
    rs_meta = {
        "name": "d-1",
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": "d",
                "uid": deployment.metadata.uid,
            }
        ],
    }
    replica_set = apps.create_namespaced_replica_set(NS, {"metadata": rs_meta, "spec": spec})
    child = pod("d-1-x")
    child["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": "d-1",
            "uid": replica_set.metadata.uid,
        }
    ]
    core.create_namespaced_pod(NS, child)

    apps.delete_namespaced_deployment("d", NS)

    eventually(lambda: not _exists(core.read_namespaced_pod, "d-1-x", NS))
    assert not _exists(apps.read_namespaced_replica_set, "d-1", NS)


def test_deleting_a_namespace_deletes_its_contents(apiserver: LocalApiServer, core: Any) -> None:
    core.create_namespace({"metadata": {"name": "doomed"}})
    core.create_namespaced_pod("doomed", pod("p"))
    core.create_namespaced_config_map("doomed", {"metadata": {"name": "cm"}})

    core.delete_namespace("doomed")

    eventually(lambda: not _exists(core.read_namespace, "doomed"))
    assert core.list_namespaced_pod("doomed").items == []


def test_no_new_content_in_a_terminating_namespace(core: Any) -> None:
    core.create_namespace({"metadata": {"name": "closing"}})
    core.create_namespaced_config_map(
        "closing", {"metadata": {"name": "held", "finalizers": ["x/y"]}}
    )
    core.delete_namespace("closing")

    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod("closing", pod("late"))

    assert caught.value.status == 403
    assert core.read_namespace("closing").status.phase == "Terminating"
