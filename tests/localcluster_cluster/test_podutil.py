"""Pure helpers: node selectors and affinity, taints and tolerations, pod requests, claim names."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from localcluster.cluster.podutil import (
    ClaimNotCreatedError,
    PodClaimRef,
    node_selector_matches,
    pod_claim_refs,
    pod_requests,
    tolerates,
)

NODE = {"metadata": {"name": "node-a", "labels": {"zone": "a", "gpus": "8"}}}


def _term(**parts: Any) -> dict[str, Any]:
    return {"nodeSelectorTerms": [parts]}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        (None, True),
        ({"nodeSelectorTerms": []}, False),
        (_term(matchExpressions=[{"key": "zone", "operator": "In", "values": ["a", "b"]}]), True),
        (_term(matchExpressions=[{"key": "zone", "operator": "NotIn", "values": ["a"]}]), False),
        (_term(matchExpressions=[{"key": "rack", "operator": "DoesNotExist"}]), True),
        (_term(matchExpressions=[{"key": "gpus", "operator": "Gt", "values": ["4"]}]), True),
        (_term(matchExpressions=[{"key": "gpus", "operator": "Lt", "values": ["4"]}]), False),
        (
            _term(matchFields=[{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]),
            True,
        ),
        (
            _term(matchFields=[{"key": "metadata.name", "operator": "In", "values": ["node-b"]}]),
            False,
        ),
        (
            {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["x"]}]},
                    {"matchExpressions": [{"key": "zone", "operator": "Exists"}]},
                ]
            },
            True,
        ),
        (_term(), False),
    ],
    ids=[
        "none",
        "no-terms",
        "in",
        "not-in",
        "does-not-exist",
        "gt",
        "lt",
        "field-in",
        "field-other",
        "terms-ored",
        "empty-term",
    ],
)
def test_node_selector(selector: dict[str, Any] | None, matches: bool) -> None:
    assert node_selector_matches(NODE, selector) is matches


TAINT = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": "dedicated", "operator": "Equal", "value": "gpu"}, True),
        ({"key": "dedicated", "value": "gpu"}, True),
        ({"key": "dedicated", "operator": "Equal", "value": "cpu"}, False),
        ({"key": "dedicated", "operator": "Exists"}, True),
        ({"operator": "Exists"}, True),
        ({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
    ],
    ids=[
        "equal",
        "default-equal",
        "other-value",
        "exists",
        "exists-any",
        "other-effect",
        "other-key",
    ],
)
def test_tolerations(toleration: dict[str, str], tolerated: bool) -> None:
    assert tolerates([toleration], TAINT) is tolerated


def test_pod_requests_sum_containers_max_init_and_default_to_limits() -> None:
    pod = {
        "spec": {
            "containers": [
                {
                    "resources": {
                        "requests": {"cpu": "500m"},
                        "limits": {"nvidia.com/mig-1g.5gb": "1"},
                    }
                },
                {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
            ],
            "initContainers": [{"resources": {"requests": {"cpu": "2"}}}],
            "overhead": {"memory": "10Mi"},
        }
    }
    assert pod_requests(pod) == {
        "cpu": Fraction(2),
        "memory": Fraction(2**30 + 10 * 2**20),
        "nvidia.com/mig-1g.5gb": Fraction(1),
    }


def test_pod_claim_refs() -> None:
    pod = {
        "spec": {
            "resourceClaims": [
                {"name": "direct", "resourceClaimName": "mine"},
                {"name": "gen", "resourceClaimTemplateName": "tpl"},
                {"name": "skipped", "resourceClaimTemplateName": "tpl"},
            ]
        },
        "status": {
            "resourceClaimStatuses": [
                {"name": "gen", "resourceClaimName": "p-gen-abcde"},
                {"name": "skipped"},
            ]
        },
    }
    assert pod_claim_refs(pod) == [
        PodClaimRef("direct", "mine", generated=False),
        PodClaimRef("gen", "p-gen-abcde", generated=True),
    ]
    del pod["status"]
    with pytest.raises(ClaimNotCreatedError):
        pod_claim_refs(pod)
