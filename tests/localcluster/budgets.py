"""Pods, controllers and budgets for the PodDisruptionBudget and eviction tests, written through
our own ``KubeClusterApi`` as a controller that evicts would write them."""

from __future__ import annotations

from typing import Any

from driver.cluster import POD_DISRUPTION_BUDGETS, PODS, ClusterApi, PatchType, Resource
from localcluster.apiserver import LocalApiServer
from tests.localcluster.helpers import NS, pod, pod_status

REPLICA_SETS = Resource(
    group="apps", version="v1", plural="replicasets", kind="ReplicaSet", namespaced=True
)
DEPLOYMENTS = Resource(
    group="apps", version="v1", plural="deployments", kind="Deployment", namespaced=True
)
JOBS = Resource(group="batch", version="v1", plural="jobs", kind="Job", namespaced=True)


def start_pod(
    api: ClusterApi,
    name: str,
    *,
    ready: bool = True,
    phase: str = "Running",
    labels: dict[str, str] | None = None,
    owner: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A pod labelled ``app=web`` (unless ``labels``), its status as a kubelet would write it;
    ``owner`` (a stored object) becomes its controller."""
    body = pod(name, **spec)
    body["metadata"]["labels"] = {"app": "web"} if labels is None else labels
    if owner is not None:
        body["metadata"]["ownerReferences"] = [
            {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
            }
        ]
    api.create(PODS, body, namespace=NS)
    return api.patch(
        PODS,
        name=name,
        namespace=NS,
        patch={"status": pod_status(phase=phase, ready=ready)},
        patch_type=PatchType.MERGE,
        subresource="status",
    )


def replica_set(api: ClusterApi, *, replicas: int, name: str = "web") -> dict[str, Any]:
    """A ReplicaSet object (no controller runs it here: the tests create its pods)."""
    template = {"metadata": {"labels": {"app": "web"}}, "spec": pod()["spec"]}
    body = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": template,
        },
    }
    return api.create(REPLICA_SETS, body, namespace=NS)


def settled_status(api: ClusterApi, apiserver: LocalApiServer, name: str = "web") -> Any:
    """The budget's status once the disruption controller has seen every write so far."""
    assert apiserver.settle()
    return api.get(POD_DISRUPTION_BUDGETS, name=name, namespace=NS)["status"]


def counts(status: dict[str, Any]) -> tuple[int, int, int, int]:
    """(expectedPods, desiredHealthy, currentHealthy, disruptionsAllowed)."""
    return (
        status["expectedPods"],
        status["desiredHealthy"],
        status["currentHealthy"],
        status["disruptionsAllowed"],
    )
