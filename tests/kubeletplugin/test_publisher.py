"""ResourceSlice publishing on the local API server: content, generations, inventory changes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from api.names import DRIVER_NAME
from driver.cluster.events import EventRecorder
from driver.cluster.kube import KubeClusterApi
from driver.cluster.port import EVENTS, NODES, RESOURCE_SLICES, JsonObject
from driver.gpu.backend import GpuInfo, MigInstance, SliceUsage, XidEvent
from driver.gpu.emulated import EmulatedGpuBackend
from driver.ids import MigUuid
from driver.resourceslices import complete_pools, parse_devices
from kubeletplugin.node.publisher import MIG_DISABLED_REASON, SlicePublisher
from localcluster.apiserver import LocalApiServer
from tests.kubeletplugin.harness import make_api

NODE = "node-p"
A100_40GB_DEVICES = 25  # 7 + 7 (+me) + 4 + 3 + 2 + 1 + 1 placements


class ChangingGpus:
    """An emulated backend whose GPUs can lose MIG mode or disappear (a fake injected)."""

    def __init__(self, spec: str) -> None:
        self.inner = EmulatedGpuBackend(node_name=NODE, spec=spec)
        self.mig_off: set[int] = set()
        self.gone: set[int] = set()

    def gpus(self) -> tuple[GpuInfo, ...]:
        return tuple(
            replace(g, mig_enabled=False, mig_pending=False, model=None)
            if g.index in self.mig_off
            else g
            for g in self.inner.gpus()
            if g.index not in self.gone
        )

    def instances(self, *, gpu_index: int | None = None) -> tuple[MigInstance, ...]:
        return self.inner.instances(gpu_index=gpu_index)

    def create_slice(self, *, gpu_index: int, profile: str, start: int) -> MigInstance:
        return self.inner.create_slice(gpu_index=gpu_index, profile=profile, start=start)

    def destroy_slice(self, *, gpu_index: int, gi_id: int) -> None:
        self.inner.destroy_slice(gpu_index=gpu_index, gi_id=gi_id)

    def slice_usage(self, *, mig_uuid: MigUuid) -> SliceUsage:
        return self.inner.slice_usage(mig_uuid=mig_uuid)

    def next_xid_event(self, *, timeout_seconds: float) -> XidEvent | None:
        return self.inner.next_xid_event(timeout_seconds=timeout_seconds)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def api(apiserver: LocalApiServer) -> Iterator[KubeClusterApi]:
    with make_api(apiserver.url) as client:
        yield client


@pytest.fixture
def node_obj(api: KubeClusterApi) -> JsonObject:
    return api.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})


def publisher(api: KubeClusterApi, backend: ChangingGpus) -> SlicePublisher:
    return SlicePublisher(
        api=api,
        backend=backend,
        node_name=NODE,
        driver_name=DRIVER_NAME,
        events=EventRecorder(api=api, component="test", host=NODE),
    )


def our_slices(api: KubeClusterApi) -> list[JsonObject]:
    return [
        s
        for s in api.list_objects(RESOURCE_SLICES).items
        if s["spec"]["driver"] == DRIVER_NAME and s["spec"]["nodeName"] == NODE
    ]


def published_gpus(api: KubeClusterApi) -> dict[int, int]:
    """Devices per GPU index in the complete pool, as the controller would read it."""
    pools = complete_pools(our_slices(api))
    counts: dict[int, int] = {}
    for device in parse_devices(pools.get(NODE, [])):
        counts[device.gpu_index] = counts.get(device.gpu_index, 0) + 1
    return counts


def test_publishes_every_placement_owned_by_the_node(
    api: KubeClusterApi, node_obj: JsonObject
) -> None:
    backend = ChangingGpus("2xA100-40GB")
    assert publisher(api, backend).sync() is True
    slices = our_slices(api)
    assert len(slices) == 3
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}
    assert {s["spec"]["pool"]["generation"] for s in slices} == {1}
    for obj in slices:
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner["kind"] == "Node"
        assert owner["uid"] == node_obj["metadata"]["uid"]
    assert published_gpus(api) == {0: A100_40GB_DEVICES, 1: A100_40GB_DEVICES}
    backend.close()


def test_unchanged_inventory_is_not_rewritten_even_by_a_new_publisher(
    api: KubeClusterApi, node_obj: JsonObject
) -> None:
    backend = ChangingGpus("2xA100-40GB")
    publisher(api, backend).sync()
    versions = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in our_slices(api)}
    assert publisher(api, backend).sync() is False  # a restarted plugin
    assert {
        s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in our_slices(api)
    } == versions
    backend.close()


def test_mig_off_gpu_is_not_published_and_reported_once_on_the_node(
    api: KubeClusterApi, node_obj: JsonObject
) -> None:
    backend = ChangingGpus("2xA100-40GB")
    backend.mig_off.add(1)
    pub = publisher(api, backend)
    pub.sync()
    pub.sync()
    assert published_gpus(api) == {0: A100_40GB_DEVICES}
    events = [
        e
        for e in api.list_objects(EVENTS, namespace="default").items
        if e["reason"] == MIG_DISABLED_REASON
    ]
    assert len(events) == 1
    assert events[0]["involvedObject"]["kind"] == "Node"
    assert events[0]["involvedObject"]["name"] == NODE
    assert "GPU 1" in events[0]["message"]
    assert events[0]["count"] == 1

    backend.mig_off.clear()
    assert pub.sync() is True
    assert published_gpus(api) == {0: A100_40GB_DEVICES, 1: A100_40GB_DEVICES}
    assert {s["spec"]["pool"]["generation"] for s in our_slices(api)} == {2}
    backend.close()


def test_gpu_that_disappears_is_withdrawn_and_obsolete_slices_deleted(
    api: KubeClusterApi, node_obj: JsonObject
) -> None:
    backend = ChangingGpus("2xA100-40GB")
    pub = publisher(api, backend)
    pub.sync()
    backend.gone.add(1)
    assert pub.sync() is True
    slices = our_slices(api)
    assert sorted(s["metadata"]["name"] for s in slices) == [
        f"instaslice-{NODE}-counters-0",
        f"instaslice-{NODE}-gpu-0-0",
    ]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
    assert published_gpus(api) == {0: A100_40GB_DEVICES}
    backend.gone.add(0)
    pub.sync()
    assert our_slices(api) == []
    backend.close()


def test_slices_changed_behind_our_back_are_repaired(
    api: KubeClusterApi, node_obj: JsonObject
) -> None:
    backend = ChangingGpus("1xA100-40GB")
    pub = publisher(api, backend)
    pub.sync()
    api.delete(RESOURCE_SLICES, name=f"instaslice-{NODE}-gpu-0-0")
    assert pub.sync() is True
    assert published_gpus(api) == {0: A100_40GB_DEVICES}
    assert {s["spec"]["pool"]["generation"] for s in our_slices(api)} == {2}
    backend.close()


def test_publishing_without_a_node_object_still_works(api: KubeClusterApi) -> None:
    backend = ChangingGpus("1xA100-40GB")
    publisher(api, backend).sync()
    (counters, devices) = sorted(our_slices(api), key=lambda s: s["metadata"]["name"])
    assert "ownerReferences" not in devices["metadata"]
    assert published_gpus(api) == {0: A100_40GB_DEVICES}
    assert counters["spec"]["sharedCounters"]
    backend.close()


def test_inventory_poll_withdraws_a_gpu_that_disappears(
    api: KubeClusterApi, node_obj: JsonObject
) -> None:
    backend = ChangingGpus("1xA100-40GB")
    pub = SlicePublisher(
        api=api, backend=backend, node_name=NODE, driver_name=DRIVER_NAME, poll_seconds=0.05
    )
    pub.sync()
    pub.start()
    try:
        backend.gone.add(0)
        deadline = time.monotonic() + 10
        while our_slices(api) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert our_slices(api) == []
    finally:
        pub.stop()
        backend.close()
