"""Contract: the three patch types (merge, strategic merge, JSON patch) and their failures."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from localcluster.patch import json_patch, merge_patch, strategic_merge_patch
from tests.localcluster.helpers import NS, pod, status_of

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON = "application/json-patch+json"


@pytest.fixture
def core(kube_client: Any) -> Any:
    return client.CoreV1Api(kube_client)


POD: dict[str, Any] = {
    "metadata": {"name": "p", "finalizers": ["a"], "labels": {"x": "1"}},
    "spec": {
        "containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "E", "value": "1"}]},
            {"name": "b", "image": "b:1"},
        ],
        "tolerations": [{"key": "k", "operator": "Exists"}],
    },
    "status": {"conditions": [{"type": "Ready", "status": "False"}]},
}


@pytest.mark.parametrize(
    ("patch", "expected_part", "path"),
    [
        (
            {"spec": {"containers": [{"name": "b", "image": "b:2"}]}},
            [
                {"name": "a", "image": "a:1", "env": [{"name": "E", "value": "1"}]},
                {"name": "b", "image": "b:2"},
            ],
            ("spec", "containers"),
        ),
        (
            {"spec": {"containers": [{"name": "a", "env": [{"name": "F", "value": "2"}]}]}},
            [{"name": "E", "value": "1"}, {"name": "F", "value": "2"}],
            ("spec", "containers", 0, "env"),
        ),
        (
            {"spec": {"containers": [{"name": "a", "$patch": "delete"}]}},
            [{"name": "b", "image": "b:1"}],
            ("spec", "containers"),
        ),
        (
            {"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}},
            [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}],
            ("status", "conditions"),
        ),
        (
            {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
            [{"type": "Ready", "status": "True"}],
            ("status", "conditions"),
        ),
        (
            {"spec": {"tolerations": [{"key": "z", "operator": "Exists"}]}},
            [{"key": "z", "operator": "Exists"}],
            ("spec", "tolerations"),
        ),
        ({"metadata": {"finalizers": ["b"]}}, ["a", "b"], ("metadata", "finalizers")),
        (
            {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}},
            [],
            ("metadata", "finalizers"),
        ),
        (
            {"spec": {"$retainKeys": ["containers"], "tolerations": None}},
            None,
            ("spec", "tolerations"),
        ),
        (
            {"spec": {"containers": [{"$patch": "replace"}, {"name": "c", "image": "c:1"}]}},
            [{"name": "c", "image": "c:1"}],
            ("spec", "containers"),
        ),
        (
            {"metadata": {"$patch": "replace", "name": "p"}},
            {"name": "p"},
            ("metadata",),
        ),
    ],
    ids=[
        "merge-container-by-name",
        "merge-env-by-name",
        "delete-container-directive",
        "append-condition-by-type",
        "replace-condition-by-type",
        "tolerations-replace-whole-list",
        "finalizers-union",
        "delete-from-primitive-list",
        "retain-keys",
        "replace-list-directive",
        "replace-map-directive",
    ],
)
def test_strategic_merge_patch(patch: Any, expected_part: Any, path: tuple[Any, ...]) -> None:
    original = copy.deepcopy(POD)

    result: Any = strategic_merge_patch(POD, patch)

    for step in path:
        result = result.get(step) if isinstance(result, dict) else result[step]
    assert result == expected_part
    assert original == POD  # the stored object is never touched


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ({"a": {"b": None}}, {"a": {}, "l": [1, 2]}),
        ({"l": [3]}, {"a": {"b": 1}, "l": [3]}),
        ({"a": {"c": 2}}, {"a": {"b": 1, "c": 2}, "l": [1, 2]}),
    ],
    ids=["null-deletes", "list-replaces", "map-merges"],
)
def test_merge_patch(patch: Any, expected: Any) -> None:
    assert merge_patch({"a": {"b": 1}, "l": [1, 2]}, patch) == expected


@pytest.mark.parametrize(
    ("operations", "expected"),
    [
        ([{"op": "add", "path": "/l/-", "value": 3}], {"a": {"b": 1}, "l": [1, 2, 3]}),
        ([{"op": "add", "path": "/l/0", "value": 0}], {"a": {"b": 1}, "l": [0, 1, 2]}),
        ([{"op": "remove", "path": "/a/b"}], {"a": {}, "l": [1, 2]}),
        ([{"op": "replace", "path": "/a/b", "value": 5}], {"a": {"b": 5}, "l": [1, 2]}),
        ([{"op": "move", "from": "/a/b", "path": "/c"}], {"a": {}, "l": [1, 2], "c": 1}),
        ([{"op": "copy", "from": "/l", "path": "/m"}], {"a": {"b": 1}, "l": [1, 2], "m": [1, 2]}),
        ([{"op": "test", "path": "/a/b", "value": 1}], {"a": {"b": 1}, "l": [1, 2]}),
        ([{"op": "add", "path": "/a~1b", "value": 1}], {"a": {"b": 1}, "l": [1, 2], "a/b": 1}),
    ],
    ids=["append", "insert", "remove", "replace", "move", "copy", "test", "escaped-pointer"],
)
def test_json_patch(operations: Any, expected: Any) -> None:
    assert json_patch({"a": {"b": 1}, "l": [1, 2]}, operations) == expected


def test_strategic_merge_over_http_merges_containers(core: Any) -> None:
    body = pod("p")
    body["spec"]["containers"].append({"name": "side", "image": "side:1"})
    core.create_namespaced_pod(NS, body)

    patched = core.patch_namespaced_pod(
        "p", NS, {"spec": {"containers": [{"name": "side", "image": "side:2"}]}},
        _content_type=STRATEGIC,
    )  # fmt: skip

    assert [(c.name, c.image) for c in patched.spec.containers] == [
        ("c", "busybox:1"),
        ("side", "side:2"),
    ]


def test_status_conditions_merge_by_type_over_http(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("p"))
    ready = {"type": "Ready", "status": "False"}
    core.patch_namespaced_pod_status("p", NS, {"status": {"conditions": [ready]}})

    patched = core.patch_namespaced_pod_status(
        "p",
        NS,
        {"status": {"conditions": [{"type": "instaslice.dev/Placement", "status": "False"}]}},
    )

    assert [c.type for c in patched.status.conditions] == ["Ready", "instaslice.dev/Placement"]


def test_json_patch_test_failure_is_invalid(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("p"))
    operations = [
        {"op": "test", "path": "/metadata/labels", "value": {"never": "there"}},
        {"op": "add", "path": "/metadata/labels", "value": {"a": "b"}},
    ]

    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod("p", NS, operations, _content_type=JSON)

    assert caught.value.status == 422
    assert core.read_namespaced_pod("p", NS).metadata.labels is None


def test_json_patch_test_guards_a_write(core: Any) -> None:
    created = core.create_namespaced_pod(NS, pod("p"))
    operations = [
        {"op": "test", "path": "/metadata/uid", "value": created.metadata.uid},
        {"op": "add", "path": "/metadata/labels", "value": {"a": "b"}},
    ]

    patched = core.patch_namespaced_pod("p", NS, operations, _content_type=JSON)

    assert patched.metadata.labels == {"a": "b"}


def test_merge_patch_replaces_lists(core: Any) -> None:
    body = pod("p")
    body["spec"]["containers"].append({"name": "side", "image": "side:1"})
    core.create_namespaced_pod(NS, body)

    with pytest.raises(ApiException) as caught:  # dropping a container is a spec change
        core.patch_namespaced_pod(
            "p", NS, {"spec": {"containers": [{"name": "c", "image": "busybox:1"}]}},
            _content_type=MERGE,
        )  # fmt: skip

    assert caught.value.status == 422


def test_apply_patch_is_unsupported_media_type(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("p"))

    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod(
            "p", NS, {"metadata": {"labels": {"a": "b"}}},
            _content_type="application/apply-patch+yaml", field_manager="test",
        )  # fmt: skip

    assert caught.value.status == 415
    assert status_of(caught.value)["reason"] == "UnsupportedMediaType"


def test_patch_of_missing_object_is_not_found(core: Any) -> None:
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod("ghost", NS, {"metadata": {"labels": {"a": "b"}}})

    assert caught.value.status == 404
