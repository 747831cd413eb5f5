"""Contract: ``scheduling.k8s.io/v1`` PriorityClasses served, defaulted and validated as
kube-apiserver does, with its two system classes created at start."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from localcluster.apiserver import LocalApiServer
from tests.localcluster.helpers import status_of, watch_events
from tests.localcluster.priorities import CLASSES, SYSTEM_CLASSES, call, priority_class


@pytest.fixture
def scheduling(kube_client: Any) -> Any:
    return client.SchedulingV1Api(kube_client)


def _refusal(caught: pytest.ExceptionInfo[ApiException], code: int) -> dict[str, Any]:
    assert caught.value.status == code
    return status_of(caught.value)


# --- served ---------------------------------------------------------------------------------------


def test_the_system_classes_exist_from_the_start(scheduling: Any) -> None:
    listed = {pc.metadata.name: pc for pc in scheduling.list_priority_class().items}

    assert {name: pc.value for name, pc in listed.items()} == SYSTEM_CLASSES
    for pc in listed.values():
        assert pc.preemption_policy == "PreemptLowerPriority"
        assert not pc.global_default
        assert pc.description.startswith("Used for system critical pods")


def test_discovery_lists_priorityclasses_cluster_scoped(apiserver: LocalApiServer) -> None:
    _, groups = call(apiserver, "GET", "/apis")
    _, resources = call(apiserver, "GET", "/apis/scheduling.k8s.io/v1")

    assert "scheduling.k8s.io" in [g["name"] for g in groups["groups"]]
    (entry,) = resources["resources"]
    assert entry["name"] == "priorityclasses"
    assert entry["kind"] == "PriorityClass"
    assert entry["namespaced"] is False
    assert entry["shortNames"] == ["pc"]
    assert {"create", "get", "list", "watch", "update", "patch", "delete"} <= set(entry["verbs"])


def test_create_get_update_patch_delete(scheduling: Any) -> None:
    created = scheduling.create_priority_class(priority_class("batch", 100, description="jobs"))
    assert created.metadata.generation == 1
    assert created.metadata.namespace is None

    got = scheduling.read_priority_class("batch")
    got.description = "batch jobs"
    updated = scheduling.replace_priority_class("batch", got)
    patched = scheduling.patch_priority_class("batch", {"metadata": {"labels": {"tier": "low"}}})
    scheduling.delete_priority_class("batch")

    assert updated.description == "batch jobs"
    assert patched.metadata.labels == {"tier": "low"}
    assert patched.value == 100
    with pytest.raises(ApiException) as caught:
        scheduling.read_priority_class("batch")
    assert _refusal(caught, 404)["message"] == (
        'priorityclasses.scheduling.k8s.io "batch" not found'
    )


def test_a_watch_sees_classes_come_and_go(scheduling: Any) -> None:
    listed = scheduling.list_priority_class()
    scheduling.create_priority_class(priority_class("batch", 100))
    scheduling.delete_priority_class("batch")

    events = watch_events(
        scheduling.list_priority_class,
        resource_version=listed.metadata.resource_version,
        timeout_seconds=2,
    )
    seen = [(e["type"], e["object"].metadata.name) for e in events]

    assert seen == [("ADDED", "batch"), ("DELETED", "batch")]


# --- defaults -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            priority_class("plain", 5),
            {"value": 5, "preemptionPolicy": "PreemptLowerPriority"},
        ),
        (
            priority_class("no-value", None),
            {"value": 0, "preemptionPolicy": "PreemptLowerPriority"},
        ),
        (
            {**priority_class("nulls", None), "value": None, "preemptionPolicy": None},
            {"value": 0, "preemptionPolicy": "PreemptLowerPriority"},
        ),
        (
            priority_class("polite", -10, preemptionPolicy="Never", globalDefault=False),
            {"value": -10, "preemptionPolicy": "Never"},
        ),
        (
            priority_class("described", 1, description="", globalDefault=True),
            {"value": 1, "preemptionPolicy": "PreemptLowerPriority", "globalDefault": True},
        ),
    ],
    ids=["value-given", "value-absent-is-zero", "nulls", "never-negative", "default-true"],
)
def test_defaults_as_decoding_gives_them(
    apiserver: LocalApiServer, body: dict[str, Any], expected: dict[str, Any]
) -> None:
    """``value`` is a plain int32 (absent means 0), ``preemptionPolicy`` defaults, a false
    ``globalDefault`` and an empty ``description`` are left out (``omitempty``)."""
    code, created = call(apiserver, "POST", CLASSES, body)

    assert code == 201, created
    fields = {k: v for k, v in created.items() if k not in ("apiVersion", "kind", "metadata")}
    assert fields == expected


# --- validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        priority_class("highest-user", 1_000_000_000),
        priority_class("lowest", -(2**31)),
        priority_class("zero", 0, preemptionPolicy="PreemptLowerPriority"),
        priority_class("a.b-c", 1),
    ],
    ids=["one-billion", "int32-min", "explicit-policy", "subdomain-name"],
)
def test_valid_classes_are_created(scheduling: Any, body: dict[str, Any]) -> None:
    created = scheduling.create_priority_class(body)

    assert created.metadata.name == body["metadata"]["name"]


_RESERVED = (
    "Forbidden: priority class names with 'system-' prefix are reserved for system use only."
)


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        (
            priority_class("too-high", 1_000_000_001),
            "value",
            "Forbidden: maximum allowed value of a user defined priority is 1000000000",
        ),
        (
            priority_class("system-mine", 10),
            "metadata.name",
            f"{_RESERVED} error: system-mine is not a known system priority class",
        ),
        (
            priority_class("system-node-critical", 7),
            "metadata.name",
            f"{_RESERVED} error: value of system-node-critical PriorityClass must be 2000001000",
        ),
        (
            priority_class("system-cluster-critical", 2_000_000_000, globalDefault=True),
            "metadata.name",
            f"{_RESERVED} error: globalDefault of system-cluster-critical PriorityClass must "
            "be false",
        ),
        (
            priority_class("odd", 1, preemptionPolicy="Sometimes"),
            "preemptionPolicy",
            'Unsupported value: "Sometimes": supported values: "PreemptLowerPriority", "Never"',
        ),
        (
            priority_class("blank", 1, preemptionPolicy=""),
            "preemptionPolicy",
            "Required value",
        ),
        (
            priority_class("Upper", 1),
            "metadata.name",
            'Invalid value: "Upper": a lowercase RFC 1123 subdomain must consist of lower case '
            "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
            "character (at most 253 characters)",
        ),
    ],
    ids=[
        "user-above-one-billion",
        "system-prefix-unknown",
        "system-class-wrong-value",
        "system-class-global-default",
        "policy-unsupported",
        "policy-empty",
        "name-not-subdomain",
    ],
)
def test_invalid_classes_are_refused(
    apiserver: LocalApiServer, body: dict[str, Any], field: str, message: str
) -> None:
    code, status = call(apiserver, "POST", CLASSES, body)

    assert code == 422
    assert status["reason"] == "Invalid"
    name = body["metadata"]["name"]
    assert status["message"] == (
        f'PriorityClass.scheduling.k8s.io "{name}" is invalid: {field}: {message}'
    )
    assert status["details"]["group"] == "scheduling.k8s.io"
    assert [(c["field"], c["message"]) for c in status["details"]["causes"]] == [(field, message)]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"value": "high"}, "cannot unmarshal string into Go struct field PriorityClass.value"),
        ({"value": 1.5}, "cannot unmarshal number 1.5 into Go struct field PriorityClass.value"),
        (
            {"value": 2**31},
            "cannot unmarshal number 2147483648 into Go struct field PriorityClass.value",
        ),
        ({"value": True}, "cannot unmarshal bool into Go struct field PriorityClass.value"),
        (
            {"value": 1, "globalDefault": "yes"},
            "cannot unmarshal string into Go struct field PriorityClass.globalDefault of type bool",
        ),
        (
            {"value": 1, "preemptionPolicy": 1},
            "cannot unmarshal number 1 into Go struct field PriorityClass.preemptionPolicy of "
            "type v1.PreemptionPolicy",
        ),
    ],
    ids=[
        "value-string",
        "value-float",
        "value-beyond-int32",
        "value-bool",
        "default-string",
        "policy-number",
    ],
)
def test_fields_of_the_wrong_type_are_bad_requests(
    apiserver: LocalApiServer, fields: dict[str, Any], message: str
) -> None:
    code, status = call(apiserver, "POST", CLASSES, {**priority_class("typed", None), **fields})

    assert code == 400
    assert status["reason"] == "BadRequest"
    assert status["message"].startswith(
        'PriorityClass in version "v1" cannot be handled as a PriorityClass: json: '
    )
    assert message in status["message"]


@pytest.mark.parametrize(
    ("patch", "field", "message"),
    [
        ({"value": 2000}, "value", "Forbidden: may not be changed in an update."),
        (
            {"preemptionPolicy": "Never"},
            "preemptionPolicy",
            'Invalid value: "Never": field is immutable',
        ),
    ],
    ids=["value", "preemption-policy"],
)
def test_value_and_preemption_policy_are_immutable(
    scheduling: Any, patch: dict[str, Any], field: str, message: str
) -> None:
    scheduling.create_priority_class(priority_class("batch", 1000))

    with pytest.raises(ApiException) as caught:
        scheduling.patch_priority_class("batch", patch)

    status = _refusal(caught, 422)
    assert status["message"] == (
        f'PriorityClass.scheduling.k8s.io "batch" is invalid: {field}: {message}'
    )


def test_an_update_does_not_repeat_the_create_rules(scheduling: Any) -> None:
    """kube validates an update for immutability only: a system class may become the global
    default, which its create rules forbid."""
    patched = scheduling.patch_priority_class("system-node-critical", {"globalDefault": True})

    assert patched.global_default is True


# --- one global default ---------------------------------------------------------------------------


def test_a_second_global_default_is_forbidden(scheduling: Any) -> None:
    scheduling.create_priority_class(priority_class("first", 10, globalDefault=True))

    with pytest.raises(ApiException) as caught:
        scheduling.create_priority_class(priority_class("second", 20, globalDefault=True))

    status = _refusal(caught, 403)
    assert status["reason"] == "Forbidden"
    assert status["message"] == (
        'priorityclasses.scheduling.k8s.io "second" is forbidden: PriorityClass first is '
        "already marked as default. Only one default can exist"
    )
    assert status["details"] == {
        "name": "second",
        "group": "scheduling.k8s.io",
        "kind": "priorityclasses",
    }


def test_marking_another_class_default_is_forbidden(scheduling: Any) -> None:
    scheduling.create_priority_class(priority_class("first", 10, globalDefault=True))
    scheduling.create_priority_class(priority_class("other", 20))

    with pytest.raises(ApiException) as caught:
        scheduling.patch_priority_class("other", {"globalDefault": True})

    assert "PriorityClass first is already marked as default" in _refusal(caught, 403)["message"]


def test_the_default_class_itself_may_be_updated_and_handed_over(scheduling: Any) -> None:
    scheduling.create_priority_class(priority_class("first", 10, globalDefault=True))
    scheduling.create_priority_class(priority_class("other", 20))

    described = scheduling.patch_priority_class("first", {"description": "the default"})
    scheduling.patch_priority_class("first", {"globalDefault": False})
    handed = scheduling.patch_priority_class("other", {"globalDefault": True})

    assert described.global_default is True
    assert handed.global_default is True
    assert not scheduling.read_priority_class("first").global_default


def test_an_invalid_second_default_is_invalid_before_it_is_forbidden(
    apiserver: LocalApiServer, scheduling: Any
) -> None:
    """kube validates the class before the admission plugin's one-default check."""
    scheduling.create_priority_class(priority_class("first", 10, globalDefault=True))

    code, status = call(
        apiserver, "POST", CLASSES, priority_class("too-high", 2_000_000_000, globalDefault=True)
    )

    assert (code, status["reason"]) == (422, "Invalid")


# --- deletion -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SYSTEM_CLASSES))
def test_a_system_class_cannot_be_deleted(scheduling: Any, name: str) -> None:
    with pytest.raises(ApiException) as caught:
        scheduling.delete_priority_class(name)

    status = _refusal(caught, 403)
    assert status["message"] == (
        f'priorityclasses.scheduling.k8s.io "{name}" is forbidden: this is a system priority '
        "class and cannot be deleted"
    )
    assert scheduling.read_priority_class(name).value == SYSTEM_CLASSES[name]


def test_system_classes_deleted_as_a_collection_come_back_at_the_next_start(
    apiserver: LocalApiServer, scheduling: Any
) -> None:
    """A collection DELETE does not ask (in kube as here); the start hook creates them again."""
    scheduling.create_priority_class(priority_class("batch", 100))
    scheduling.delete_collection_priority_class()
    assert scheduling.list_priority_class().items == []

    apiserver.stop()
    apiserver.start()

    names = {pc.metadata.name for pc in scheduling.list_priority_class().items}
    assert names == set(SYSTEM_CLASSES)
