"""LocalCluster as a whole: nothing left behind, attaching to an API server that removes pods at
once (no graceful deletion), the polling helper."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from driver.cluster.ops import add_claim_finalizer, write_claim_allocation
from driver.cluster.port import NODES, PODS, RESOURCE_CLAIMS
from localcluster.apiserver import LocalApiServer
from localcluster.cluster.kubelet import NodeSpec
from localcluster.cluster.runner import LocalCluster
from tests.localcluster_cluster.conftest import NS, allocation, claim, pod
from tests.localcluster_cluster.fakes import FakeDraPlugin


def _sockets(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_socket())


def test_stop_leaves_no_threads_or_sockets(short_root: Path) -> None:
    before = set(threading.enumerate())
    with LocalCluster([NodeSpec("node-a"), NodeSpec("node-b")], short_root) as cluster:
        assert cluster.api is not None
        assert [n["metadata"]["name"] for n in cluster.api.list_objects(NODES).items] == [
            "node-a",
            "node-b",
        ]
        assert cluster.kubeconfig is not None
        assert cluster.url in cluster.kubeconfig.read_text()
        assert len(_sockets(short_root)) == 4  # device-plugins and pod-resources, per node
        with pytest.raises(TimeoutError, match="never"):
            cluster.wait_for(lambda: False, timeout=0.1, message="never")
    assert _sockets(short_root) == []
    leftover = [t for t in threading.enumerate() if t not in before]
    for thread in leftover:  # the API server's daemon connection threads end as sockets close
        thread.join(timeout=2.0)
    assert [t for t in leftover if t.is_alive()] == []


def test_attached_to_a_server_without_graceful_deletion(
    short_root: Path, apiserver: LocalApiServer, make_cluster: Callable[..., LocalCluster]
) -> None:
    cluster = make_cluster(api_url=apiserver.url)
    assert cluster.apiserver is None
    api = cluster.api
    assert api is not None
    plugin = FakeDraPlugin(cluster.kubelet("node-a").root).start()
    try:
        cluster.wait_for(lambda: cluster.kubelet("node-a").plugins.get("mig.instaslice.dev"))
        api.create(RESOURCE_CLAIMS, claim("gpu"))
        stored = add_claim_finalizer(api, claim=api.get(RESOURCE_CLAIMS, name="gpu", namespace=NS))
        alloc = allocation("node-a")
        del alloc["allocationTimestamp"]
        write_claim_allocation(api, claim=stored, allocation=alloc, allocated_at=datetime.now(UTC))
        api.create(PODS, pod("p", claims=[{"name": "gpu", "resourceClaimName": "gpu"}]))
        cluster.wait_for(
            lambda: (
                api.get(PODS, name="p", namespace=NS).get("status", {}).get("phase") == "Running"
            )
        )
        api.delete(PODS, name="p", namespace=NS)  # removed at once: the kubelet sees DELETED
        cluster.wait_for(lambda: len(plugin.calls) == 2)
        assert plugin.calls == [("prepare", ("gpu",)), ("unprepare", ("gpu",))]
        cluster.wait_for(
            lambda: "allocation" not in api.get(RESOURCE_CLAIMS, name="gpu", namespace=NS)["status"]
        )
    finally:
        plugin.stop()
