"""The minimal workload controllers: a Deployment scaled up and down through one ReplicaSet, a Job
of three completions, a StatefulSet's ordered names."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

from driver.cluster.port import PODS, JsonObject
from driver.errors import ConflictError
from localcluster.cluster.kubelet import RUN_SECONDS_ANNOTATION, NodeSpec
from localcluster.cluster.runner import LocalCluster
from localcluster.cluster.workloads.common import DEPLOYMENTS, JOBS, REPLICA_SETS, STATEFUL_SETS
from localcluster.cluster.workloads.deployment import template_hash
from tests.localcluster_cluster.conftest import NS

NODES = (NodeSpec("node-a"), NodeSpec("node-b"))


def _template(labels: dict[str, str], **spec: Any) -> JsonObject:
    return {
        "metadata": {"labels": labels},
        "spec": {"containers": [{"name": "c", "image": "busybox:1"}], **spec},
    }


def _pods(cluster: LocalCluster, prefix: str) -> list[JsonObject]:
    assert cluster.api is not None
    return [
        p
        for p in cluster.api.list_objects(PODS, namespace=NS).items
        if p["metadata"]["name"].startswith(prefix)
    ]


def _running(cluster: LocalCluster, prefix: str) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in _pods(cluster, prefix)
        if p.get("status", {}).get("phase") == "Running"
        and "deletionTimestamp" not in p["metadata"]
    )


def _scale(cluster: LocalCluster, resource: Any, name: str, replicas: int) -> None:
    """Read, change, write — again on a 409, as ``kubectl scale`` does: the workload's controller
    may write its status between our read and our write."""
    assert cluster.api is not None
    for attempt in range(5):
        updated = copy.deepcopy(cluster.api.get(resource, name=name, namespace=NS))
        updated["spec"]["replicas"] = replicas
        try:
            cluster.api.update(resource, updated)
            return
        except ConflictError:
            if attempt == 4:
                raise


def test_deployment_scales_through_one_replicaset(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster(NODES)
    api = cluster.api
    assert api is not None
    api.create(
        DEPLOYMENTS,
        {
            "metadata": {"name": "web", "namespace": NS},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "web"}},
                "template": _template({"app": "web"}),
            },
        },
    )
    cluster.wait_for(lambda: len(_running(cluster, "web-")) == 1)
    (replica_set,) = api.list_objects(REPLICA_SETS, namespace=NS).items
    pod_hash = replica_set["metadata"]["labels"]["pod-template-hash"]
    assert replica_set["metadata"]["name"] == f"web-{pod_hash}"
    assert replica_set["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    (first,) = _pods(cluster, "web-")
    assert re.fullmatch(
        rf"web-{pod_hash}-[bcdfghjklmnpqrstvwxz2456789]{{5}}", first["metadata"]["name"]
    )
    owner = first["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == (
        "ReplicaSet",
        f"web-{pod_hash}",
        True,
    )

    _scale(cluster, DEPLOYMENTS, "web", 5)
    cluster.wait_for(lambda: len(_running(cluster, "web-")) == 5)
    cluster.wait_for(
        lambda: (
            api.get(DEPLOYMENTS, name="web", namespace=NS).get("status", {}).get("readyReplicas")
            == 5
        )
    )
    assert {p["spec"]["nodeName"] for p in _pods(cluster, "web-")} == {"node-a", "node-b"}

    _scale(cluster, DEPLOYMENTS, "web", 0)
    cluster.wait_for(lambda: not _pods(cluster, "web-"))
    assert len(api.list_objects(REPLICA_SETS, namespace=NS).items) == 1


def test_job_runs_its_completions(make_cluster: Callable[..., LocalCluster]) -> None:
    cluster = make_cluster(NODES)
    api = cluster.api
    assert api is not None
    template = _template({"app": "batch"}, restartPolicy="Never")
    template["metadata"]["annotations"] = {RUN_SECONDS_ANNOTATION: "0.3"}
    job = api.create(
        JOBS,
        {
            "metadata": {"name": "train", "namespace": NS},
            "spec": {"completions": 3, "parallelism": 2, "template": template},
        },
    )

    def complete() -> JsonObject | None:
        status = api.get(JOBS, name="train", namespace=NS).get("status", {})
        done = any(c["type"] == "Complete" for c in status.get("conditions") or [])
        return status if done else None

    status = cluster.wait_for(complete)
    assert status["succeeded"] == 3
    assert status["active"] == 0
    pods = _pods(cluster, "train-")
    assert len(pods) == 3
    assert all(p["status"]["phase"] == "Succeeded" for p in pods)
    assert all(
        p["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "train"
        and p["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] == job["metadata"]["uid"]
        for p in pods
    )


def test_statefulset_pods_are_named_by_ordinal(make_cluster: Callable[..., LocalCluster]) -> None:
    cluster = make_cluster(NODES)
    api = cluster.api
    assert api is not None
    api.create(
        STATEFUL_SETS,
        {
            "metadata": {"name": "db", "namespace": NS},
            "spec": {
                "replicas": 3,
                "serviceName": "db",
                "selector": {"matchLabels": {"app": "db"}},
                "template": _template({"app": "db"}),
            },
        },
    )
    cluster.wait_for(lambda: _running(cluster, "db-") == ["db-0", "db-1", "db-2"])
    db1 = next(p for p in _pods(cluster, "db-") if p["metadata"]["name"] == "db-1")
    assert db1["spec"]["hostname"] == "db-1"
    assert db1["spec"]["subdomain"] == "db"
    assert db1["metadata"]["labels"]["apps.kubernetes.io/pod-index"] == "1"

    _scale(cluster, STATEFUL_SETS, "db", 1)
    cluster.wait_for(lambda: [p["metadata"]["name"] for p in _pods(cluster, "db-")] == ["db-0"])
    cluster.wait_for(
        lambda: (
            api.get(STATEFUL_SETS, name="db", namespace=NS).get("status", {}).get("replicas") == 1
        )
    )


def test_template_hash_is_stable_and_safe() -> None:
    text = '{"spec": {}}'
    assert template_hash(text) == template_hash(text)
    assert template_hash(text) != template_hash('{"spec": {"a": 1}}')
    assert re.fullmatch(r"[bcdfghjklmnpqrstvwxz2456789]{1,10}", template_hash(text))
