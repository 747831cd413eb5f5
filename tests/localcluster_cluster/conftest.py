"""Fixtures: a started ``LocalCluster`` under a short /tmp root (unix socket paths are limited),
and builders for the objects the tests create."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from api import wire
from localcluster.cluster.kubelet import NodeSpec
from localcluster.cluster.runner import LocalCluster

NS = "default"
DRIVER = "mig.instaslice.dev"


@pytest.fixture
def short_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="lc"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def make_cluster(short_root: Path) -> Iterator[Callable[..., LocalCluster]]:
    started: list[LocalCluster] = []

    def make(nodes: Sequence[NodeSpec] = (NodeSpec("node-a"),), **options: Any) -> LocalCluster:
        cluster = LocalCluster(nodes, short_root, **options).start()
        started.append(cluster)
        return cluster

    yield make
    for cluster in started:
        cluster.stop()


def pod(
    name: str,
    *,
    claims: Sequence[dict[str, Any]] = (),
    container_claims: Sequence[str] = (),
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    gates: Sequence[str] = (),
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "busybox:1"}
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    if container_claims:
        resources["claims"] = [{"name": c} for c in container_claims]
    if resources:
        container["resources"] = resources
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": [container], **spec},
    }
    if claims:
        body["spec"]["resourceClaims"] = list(claims)
    if gates:
        body["spec"]["schedulingGates"] = [{"name": g} for g in gates]
    return body


def claim_spec() -> dict[str, Any]:
    return {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}


def template(name: str = "tpl") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"metadata": {"labels": {"from": "template"}}, "spec": claim_spec()},
    }


def claim(name: str, *, finalizer: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": NS}
    if finalizer:
        metadata["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": claim_spec(),
    }


def allocation(node: str, *, timestamp: bool = True) -> wire.AllocationResult:
    result: wire.AllocationResult = {
        "devices": {
            "results": [
                {"request": "gpu", "driver": DRIVER, "pool": node, "device": "gpu-0-1g-5gb-0"}
            ]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }
    if timestamp:
        result["allocationTimestamp"] = "2026-01-01T00:00:00Z"
    return result
