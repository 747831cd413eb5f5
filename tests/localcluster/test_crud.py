"""Contract: create/get/list/update/delete semantics over HTTP with the real kubernetes client."""

from __future__ import annotations

import re
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tests.localcluster.helpers import NS, pod, status_of


@pytest.fixture
def core(kube_client: Any) -> Any:
    return client.CoreV1Api(kube_client)


def test_create_sets_server_fields(core: Any) -> None:
    created = core.create_namespaced_pod(NS, pod("p1"))

    assert created.metadata.uid
    assert created.metadata.creation_timestamp is not None
    assert int(created.metadata.resource_version) > 0
    assert created.metadata.generation == 1
    assert created.metadata.namespace == NS
    assert created.status.phase == "Pending"


def test_generate_name_appends_five_random_characters(core: Any) -> None:
    body = pod()
    body["metadata"] = {"generateName": "worker-"}

    first = core.create_namespaced_pod(NS, body)
    second = core.create_namespaced_pod(NS, body)

    assert re.fullmatch(r"worker-[a-z0-9]{5}", first.metadata.name)
    assert first.metadata.name != second.metadata.name


def test_resource_versions_increase_globally(core: Any) -> None:
    a = core.create_namespaced_pod(NS, pod("a"))
    b = core.create_namespaced_config_map(NS, {"metadata": {"name": "b"}, "data": {"k": "v"}})

    assert int(b.metadata.resource_version) > int(a.metadata.resource_version)
    listed = core.list_namespaced_pod(NS)
    assert int(listed.metadata.resource_version) >= int(b.metadata.resource_version)


def test_create_twice_is_already_exists(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("dup"))

    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod("dup"))

    assert caught.value.status == 409
    assert status_of(caught.value)["reason"] == "AlreadyExists"


def test_get_missing_is_not_found(core: Any) -> None:
    with pytest.raises(ApiException) as caught:
        core.read_namespaced_pod("nope", NS)

    status = status_of(caught.value)
    assert caught.value.status == 404
    assert status["reason"] == "NotFound"
    assert status["message"] == 'pods "nope" not found'


def test_stale_update_is_conflict(core: Any) -> None:
    created = core.create_namespaced_pod(NS, pod("stale"))
    created.metadata.labels = {"round": "1"}
    core.replace_namespaced_pod("stale", NS, created)  # moves the resourceVersion on

    created.metadata.labels = {"round": "2"}
    with pytest.raises(ApiException) as caught:
        core.replace_namespaced_pod("stale", NS, created)

    assert caught.value.status == 409
    assert status_of(caught.value)["reason"] == "Conflict"


def test_patch_with_stale_resource_version_is_conflict(core: Any) -> None:
    created = core.create_namespaced_pod(NS, pod("stale-patch"))
    core.patch_namespaced_pod("stale-patch", NS, {"metadata": {"labels": {"a": "1"}}})

    stale = {
        "metadata": {"resourceVersion": created.metadata.resource_version, "labels": {"a": "2"}}
    }
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod("stale-patch", NS, stale)

    assert caught.value.status == 409


def test_update_without_change_keeps_resource_version(core: Any) -> None:
    created = core.create_namespaced_pod(NS, pod("same"))

    again = core.replace_namespaced_pod("same", NS, created)

    assert again.metadata.resource_version == created.metadata.resource_version


def test_generation_bumps_on_spec_change_only(kube_client: Any) -> None:
    apps: Any = client.AppsV1Api(kube_client)
    deployment = {
        "metadata": {"name": "d"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "d"}},
            "template": {
                "metadata": {"labels": {"app": "d"}},
                "spec": {"containers": [{"name": "c", "image": "x:1"}]},
            },
        },
    }
    apps.create_namespaced_deployment(NS, deployment)

    labelled = apps.patch_namespaced_deployment("d", NS, {"metadata": {"labels": {"x": "y"}}})
    scaled = apps.patch_namespaced_deployment("d", NS, {"spec": {"replicas": 3}})

    assert labelled.metadata.generation == 1
    assert scaled.metadata.generation == 2


def test_status_is_written_only_through_status_subresource(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("st"))

    via_main = core.patch_namespaced_pod("st", NS, {"status": {"phase": "Running"}})
    via_status = core.patch_namespaced_pod_status(
        "st", NS, {"status": {"phase": "Running"}, "metadata": {"labels": {"ignored": "yes"}}}
    )

    assert via_main.status.phase == "Pending"
    assert via_status.status.phase == "Running"
    assert not (via_status.metadata.labels or {}).get("ignored")


def test_finalizers_hold_deletion_until_removed(core: Any) -> None:
    body = {"metadata": {"name": "held", "finalizers": ["example.com/hold"]}, "data": {}}
    core.create_namespaced_config_map(NS, body)

    core.delete_namespaced_config_map("held", NS)
    marked = core.read_namespaced_config_map("held", NS)
    assert marked.metadata.deletion_timestamp is not None

    core.patch_namespaced_config_map("held", NS, {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as caught:
        core.read_namespaced_config_map("held", NS)
    assert caught.value.status == 404


def test_no_new_finalizer_on_object_being_deleted(core: Any) -> None:
    body = {"metadata": {"name": "held2", "finalizers": ["example.com/a"]}}
    core.create_namespaced_config_map(NS, body)
    core.delete_namespaced_config_map("held2", NS)

    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_config_map(
            "held2", NS, {"metadata": {"finalizers": ["example.com/a", "example.com/b"]}}
        )

    assert caught.value.status == 422


def test_delete_precondition_on_uid(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("pre"))

    with pytest.raises(ApiException) as caught:
        core.delete_namespaced_pod(
            "pre", NS, body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="x"))
        )

    assert caught.value.status == 409


@pytest.mark.parametrize(
    ("label_selector", "expected"),
    [
        ("app=web", ["a", "b"]),
        ("app==web,tier!=db", ["a"]),
        ("tier in (db, cache)", ["b", "c"]),
        ("tier notin (db)", ["a", "c", "d"]),
        ("tier", ["a", "b", "c"]),
        ("!tier", ["d"]),
    ],
    ids=["equals", "double-equals-and-not", "in", "notin", "exists", "not-exists"],
)
def test_label_selectors(core: Any, label_selector: str, expected: list[str]) -> None:
    labels = {
        "a": {"app": "web", "tier": "front"},
        "b": {"app": "web", "tier": "db"},
        "c": {"tier": "cache"},
        "d": {},
    }
    for name, pod_labels in labels.items():
        body = pod(name)
        body["metadata"]["labels"] = pod_labels
        core.create_namespaced_pod(NS, body)

    listed = core.list_namespaced_pod(NS, label_selector=label_selector)

    assert [p.metadata.name for p in listed.items] == expected


@pytest.mark.parametrize(
    ("field_selector", "expected"),
    [
        ("spec.nodeName=node-1", ["bound"]),
        ("spec.nodeName=", ["unbound"]),
        ("spec.nodeName!=node-1", ["unbound"]),
        ("metadata.name=unbound", ["unbound"]),
        ("status.phase=Pending", ["bound", "unbound"]),
    ],
    ids=["node", "no-node", "not-node", "name", "phase"],
)
def test_pod_field_selectors(core: Any, field_selector: str, expected: list[str]) -> None:
    core.create_namespaced_pod(NS, pod("bound", nodeName="node-1"))
    core.create_namespaced_pod(NS, pod("unbound"))

    listed = core.list_pod_for_all_namespaces(field_selector=field_selector)

    assert sorted(p.metadata.name for p in listed.items) == expected


def test_unsupported_field_selector_is_bad_request(core: Any) -> None:
    with pytest.raises(ApiException) as caught:
        core.list_namespaced_config_map(NS, field_selector="data.x=y")

    assert caught.value.status == 400


def test_namespaces_isolate_objects(core: Any) -> None:
    core.create_namespace({"metadata": {"name": "other"}})
    core.create_namespaced_pod(NS, pod("same-name"))
    core.create_namespaced_pod("other", pod("same-name"))

    assert len(core.list_namespaced_pod("other").items) == 1
    assert len(core.list_pod_for_all_namespaces().items) == 2


def test_limit_pages_with_a_continue_token_as_kube_does(core: Any) -> None:
    for i in range(3):
        core.create_namespaced_pod(NS, pod(f"p{i}"))

    first = core.list_namespaced_pod(NS, limit=2)
    rest = core.list_namespaced_pod(NS, limit=2, _continue=first.metadata._continue)

    assert [p.metadata.name for p in first.items] == ["p0", "p1"]
    assert first.metadata._continue
    assert [p.metadata.name for p in rest.items] == ["p2"]
    assert not rest.metadata._continue
    assert rest.metadata.resource_version == first.metadata.resource_version


def _core_event(namespace: str, involved_namespace: str | None) -> dict[str, Any]:
    involved = {"kind": "Pod", "name": "p", "apiVersion": "v1"}
    if involved_namespace is not None:
        involved["namespace"] = involved_namespace
    return {
        "metadata": {"generateName": "p."},
        "involvedObject": involved,
        "reason": "Placed",
        "message": "placed",
        "type": "Normal",
        "source": {"component": "test"},
    }


@pytest.mark.parametrize(
    ("namespace", "involved_namespace", "accepted"),
    [(NS, NS, True), ("other", NS, False), (NS, None, True), ("other", None, False)],
    ids=[
        "same-namespace",
        "other-namespace",
        "cluster-object-in-default",
        "cluster-object-elsewhere",
    ],
)
def test_core_event_namespace_must_match_its_object(
    core: Any, namespace: str, involved_namespace: str | None, accepted: bool
) -> None:
    core.create_namespace({"metadata": {"name": "other"}})

    try:
        core.create_namespaced_event(namespace, _core_event(namespace, involved_namespace))
        status = 201
    except ApiException as exc:
        status = exc.status

    assert status == (201 if accepted else 422)


def test_new_style_event_needs_its_required_fields(kube_client: Any) -> None:
    events: Any = client.EventsV1Api(kube_client)
    complete = {
        "metadata": {"name": "e1"},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "regarding": {"kind": "Pod", "name": "p", "namespace": NS, "apiVersion": "v1"},
        "reason": "Placed",
        "note": "placed",
        "type": "Normal",
        "action": "Allocate",
        "reportingController": "instaslice.dev/controller",
        "reportingInstance": "controller-0",
    }
    events.create_namespaced_event(NS, complete)
    incomplete = {k: v for k, v in complete.items() if k not in ("action", "reportingInstance")}
    incomplete["metadata"] = {"name": "e2"}

    with pytest.raises(ApiException) as caught:
        events.create_namespaced_event(NS, incomplete)

    assert caught.value.status == 422
    assert "action: Required value" in status_of(caught.value)["message"]


def test_delete_collection_by_label(core: Any) -> None:
    for name, tier in (("a", "x"), ("b", "x"), ("c", "y")):
        body = pod(name)
        body["metadata"]["labels"] = {"tier": tier}
        core.create_namespaced_pod(NS, body)

    core.delete_collection_namespaced_pod(NS, label_selector="tier=x")

    assert [p.metadata.name for p in core.list_namespaced_pod(NS).items] == ["c"]
