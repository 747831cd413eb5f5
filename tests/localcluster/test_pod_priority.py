"""Contract: the ``Priority`` admission plugin gives every new pod its class's priority and
preemption policy, and refuses an unknown class or a priority the pod chose itself, as
kube-apiserver does."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from localcluster.apiserver import LocalApiServer
from tests.localcluster.helpers import NS, pod, status_of
from tests.localcluster.priorities import PODS, call, priority_class


@pytest.fixture
def core(kube_client: Any) -> Any:
    return client.CoreV1Api(kube_client)


@pytest.fixture
def scheduling(kube_client: Any) -> Any:
    api: Any = client.SchedulingV1Api(kube_client)
    api.create_priority_class(priority_class("high", 1000))
    api.create_priority_class(priority_class("polite", 500, preemptionPolicy="Never"))
    api.create_priority_class(priority_class("low", -10))
    return api


def _resolved(created: Any) -> tuple[str | None, int, str]:
    spec = created.spec
    return spec.priority_class_name, spec.priority, spec.preemption_policy


def _forbidden(caught: pytest.ExceptionInfo[ApiException], name: str, why: str) -> None:
    status = status_of(caught.value)
    assert caught.value.status == 403
    assert status["reason"] == "Forbidden"
    assert status["message"] == f'pods "{name}" is forbidden: {why}'
    assert status["details"] == {"name": name, "kind": "pods"}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, (None, 0, "PreemptLowerPriority")),
        ({"priorityClassName": "high"}, ("high", 1000, "PreemptLowerPriority")),
        ({"priorityClassName": "polite"}, ("polite", 500, "Never")),
        ({"priorityClassName": "low"}, ("low", -10, "PreemptLowerPriority")),
        (
            {"priorityClassName": "system-node-critical"},
            ("system-node-critical", 2_000_001_000, "PreemptLowerPriority"),
        ),
        ({"priority": 0}, (None, 0, "PreemptLowerPriority")),
        ({"priorityClassName": "high", "priority": 1000}, ("high", 1000, "PreemptLowerPriority")),
        ({"priorityClassName": "polite", "preemptionPolicy": "Never"}, ("polite", 500, "Never")),
    ],
    ids=[
        "no-class-no-default",
        "class",
        "class-never",
        "negative",
        "system-class",
        "own-priority-equal-to-zero",
        "own-priority-equal-to-class",
        "own-policy-equal-to-class",
    ],
)
def test_a_new_pod_gets_its_class_priority(
    core: Any, scheduling: Any, spec: dict[str, Any], expected: tuple[str | None, int, str]
) -> None:
    created = core.create_namespaced_pod(NS, pod("p", **spec))

    assert _resolved(created) == expected
    assert _resolved(core.read_namespaced_pod("p", NS)) == expected


def test_a_pod_without_a_class_gets_the_global_default(core: Any, scheduling: Any) -> None:
    scheduling.create_priority_class(
        priority_class("batch", 7, globalDefault=True, preemptionPolicy="Never")
    )

    defaulted = core.create_namespaced_pod(NS, pod("plain"))
    named = core.create_namespaced_pod(NS, pod("named", priorityClassName="high"))

    assert _resolved(defaulted) == ("batch", 7, "Never")
    assert _resolved(named) == ("high", 1000, "PreemptLowerPriority")


@pytest.mark.parametrize(
    ("metadata", "name"),
    [({"name": "p"}, "p"), ({"generateName": "web-"}, "web-")],
    ids=["named", "generated-name"],
)
def test_an_unknown_class_is_forbidden(
    core: Any, scheduling: Any, metadata: dict[str, str], name: str
) -> None:
    body = pod(priorityClassName="missing")
    body["metadata"] = metadata

    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, body)

    _forbidden(caught, name, "no PriorityClass with name missing was found")
    assert core.list_namespaced_pod(NS).items == []


_COMPUTED = "must not be provided in pod spec; priority admission controller computed"


@pytest.mark.parametrize(
    ("default", "spec", "why"),
    [
        (
            False,
            {"priority": 100},
            f"the integer value of priority (100) {_COMPUTED} 0 from the given PriorityClass name",
        ),
        (
            False,
            {"priorityClassName": "high", "priority": 5},
            f"the integer value of priority (5) {_COMPUTED} 1000 from the given PriorityClass name",
        ),
        (
            True,
            {"priority": 0},
            f"the integer value of priority (0) {_COMPUTED} 7 from the given PriorityClass name",
        ),
        (
            False,
            {"preemptionPolicy": "Never"},
            f"the string value of PreemptionPolicy (Never) {_COMPUTED} PreemptLowerPriority "
            "from the given PriorityClass name",
        ),
        (
            False,
            {"priorityClassName": "polite", "preemptionPolicy": "PreemptLowerPriority"},
            f"the string value of PreemptionPolicy (PreemptLowerPriority) {_COMPUTED} Never "
            "from the given PriorityClass name",
        ),
    ],
    ids=[
        "priority-without-class",
        "priority-other-than-class",
        "priority-other-than-default",
        "policy-without-class",
        "policy-other-than-class",
    ],
)
def test_a_pod_may_not_choose_its_own_priority(
    core: Any, scheduling: Any, *, default: bool, spec: dict[str, Any], why: str
) -> None:
    """With no class the computed priority is 0 (or the global default's): a pod that sets
    ``spec.priority`` itself is refused unless it happens to match."""
    if default:
        scheduling.create_priority_class(priority_class("batch", 7, globalDefault=True))

    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod("p", **spec))

    _forbidden(caught, "p", why)


def test_a_priority_of_the_wrong_type_is_a_bad_request(apiserver: LocalApiServer) -> None:
    code, status = call(apiserver, "POST", PODS, pod("p", priority="high"))

    assert code == 400
    assert status["message"] == (
        'Pod in version "v1" cannot be handled as a Pod: json: cannot unmarshal string into Go '
        "struct field PodSpec.spec.priority of type int32"
    )


def test_deleting_a_class_leaves_its_pods_priority_alone(core: Any, scheduling: Any) -> None:
    core.create_namespaced_pod(NS, pod("before", priorityClassName="high"))

    scheduling.delete_priority_class("high")

    assert _resolved(core.read_namespaced_pod("before", NS)) == (
        "high",
        1000,
        "PreemptLowerPriority",
    )
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod("after", priorityClassName="high"))
    _forbidden(caught, "after", "no PriorityClass with name high was found")


def test_a_new_global_default_leaves_existing_pods_alone(core: Any, scheduling: Any) -> None:
    core.create_namespaced_pod(NS, pod("before"))

    scheduling.create_priority_class(priority_class("batch", 7, globalDefault=True))

    assert _resolved(core.read_namespaced_pod("before", NS)) == (None, 0, "PreemptLowerPriority")


def test_an_update_without_priority_keeps_it(apiserver: LocalApiServer, core: Any) -> None:
    """The plugin puts back what it set on create when an update leaves it out; changing it is
    the pod spec's immutability at work (422)."""
    core.create_namespaced_pod(NS, pod("p", priorityClassName="system-cluster-critical"))
    stored = core.api_client.sanitize_for_serialization(core.read_namespaced_pod("p", NS))
    del stored["spec"]["priority"], stored["spec"]["preemptionPolicy"]

    code, updated = call(apiserver, "PUT", f"{PODS}/p", stored)
    changed = core.patch_namespaced_pod("p", NS, {"metadata": {"labels": {"a": "b"}}})

    assert code == 200, updated
    assert updated["spec"]["priority"] == 2_000_000_000
    assert updated["spec"]["preemptionPolicy"] == "PreemptLowerPriority"
    assert changed.spec.priority == 2_000_000_000
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod("p", NS, {"spec": {"priority": 1}})
    assert caught.value.status == 422
