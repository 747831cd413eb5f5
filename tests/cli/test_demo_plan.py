"""What the demo expects of the samples, computed from the manifests alone."""

from __future__ import annotations

from typing import Any

import pytest

from localcluster.demo import expected_pods, plan_for
from localcluster.manifests import read_kustomization
from localcluster.stack import SAMPLES_DIR


def _obj(kind: str, **spec: Any) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": "x", "namespace": "ns"}, "spec": spec}


@pytest.mark.parametrize(
    ("objects", "pods"),
    [
        ([_obj("Pod")], 1),
        ([_obj("Deployment", replicas=3), _obj("StatefulSet"), _obj("ReplicaSet", replicas=0)], 4),
        ([_obj("Job", parallelism=2, completions=4)], 2),
        ([_obj("Job", parallelism=5, completions=3)], 3),
        ([_obj("Job")], 1),
        ([_obj("Service"), _obj("ResourceClaimTemplate")], 0),
    ],
    ids=[
        "pod",
        "replicated",
        "job-parallelism",
        "job-capped-by-completions",
        "job-default",
        "none",
    ],
)
def test_expected_pods(objects: list[dict[str, Any]], pods: int) -> None:
    assert expected_pods(objects) == pods


def test_the_samples_plan() -> None:
    plan = plan_for(read_kustomization(SAMPLES_DIR))
    assert plan.namespaces == ("instaslice-demo", "instaslice-quota-demo")
    # 6 pods + Deployment (2) + StatefulSet (2) + Job (2 at a time) + quota's Deployment (2) + pod
    assert plan.expected_pods == 15
