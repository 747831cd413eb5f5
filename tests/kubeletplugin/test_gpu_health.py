"""Unhealthy GPUs: withdrawn from the ResourceSlices with a Node event, republished when healthy.

GPU health is marked through a second emulated backend on the plugin's state file — another
process's view, as an operator's tool would be — and the plugin sees it on its next inventory poll.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from api.names import DRIVER_NAME
from driver.cluster.events import NORMAL, WARNING, EventRecorder
from driver.cluster.kube import KubeClusterApi
from driver.cluster.port import EVENTS, NODES, RESOURCE_SLICES, JsonObject
from driver.gpu.backend import GpuInfo
from driver.gpu.emulated import EmulatedGpuBackend
from kubeletplugin.inventory import build_inventory
from kubeletplugin.metrics import PluginMetrics
from kubeletplugin.plugin import KubeletPlugin, PluginConfig
from kubeletplugin.publisher import GPU_HEALTHY_REASON, GPU_UNHEALTHY_REASON, SlicePublisher
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


def test_inventory_withholds_unhealthy_gpus_but_keeps_their_device_names() -> None:
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
    assert [g.index for g in inventory.non_mig_gpus] == [2]
    assert [g.index for g in inventory.unhealthy_gpus] == [1, 3]
    assert inventory.published_device_count == A100_40GB_DEVICES
    assert len(inventory.devices) == 2 * A100_40GB_DEVICES  # GPU 1's names still resolve
    assert inventory.device("gpu-1-1g-5gb-3").gpu_uuid == gpus[1].uuid


# -- the publisher -------------------------------------------------------------------------------


def test_unhealthy_gpu_is_withdrawn_reported_once_and_republished(
    api: KubeClusterApi, tmp_path_factory: pytest.TempPathFactory
) -> None:
    state = tmp_path_factory.mktemp("gpus") / "gpus.json"
    backend = EmulatedGpuBackend(node_name=NODE, spec="2xA100-40GB", state_file=state)
    operator = EmulatedGpuBackend(node_name=NODE, spec="2xA100-40GB", state_file=state)
    metrics = PluginMetrics()
    publisher = SlicePublisher(
        api=api,
        backend=backend,
        node_name=NODE,
        driver_name=DRIVER_NAME,
        events=EventRecorder(api=api, component="test", host=NODE),
        metrics=metrics,
    )
    assert publisher.sync() is True
    assert (gauge(metrics, "healthy"), gauge(metrics, "unhealthy")) == (2.0, 0.0)

    operator.set_health(1, healthy=False, reason="XID 79: GPU has fallen off the bus")
    assert publisher.sync() is True
    assert devices_by_gpu(api, NODE) == {0: A100_40GB_DEVICES}
    assert generations(api, NODE) == {2}
    assert publisher.sync() is False  # nothing changed: no write, no second event
    (event,) = node_events(api, GPU_UNHEALTHY_REASON)
    uuid = backend.gpus()[1].uuid
    assert event["type"] == WARNING
    assert event["involvedObject"]["name"] == NODE
    assert event["count"] == 1
    for part in ("GPU 1", uuid, "XID 79: GPU has fallen off the bus", "withdrawn"):
        assert part in event["message"]
    assert (gauge(metrics, "healthy"), gauge(metrics, "unhealthy")) == (1.0, 1.0)
    published = metrics.registry.get_sample_value("instaslice_kubelet_plugin_published_devices")
    assert published == A100_40GB_DEVICES

    operator.set_health(1, healthy=False, reason="row remapping failed")
    assert publisher.sync() is False  # the same devices are withdrawn
    assert len(node_events(api, GPU_UNHEALTHY_REASON)) == 2  # a new reason is reported again

    operator.set_health(1, healthy=True)
    assert publisher.sync() is True
    assert devices_by_gpu(api, NODE) == {0: A100_40GB_DEVICES, 1: A100_40GB_DEVICES}
    assert generations(api, NODE) == {3}
    (healthy,) = node_events(api, GPU_HEALTHY_REASON)
    assert healthy["type"] == NORMAL
    assert "GPU 1" in healthy["message"]
    assert uuid in healthy["message"]
    assert (gauge(metrics, "healthy"), gauge(metrics, "unhealthy")) == (2.0, 0.0)
    operator.close()
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


def test_plugin_withdraws_an_unhealthy_gpu_on_its_poll_and_keeps_prepared_slices(
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
    try:
        plugin.start()
        kubelet = node.kubelet()
        assert devices_by_gpu(node.api, NODE) == {0: A100_40GB_DEVICES, 1: A100_40GB_DEVICES}
        claim = node.claim(["gpu-1-2g-10gb-2"])
        first = kubelet.prepare([claim])[claim.uid]
        assert first.error == ""

        operator.set_health(1, healthy=False, reason="XID 48: double-bit ECC error")
        wait_for(
            lambda: devices_by_gpu(node.api, NODE) == {0: A100_40GB_DEVICES},
            what="GPU 1's devices to be withdrawn",
        )
        wait_for(lambda: bool(node_events(node.api, GPU_UNHEALTHY_REASON)), what="the event")
        (event,) = node_events(node.api, GPU_UNHEALTHY_REASON)
        assert "GPU 1" in event["message"]
        assert "XID 48: double-bit ECC error" in event["message"]
        assert gauge(plugin.metrics, "unhealthy") == 1.0
        assert any("GPU 1: XID 48" in line for line in plugin.health.check().checks)
        assert plugin.health.check().ok  # a broken GPU is no reason to restart the plugin
        # The prepared slice stays, and the kubelet's repeat is answered as before.
        assert [(g, p, s) for g, p, s, _ in node.instances()] == [(1, "2g.10gb", 2)]
        assert kubelet.prepare([claim])[claim.uid] == first

        operator.set_health(1, healthy=True)
        wait_for(
            lambda: devices_by_gpu(node.api, NODE) == {0: A100_40GB_DEVICES, 1: A100_40GB_DEVICES},
            what="GPU 1's devices to be republished",
        )
        wait_for(lambda: bool(node_events(node.api, GPU_HEALTHY_REASON)), what="the event")
        assert gauge(plugin.metrics, "unhealthy") == 0.0
        assert kubelet.unprepare([claim]) == {claim.uid: ""}
        assert node.instances() == []
    finally:
        plugin.stop()
        operator.close()
        backend.close()
