"""Contract: a PodDisruptionBudget is validated as kube-apiserver's ``policy/validation`` does,
on create, on update and on a status write."""

from __future__ import annotations

import re
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from driver.cluster import POD_DISRUPTION_BUDGETS
from driver.cluster.kube import KubeClusterApi, configuration_for_url
from driver.errors import InvalidError
from localcluster.apiserver import LocalApiServer
from tests.localcluster.helpers import NS, budget, status_of


@pytest.fixture
def policy(kube_client: Any) -> Any:
    return client.PolicyV1Api(kube_client)


def _causes(caught: pytest.ExceptionInfo[ApiException]) -> list[tuple[str, str, str]]:
    status = status_of(caught.value)
    assert caught.value.status == 422
    assert status["reason"] == "Invalid"
    assert status["details"]["group"] == "policy"
    return [(c["reason"], c["field"], c["message"]) for c in status["details"]["causes"]]


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"minAvailable": 0},
        {"minAvailable": 3},
        {"minAvailable": "0%"},
        {"minAvailable": "100%"},
        {"maxUnavailable": 1},
        {"maxUnavailable": "25%"},
        {"maxUnavailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow"},
        {"minAvailable": 1, "unhealthyPodEvictionPolicy": "IfHealthyBudget"},
        {"minAvailable": 1, "selector": {}},
        {
            "minAvailable": 1,
            "selector": {
                "matchLabels": {"example.com/app": "web"},
                "matchExpressions": [
                    {"key": "tier", "operator": "NotIn", "values": ["batch"]},
                    {"key": "gpu", "operator": "Exists"},
                ],
            },
        },
    ],
    ids=[
        "neither",
        "min-zero",
        "min-int",
        "min-zero-percent",
        "min-hundred-percent",
        "max-int",
        "max-percent",
        "always-allow",
        "if-healthy-budget",
        "empty-selector",
        "labels-and-expressions",
    ],
)
def test_valid_budgets_are_created(policy: Any, spec: dict[str, Any]) -> None:
    created = policy.create_namespaced_pod_disruption_budget(NS, budget(**spec))

    assert created.metadata.name == "web"


_PERCENT = (
    'Invalid value: "50": a valid percent string must be a numeric string followed by an '
    "ending '%' (e.g. '1%' or '93%', regex used for validation is '[0-9]+%')"
)


@pytest.mark.parametrize(
    ("spec", "cause"),
    [
        (
            {"minAvailable": 1, "maxUnavailable": 1},
            ("FieldValueInvalid", "spec", "minAvailable and maxUnavailable cannot be both set"),
        ),
        (
            {"minAvailable": -1},
            (
                "FieldValueInvalid",
                "spec.minAvailable",
                "Invalid value: -1: must be greater than or equal to 0",
            ),
        ),
        ({"maxUnavailable": "50"}, ("FieldValueInvalid", "spec.maxUnavailable", _PERCENT)),
        (
            {"maxUnavailable": "150%"},
            (
                "FieldValueInvalid",
                "spec.maxUnavailable",
                'Invalid value: "150%": must not be greater than 100%',
            ),
        ),
        (
            {"minAvailable": 1, "unhealthyPodEvictionPolicy": "Never"},
            (
                "FieldValueNotSupported",
                "spec.unhealthyPodEvictionPolicy",
                'Unsupported value: "Never": supported values: "AlwaysAllow", "IfHealthyBudget"',
            ),
        ),
        (
            {"minAvailable": 1, "selector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
            (
                "FieldValueRequired",
                "spec.selector.matchExpressions[0].values",
                "Required value: must be specified when `operator` is 'In' or 'NotIn'",
            ),
        ),
        (
            {
                "minAvailable": 1,
                "selector": {
                    "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]
                },
            },
            (
                "FieldValueForbidden",
                "spec.selector.matchExpressions[0].values",
                "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            ),
        ),
        (
            {
                "minAvailable": 1,
                "selector": {"matchExpressions": [{"key": "a", "operator": "Near"}]},
            },
            (
                "FieldValueInvalid",
                "spec.selector.matchExpressions[0].operator",
                'Invalid value: "Near": not a valid selector operator',
            ),
        ),
        (
            {"minAvailable": 1, "selector": {"matchLabels": {"not a key": "web"}}},
            (
                "FieldValueInvalid",
                "spec.selector.matchLabels",
                'Invalid value: "not a key": name part must consist of alphanumeric characters, '
                "'-', '_' or '.', and must start and end with an alphanumeric character",
            ),
        ),
        (
            {"minAvailable": 1, "selector": {"matchLabels": {"app": "-web"}}},
            (
                "FieldValueInvalid",
                "spec.selector.matchLabels",
                'Invalid value: "-web": a valid label must be an empty string or consist of '
                "alphanumeric characters, '-', '_' or '.', and must start and end with an "
                "alphanumeric character (at most 63 characters)",
            ),
        ),
    ],
    ids=[
        "both-set",
        "negative",
        "string-without-percent",
        "over-hundred-percent",
        "unknown-unhealthy-pod-eviction-policy",
        "in-without-values",
        "exists-with-values",
        "unknown-operator",
        "bad-label-key",
        "bad-label-value",
    ],
)
def test_invalid_budgets_are_refused(
    policy: Any, spec: dict[str, Any], cause: tuple[str, str, str]
) -> None:
    with pytest.raises(ApiException) as caught:
        policy.create_namespaced_pod_disruption_budget(NS, budget(**spec))

    reason, field, message = cause
    [(got_reason, got_field, got_message)] = _causes(caught)
    assert (got_reason, got_field) == (reason, field)
    assert got_message.endswith(message)


def test_a_value_neither_int_nor_string_is_refused(apiserver: LocalApiServer) -> None:
    """The ``kubernetes`` client would refuse to send it; our own client sends what it is given."""
    with (
        KubeClusterApi(configuration=configuration_for_url(apiserver.url)) as api,
        pytest.raises(
            InvalidError, match=r"spec.minAvailable: Invalid value: 1.5: must be an integer"
        ),
    ):
        api.create(POD_DISRUPTION_BUDGETS, budget(minAvailable=1.5), namespace=NS)


def test_an_update_is_validated_too(policy: Any) -> None:
    policy.create_namespaced_pod_disruption_budget(NS, budget(minAvailable=1))

    with pytest.raises(ApiException) as caught:
        policy.patch_namespaced_pod_disruption_budget("web", NS, {"spec": {"maxUnavailable": 1}})

    assert [c[1] for c in _causes(caught)] == ["spec"]
    assert 'PodDisruptionBudget.policy "web" is invalid' in status_of(caught.value)["message"]


@pytest.mark.parametrize(
    ("status", "field"),
    [
        ({"disruptionsAllowed": -1}, "status.disruptionsAllowed"),
        ({"expectedPods": -2}, "status.expectedPods"),
        (
            {"conditions": [{"type": "Drained", "status": "Maybe"}]},
            "status.conditions[*].status",
        ),
        (
            {
                "conditions": [
                    {
                        "type": "Drained",
                        "status": "True",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ]
            },
            "status.conditions[*].reason",
        ),
    ],
    ids=["negative-allowed", "negative-expected", "condition-status", "condition-reason"],
)
def test_a_status_write_is_validated(policy: Any, status: dict[str, Any], field: str) -> None:
    policy.create_namespaced_pod_disruption_budget(NS, budget(minAvailable=1))

    with pytest.raises(ApiException) as caught:
        policy.patch_namespaced_pod_disruption_budget_status("web", NS, {"status": status})

    # the controller's own condition may come first: compare without list indexes
    assert field in [re.sub(r"\[\d+\]", "[*]", c[1]) for c in _causes(caught)]
