"""Unhealthy GPUs: their devices tainted in the ResourceSlices with a Node event, untainted when
healthy again.

GPU health is marked through a second emulated backend on the plugin's state file — another
process's view, as an operator's tool would be — and the plugin sees it on its next inventory poll.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from api.names import DRIVER_NAME
from driver.cluster.events import NORMAL, WARNING, EventRecorder
from driver.cluster.kube import KubeClusterApi
from driver.cluster.port import EVENTS, NODES, RESOURCE_SLICES, ClusterApi, JsonObject
from driver.errors import BackendError
from driver.gpu.backend import GpuBackend, GpuInfo, XidEvent
from driver.gpu.emulated import EmulatedGpuBackend
from driver.resourceslices import complete_pools, parse_devices
from kubeletplugin.health.settings import XidPolicy
from kubeletplugin.health.xid import XidHealth
from kubeletplugin.metrics import PluginMetrics
from kubeletplugin.node.inventory import build_inventory
from kubeletplugin.node.publisher import GPU_HEALTHY_REASON, GPU_UNHEALTHY_REASON, SlicePublisher
from kubeletplugin.plugin import KubeletPlugin, PluginConfig
from localcluster.apiserver import LocalApiServer
from tests.kubeletplugin.harness import NodeHarness, make_api

NODE = "node-h"
A100_40GB_DEVICES = 25


@pytest.fixture
def api(apiserver: LocalApiServer) -> Iterator[KubeClusterApi]:
    with make_api(apiserver.url) as client:
        client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        yield client


def devices_by_gpu(api: KubeClusterApi, node: str) -> dict[int, int]:
    """Published device names per GPU index (``gpu-<index>-…``), over the node's device slices."""
    counts: dict[int, int] = {}
    for obj in api.list_objects(RESOURCE_SLICES).items:
        spec = obj["spec"]
        if spec["driver"] != DRIVER_NAME or spec.get("nodeName") != node:
            continue
        for device in spec.get("devices") or []:
            index = int(device["name"].split("-")[1])
            counts[index] = counts.get(index, 0) + 1
    return counts


def taints_by_gpu(api: KubeClusterApi, node: str) -> dict[int, set[str]]:
    """GPU index → the distinct taints (``key=value:effect@timeAdded``) on its published devices;
    a GPU whose devices carry none maps to an empty set, one whose devices differ to several."""
    found: dict[int, set[str]] = {}
    for obj in api.list_objects(RESOURCE_SLICES).items:
        spec = obj["spec"]
        if spec["driver"] != DRIVER_NAME or spec.get("nodeName") != node:
            continue
        for device in spec.get("devices") or []:
            index = int(device["name"].split("-")[1])
            taints = device.get("taints") or []
            text = ",".join(
                f"{t['key']}={t.get('value', '')}:{t['effect']}@{t.get('timeAdded')}"
                for t in taints
            )
            found.setdefault(index, set()).add(text) if text else found.setdefault(index, set())
    return found


def generations(api: KubeClusterApi, node: str) -> set[int]:
    return {
        obj["spec"]["pool"]["generation"]
        for obj in api.list_objects(RESOURCE_SLICES).items
        if obj["spec"].get("nodeName") == node
    }


def node_events(api: KubeClusterApi, reason: str) -> list[JsonObject]:
    return [
        e
        for e in api.list_objects(EVENTS, namespace="default").items
        if e["reason"] == reason and e["involvedObject"]["kind"] == "Node"
    ]


def wait_for(check: Callable[[], bool], *, what: str) -> None:
    deadline = time.monotonic() + 10
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def gauge(metrics: PluginMetrics, health: str) -> float | None:
    return metrics.registry.get_sample_value("instaslice_kubelet_plugin_gpus", {"health": health})


# -- the inventory (pure) ------------------------------------------------------------------------


def _info(gpu: GpuInfo, *, healthy: bool, mig: bool = True) -> GpuInfo:
    changed = replace(gpu, healthy=healthy, health_reason=None if healthy else "XID 79")
    return changed if mig else replace(changed, mig_enabled=False, mig_pending=False, model=None)


def test_inventory_sets_unhealthy_gpus_apart_for_tainting_and_keeps_their_device_names() -> None:
    gpus = EmulatedGpuBackend(node_name=NODE, spec="4xA100-40GB").gpus()
    inventory = build_inventory(
        [
            gpus[0],
            _info(gpus[1], healthy=False),
            _info(gpus[2], healthy=True, mig=False),
            _info(gpus[3], healthy=False, mig=False),
        ]
    )
    assert [g.index for g in inventory.gpus] == [0]
    assert [g.index for g in inventory.tainted_gpus] == [1]  # GPU 3 has no MIG mode: no devices
    assert [g.index for g in inventory.non_mig_gpus] == [2]
    assert [g.index for g in inventory.unhealthy_gpus] == [1, 3]
    assert inventory.published_device_count == A100_40GB_DEVICES
    assert inventory.tainted_device_count == A100_40GB_DEVICES
    assert len(inventory.devices) == 2 * A100_40GB_DEVICES  # GPU 1's names still resolve
    assert inventory.device("gpu-1-1g-5gb-3").gpu_uuid == gpus[1].uuid


# -- the publisher -------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 1, 17, 0, 0, 250_000, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


TAINT = "mig.instaslice.dev/unhealthy"


def test_unhealthy_gpu_is_tainted_reported_once_and_untainted_when_healthy(
    api: KubeClusterApi, tmp_path_factory: pytest.TempPathFactory
) -> None:
    state = tmp_path_factory.mktemp("gpus") / "gpus.json"
    backend = EmulatedGpuBackend(node_name=NODE, spec="2xA100-40GB", state_file=state)
    operator = EmulatedGpuBackend(node_name=NODE, spec="2xA100-40GB", state_file=state)
    metrics = PluginMetrics()
    clock = Clock()
    publisher = SlicePublisher(
        api=api,
        backend=backend,
        node_name=NODE,
        driver_name=DRIVER_NAME,
        events=EventRecorder(api=api, component="test", host=NODE),
        metrics=metrics,
        clock=clock,
    )
    assert publisher.sync() is True
    assert taints_by_gpu(api, NODE) == {0: set(), 1: set()}
    assert (gauge(metrics, "healthy"), gauge(metrics, "unhealthy")) == (2.0, 0.0)

    operator.set_health(1, healthy=False, reason="XID 79: GPU has fallen off the bus")
    assert publisher.sync() is True
    # every device stays published; GPU 1's carry the taint, with the time it was first seen
    assert devices_by_gpu(api, NODE) == {0: A100_40GB_DEVICES, 1: A100_40GB_DEVICES}
    first_seen = f"{TAINT}=MarkedUnhealthy:NoSchedule@2026-12-01T17:00:00Z"
    assert taints_by_gpu(api, NODE) == {0: set(), 1: {first_seen}}
    assert generations(api, NODE) == {2}
    clock.now += timedelta(minutes=5)
    assert publisher.sync() is False  # nothing changed: no write, no second event, same time
    (event,) = node_events(api, GPU_UNHEALTHY_REASON)
    uuid = backend.gpus()[1].uuid
    assert event["type"] == WARNING
    assert event["involvedObject"]["name"] == NODE
    assert event["count"] == 1
    for part in ("GPU 1", uuid, "XID 79: GPU has fallen off the bus", f"tainted {TAINT}="):
        assert part in event["message"]
    assert (gauge(metrics, "healthy"), gauge(metrics, "unhealthy")) == (1.0, 1.0)
    published = metrics.registry.get_sample_value("instaslice_kubelet_plugin_published_devices")
    assert published == A100_40GB_DEVICES  # the healthy, untainted ones

    operator.set_health(1, healthy=False, reason="row remapping failed")
    assert publisher.sync() is False  # the same code: the same taint
    assert len(node_events(api, GPU_UNHEALTHY_REASON)) == 2  # a new reason is reported again

    operator.set_health(1, healthy=True)
    assert publisher.sync() is True
    assert taints_by_gpu(api, NODE) == {0: set(), 1: set()}
    assert generations(api, NODE) == {3}
    (healthy,) = node_events(api, GPU_HEALTHY_REASON)
    assert healthy["type"] == NORMAL
    assert "GPU 1" in healthy["message"]
    assert uuid in healthy["message"]
    assert (gauge(metrics, "healthy"), gauge(metrics, "unhealthy")) == (2.0, 0.0)
    operator.close()
    backend.close()


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_the_taint_effect_is_the_operators_choice(api: KubeClusterApi, effect: str) -> None:
    backend = EmulatedGpuBackend(node_name=NODE, spec="2xA100-40GB")
    backend.set_health(0, healthy=False, reason="marked")
    publisher = SlicePublisher(
        api=api,
        backend=backend,
        node_name=NODE,
        driver_name=DRIVER_NAME,
        taint_effect=effect,
        clock=Clock(),
    )
    assert publisher.sync() is True
    assert taints_by_gpu(api, NODE) == {
        0: {f"{TAINT}=MarkedUnhealthy:{effect}@2026-12-01T17:00:00Z"},
        1: set(),
    }
    devices = [d for pool in complete_pools(api.list_objects(RESOURCE_SLICES).items).values()
               for d in parse_devices(pool)]  # fmt: skip
    tainted = [d for d in devices if d.taints]
    assert len(tainted) == A100_40GB_DEVICES
    assert {str(t) for d in tainted for t in d.taints} == {f"{TAINT}=MarkedUnhealthy:{effect}"}
    backend.close()


def test_a_restarted_plugin_keeps_the_time_the_taint_was_added(api: KubeClusterApi) -> None:
    backend = EmulatedGpuBackend(node_name=NODE, spec="2xA100-40GB")
    backend.set_health(1, healthy=False, reason="marked")

    def make(clock: Clock) -> SlicePublisher:
        return SlicePublisher(
            api=api, backend=backend, node_name=NODE, driver_name=DRIVER_NAME, clock=clock
        )

    assert make(Clock()).sync() is True
    later = Clock()
    later.now += timedelta(hours=2)
    assert make(later).sync() is False  # same taint, same time: nothing to write
    assert taints_by_gpu(api, NODE)[1] == {
        f"{TAINT}=MarkedUnhealthy:NoSchedule@2026-12-01T17:00:00Z"
    }
    backend.close()


def test_a_critical_xid_taints_its_gpu_until_restart(api: KubeClusterApi) -> None:
    backend = EmulatedGpuBackend(node_name=NODE, spec="2xA100-40GB")
    xids = XidHealth(backend=backend, policy=XidPolicy())
    publisher = SlicePublisher(
        api=api,
        backend=backend,
        node_name=NODE,
        driver_name=DRIVER_NAME,
        overlay=xids.apply,
        clock=Clock(),
    )
    assert publisher.sync() is True
    uuid = backend.gpus()[0].uuid
    assert xids.record(XidEvent(gpu_index=0, gpu_uuid=uuid, xid=43)) is False  # application error
    assert publisher.sync() is False
    assert xids.record(XidEvent(gpu_index=0, gpu_uuid=uuid, xid=79)) is True
    assert xids.record(XidEvent(gpu_index=0, gpu_uuid=uuid, xid=48)) is False  # already marked
    assert publisher.sync() is True
    assert taints_by_gpu(api, NODE) == {
        0: {f"{TAINT}=Xid79:NoSchedule@2026-12-01T17:00:00Z"},
        1: set(),
    }
    (gpu,) = publisher.inventory.unhealthy_gpus
    assert gpu.health_reason is not None
    assert "XID 79" in gpu.health_reason
    backend.close()


# -- the plugin, end to end ---------------------------------------------------------------------


@pytest.fixture
def node(apiserver: LocalApiServer) -> Iterator[NodeHarness]:
    harness = NodeHarness(api_url=apiserver.url, node=NODE)
    harness.create_node()
    try:
        yield harness
    finally:
        harness.close()


def test_plugin_taints_an_unhealthy_gpu_tells_the_kubelet_and_keeps_prepared_slices(
    node: NodeHarness,
) -> None:
    backend = node.backend()
    plugin = KubeletPlugin(
        config=PluginConfig(
            node_name=NODE,
            plugin_registry_dir=node.registry_dir,
            plugin_dir=node.plugin_dir,
            cdi_root=node.cdi_root,
            state_dir=node.state_dir,
            emulated=True,
            inventory_poll_seconds=0.05,
        ),
        backend=backend,
        api=node.api,
        boot_id="boot-1",
        events=EventRecorder(api=node.api, component="instaslice-kubelet-plugin", host=NODE),
    )
    operator = node.backend()
    watch = None
    try:
        plugin.start()
        kubelet = node.kubelet()
        assert "v1alpha1.DRAResourceHealth" in kubelet.info.supported_versions
        watch = kubelet.watch_health()
        everything = watch.wait_for(lambda h: len(h) == 2 * A100_40GB_DEVICES, what="all devices")
        assert {health for health, _ in everything.values()} == {"HEALTHY"}
        assert devices_by_gpu(node.api, NODE) == {0: A100_40GB_DEVICES, 1: A100_40GB_DEVICES}
        claim = node.claim(["gpu-1-2g-10gb-2"])
        first = kubelet.prepare([claim])[claim.uid]
        assert first.error == ""

        operator.set_health(1, healthy=False, reason="XID 48: double-bit ECC error")
        wait_for(
            lambda: taints_by_gpu(node.api, NODE)[1] != set(),
            what="GPU 1's devices to be tainted",
        )
        (taint,) = taints_by_gpu(node.api, NODE)[1]
        assert taint.startswith(f"{TAINT}=MarkedUnhealthy:NoSchedule@")
        assert taints_by_gpu(node.api, NODE)[0] == set()
        health = watch.wait_for(
            lambda h: h["gpu-1-2g-10gb-2"][0] == "UNHEALTHY", what="GPU 1 unhealthy"
        )
        assert "XID 48: double-bit ECC error" in health["gpu-1-2g-10gb-2"][1]
        assert health["gpu-0-1g-5gb-0"] == ("HEALTHY", "")
        assert {h for name, (h, _) in health.items() if name.startswith("gpu-1-")} == {"UNHEALTHY"}
        wait_for(lambda: bool(node_events(node.api, GPU_UNHEALTHY_REASON)), what="the event")
        (event,) = node_events(node.api, GPU_UNHEALTHY_REASON)
        assert "GPU 1" in event["message"]
        assert "XID 48: double-bit ECC error" in event["message"]
        assert gauge(plugin.metrics, "unhealthy") == 1.0
        assert any("GPU 1: XID 48" in line for line in plugin.health.check().checks)
        assert plugin.health.check().ok  # a broken GPU is no reason to restart the plugin
        # The prepared slice stays, and the kubelet's repeat gets the first answer again.
        assert [(g, p, s) for g, p, s, _ in node.instances()] == [(1, "2g.10gb", 2)]
        assert kubelet.prepare([claim])[claim.uid] == first

        operator.set_health(1, healthy=True)
        wait_for(
            lambda: taints_by_gpu(node.api, NODE) == {0: set(), 1: set()},
            what="GPU 1's devices to be untainted",
        )
        watch.wait_for(lambda h: h["gpu-1-2g-10gb-2"][0] == "HEALTHY", what="GPU 1 healthy")
        wait_for(lambda: bool(node_events(node.api, GPU_HEALTHY_REASON)), what="the event")
        assert gauge(plugin.metrics, "unhealthy") == 0.0
        assert kubelet.unprepare([claim]) == {claim.uid: ""}
        assert node.instances() == []
    finally:
        if watch is not None:
            watch.cancel()
        plugin.stop()
        operator.close()
        backend.close()


def test_plugin_taints_a_gpu_on_a_critical_xid_at_once(node: NodeHarness) -> None:
    backend = node.backend()
    plugin = KubeletPlugin(
        config=PluginConfig(
            node_name=NODE,
            plugin_registry_dir=node.registry_dir,
            plugin_dir=node.plugin_dir,
            cdi_root=node.cdi_root,
            state_dir=node.state_dir,
            emulated=True,
            inventory_poll_seconds=3600,  # only the XID wakes the publisher
            unhealthy_taint_effect="NoExecute",
        ),
        backend=backend,
        api=node.api,
        boot_id="boot-1",
    )
    watch = None
    try:
        plugin.start()
        kubelet = node.kubelet()
        watch = kubelet.watch_health()
        watch.wait_for(lambda h: len(h) == 2 * A100_40GB_DEVICES, what="all devices")
        backend.inject_xid(0, 13)  # an application error: ignored
        backend.inject_xid(0, 79)
        wait_for(lambda: taints_by_gpu(node.api, NODE)[0] != set(), what="GPU 0 tainted")
        (taint,) = taints_by_gpu(node.api, NODE)[0]
        assert taint.startswith(f"{TAINT}=Xid79:NoExecute@")
        health = watch.wait_for(
            lambda h: h["gpu-0-7g-40gb-0"][0] == "UNHEALTHY", what="GPU 0 unhealthy"
        )
        assert "XID 79" in health["gpu-0-7g-40gb-0"][1]
        assert health["gpu-1-7g-40gb-0"][0] == "HEALTHY"
    finally:
        if watch is not None:
            watch.cancel()
        plugin.stop()
        backend.close()


class _FailingOnce:
    """Waiting for XID events fails once (the driver hiccups), then works."""

    def __init__(self, inner: EmulatedGpuBackend) -> None:
        self.inner = inner
        self.failed = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def next_xid_event(self, *, timeout_seconds: float) -> XidEvent | None:
        if not self.failed:
            self.failed = True
            raise BackendError("NVML nvmlEventSetWait_v2 failed: Unknown Error (code 999)")
        return self.inner.next_xid_event(timeout_seconds=timeout_seconds)


def test_the_xid_watch_outlives_a_failed_wait_and_marks_by_gpu_uuid() -> None:
    inner = EmulatedGpuBackend(node_name=NODE, spec="2xA100-40GB")
    flaky = _FailingOnce(inner)
    changed: list[str] = []
    xids = XidHealth(
        backend=cast(GpuBackend, flaky),
        policy=XidPolicy(),
        on_change=lambda: changed.append("woken"),
        wait_seconds=0.05,
        retry_seconds=0.01,
    )
    xids.start()
    try:
        inner.inject_xid(1, 94, gi_id=2)
        wait_for(lambda: bool(changed), what="the publisher to be woken")
    finally:
        xids.stop()
    assert flaky.failed
    (mark,) = xids.marks.values()
    assert (mark.gpu_index, mark.xid, mark.gi_id, mark.code) == (1, 94, 2, "Xid94")
    assert list(xids.marks) == [inner.gpus()[1].uuid]
    first, second = xids.apply(inner.gpus())
    assert first.healthy
    assert (second.healthy, second.health_code) == (False, "Xid94")
    assert second.health_reason is not None
    assert "on GPU instance 2" in second.health_reason
    inner.close()


def test_an_xid_on_a_gpu_already_unhealthy_adds_to_its_reason() -> None:
    backend = EmulatedGpuBackend(node_name=NODE, spec="A100-40GB")
    backend.set_health(0, healthy=False, reason="rows pending")
    xids = XidHealth(backend=backend, policy=XidPolicy())
    assert xids.record(XidEvent(gpu_index=0, gpu_uuid=backend.gpus()[0].uuid, xid=79))
    (gpu,) = xids.apply(backend.gpus())
    assert gpu.health_code == "MarkedUnhealthy"  # the first reason stays the taint's
    assert gpu.health_reason is not None
    assert gpu.health_reason.startswith("rows pending; XID 79")
    backend.close()


class _NoDeviceTaintsApi:
    """Our API wrapper in front of an API server whose DRADeviceTaints gate is off: like
    kube-apiserver, it drops the ``taints`` of ResourceSlice devices on every write."""

    def __init__(self, inner: KubeClusterApi) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    @staticmethod
    def _drop(obj: JsonObject) -> JsonObject:
        body = copy.deepcopy(obj)
        for device in body.get("spec", {}).get("devices") or []:
            device.pop("taints", None)
        return body

    def create(self, resource: Any, obj: JsonObject, **kwargs: Any) -> JsonObject:
        if resource == RESOURCE_SLICES:
            obj = self._drop(obj)
        return self.inner.create(resource, obj, **kwargs)

    def update(self, resource: Any, obj: JsonObject) -> JsonObject:
        if resource == RESOURCE_SLICES:
            obj = self._drop(obj)
        return self.inner.update(resource, obj)


def test_without_device_taints_in_the_api_server_unhealthy_gpus_are_withdrawn(
    api: KubeClusterApi,
) -> None:
    backend = EmulatedGpuBackend(node_name=NODE, spec="2xA100-40GB")
    publisher = SlicePublisher(
        api=cast(ClusterApi, _NoDeviceTaintsApi(api)),
        backend=backend,
        node_name=NODE,
        driver_name=DRIVER_NAME,
    )
    assert publisher.sync() is True
    backend.set_health(1, healthy=False, reason="marked")
    assert publisher.sync() is True
    assert devices_by_gpu(api, NODE) == {0: A100_40GB_DEVICES}  # not published untainted
    assert publisher.sync() is False
    backend.set_health(1, healthy=True)
    assert publisher.sync() is True
    assert devices_by_gpu(api, NODE) == {0: A100_40GB_DEVICES, 1: A100_40GB_DEVICES}
    backend.close()
