"""Contract: pod rules — scheduling gates, nodeSelector while gated, immutable spec, binding."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from localcluster.apiserver import LocalApiServer
from localcluster.testing import api_client, close_client
from tests.localcluster.helpers import NS, pod, status_of

GATE = "instaslice.dev/placement"


@pytest.fixture
def core(kube_client: Any) -> Any:
    return client.CoreV1Api(kube_client)


def _binding(node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Binding", "target": {"kind": "Node", "name": node}}


def _bind(core: Any, name: str, node: str) -> int:
    response = core.create_namespaced_pod_binding(
        name, NS, _binding(node) | {"metadata": {"name": name}}, _preload_content=False
    )
    response.read()
    response.release_conn()
    return int(response.status)


def _invalid(caught: pytest.ExceptionInfo[ApiException]) -> str:
    status = status_of(caught.value)
    assert caught.value.status == 422
    assert status["reason"] == "Invalid"
    return str(status["message"])


def test_gate_cannot_be_added_after_creation(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("p"))

    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod("p", NS, {"spec": {"schedulingGates": [{"name": GATE}]}})

    assert "only deletion is allowed" in _invalid(caught)


def test_gate_cannot_be_added_by_replace_either(core: Any) -> None:
    created = core.create_namespaced_pod(NS, pod("p", gates=["a"]))
    created.spec.scheduling_gates.append(client.V1PodSchedulingGate(name="b"))

    with pytest.raises(ApiException) as caught:
        core.replace_namespaced_pod("p", NS, created)

    assert "found new scheduling gate 'b'" in _invalid(caught)


@pytest.mark.parametrize(
    ("patch", "content_type"),
    [
        ({"spec": {"schedulingGates": [{"$patch": "delete", "name": GATE}]}}, "strategic"),
        ([{"op": "remove", "path": "/spec/schedulingGates/0"}], "json"),
        ({"spec": {"schedulingGates": None}}, "merge"),
    ],
    ids=["strategic-delete-directive", "json-patch-remove", "merge-patch-null"],
)
def test_gate_can_be_removed(core: Any, patch: Any, content_type: str) -> None:
    core.create_namespaced_pod(NS, pod("p", gates=[GATE]))
    types = {
        "strategic": "application/strategic-merge-patch+json",
        "json": "application/json-patch+json",
        "merge": "application/merge-patch+json",
    }

    ungated = core.patch_namespaced_pod("p", NS, patch, _content_type=types[content_type])

    assert ungated.spec.scheduling_gates is None


def test_node_selector_may_be_added_while_gated(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("p", gates=[GATE]))

    patched = core.patch_namespaced_pod("p", NS, {"spec": {"nodeSelector": {"node": "n1"}}})

    assert patched.spec.node_selector == {"node": "n1"}


def test_node_selector_entries_cannot_change_while_gated(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("p", gates=[GATE], nodeSelector={"node": "n1"}))

    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod("p", NS, {"spec": {"nodeSelector": {"node": "n2"}}})

    assert "spec.nodeSelector" in _invalid(caught)


def test_node_selector_cannot_change_once_ungated(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("p"))

    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod("p", NS, {"spec": {"nodeSelector": {"node": "n1"}}})

    assert "pod updates may not change fields" in _invalid(caught)


def test_node_name_cannot_be_set_by_update(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("p"))

    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod("p", NS, {"spec": {"nodeName": "n1"}})

    assert "pod updates may not change fields" in _invalid(caught)


def test_container_image_may_change(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("p"))

    patched = core.patch_namespaced_pod(
        "p", NS, {"spec": {"containers": [{"name": "c", "image": "busybox:2"}]}}
    )

    assert patched.spec.containers[0].image == "busybox:2"


def test_pod_without_containers_is_invalid(core: Any) -> None:
    body = pod("p")
    body["spec"]["containers"] = []

    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, body)

    assert "spec.containers: Required value" in _invalid(caught)


def test_gated_pod_cannot_be_created_with_a_node_name(core: Any) -> None:
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod("p", gates=[GATE], nodeName="node-1"))

    assert "spec.nodeName: Forbidden" in _invalid(caught)


def test_binding_sets_node_name_and_scheduled_condition(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("p"))

    code = _bind(core, "p", "node-1")

    bound = core.read_namespaced_pod("p", NS)
    assert code == 201
    assert bound.spec.node_name == "node-1"
    assert [(c.type, c.status) for c in bound.status.conditions] == [("PodScheduled", "True")]


def test_binding_clears_the_nominated_node(core: Any) -> None:
    """ClearingNominatedNodeNameAfterBinding (beta, on by default since 1.35)."""
    core.create_namespaced_pod(NS, pod("p"))
    core.patch_namespaced_pod_status("p", NS, {"status": {"nominatedNodeName": "node-1"}})
    assert core.read_namespaced_pod("p", NS).status.nominated_node_name == "node-1"

    _bind(core, "p", "node-1")

    assert core.read_namespaced_pod("p", NS).status.nominated_node_name is None


def test_binding_a_bound_pod_is_conflict(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("p"))
    _bind(core, "p", "node-1")

    with pytest.raises(ApiException) as caught:
        _bind(core, "p", "node-2")

    assert caught.value.status == 409
    assert "already assigned" in status_of(caught.value)["message"]


def test_binding_a_gated_pod_is_refused(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("p", gates=[GATE]))

    with pytest.raises(ApiException) as caught:
        _bind(core, "p", "node-1")

    assert caught.value.status == 500
    assert "schedulingGates" in status_of(caught.value)["message"]
    assert core.read_namespaced_pod("p", NS).spec.node_name is None


def test_legacy_bindings_resource(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("p"))

    response = core.create_namespaced_binding(
        NS, _binding("node-3") | {"metadata": {"name": "p"}}, _preload_content=False
    )
    response.read()
    response.release_conn()

    assert core.read_namespaced_pod("p", NS).spec.node_name == "node-3"


def test_bound_pod_deletion_waits_for_the_kubelet_when_graceful() -> None:
    with LocalApiServer(graceful_pod_deletion=True) as server:
        api = api_client(server)
        try:
            core: Any = client.CoreV1Api(api)
            core.create_namespaced_pod(NS, pod("p", nodeName="node-1"))

            core.delete_namespaced_pod("p", NS)
            terminating = core.read_namespaced_pod("p", NS)
            core.delete_namespaced_pod("p", NS, grace_period_seconds=0)  # what a kubelet does
            with pytest.raises(ApiException) as caught:
                core.read_namespaced_pod("p", NS)
        finally:
            close_client(api)

    assert terminating.metadata.deletion_timestamp is not None
    assert terminating.metadata.deletion_grace_period_seconds == 30
    assert caught.value.status == 404


def test_pod_deletion_returns_the_object(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("p"))

    response = core.delete_namespaced_pod("p", NS, _preload_content=False)
    deleted = json.loads(response.data)

    assert deleted["metadata"]["name"] == "p"
