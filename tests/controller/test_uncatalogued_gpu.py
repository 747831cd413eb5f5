"""A GPU outside the catalog, as the node publishes it from NVML, is allocated through the generic
DeviceClass ``mig.instaslice.dev`` with a CEL selector on its NVML profile name (no per-profile
class exists for it)."""

from __future__ import annotations

from contextlib import ExitStack

from api import wire
from api.names import DEVICE_CLASS_ANY, DRIVER_NAME
from driver.cluster.kube import KubeClusterApi
from driver.cluster.port import DEVICE_CLASSES, NODES, RESOURCE_CLAIMS, RESOURCE_SLICES
from driver.gpu.fake_nvml import FakeNvml
from driver.gpu.nvml import NvmlGpuBackend
from driver.resourceslices import build_pool
from kubeletplugin.node.inventory import build_inventory
from localcluster.apiserver import LocalApiServer
from tests.controller.harness import (
    NS,
    claim_object,
    cluster_api,
    create_pod_with_claim,
    node_object,
    profile_expression,
    request,
    start_controller,
    ungated,
    wait_for,
)
from tests.gpumodels import uncatalogued_model


def _publish_from_nvml(api: KubeClusterApi, node: str) -> None:
    backend = NvmlGpuBackend(nvml=FakeNvml(gpus=[uncatalogued_model()], node_name=node))
    try:
        inventory = build_inventory(backend.gpus())
    finally:
        backend.close()
    created = api.create(NODES, node_object(node))
    owner: wire.OwnerReference = {
        "apiVersion": "v1",
        "kind": "Node",
        "name": node,
        "uid": created["metadata"]["uid"],
    }
    for slice_obj in build_pool(node=node, gpus=inventory.gpus, generation=1, owner=owner):
        api.create(RESOURCE_SLICES, slice_obj)


def test_generic_class_with_a_cel_selector_allocates_an_nvml_only_profile(
    apiserver: LocalApiServer, stack: ExitStack
) -> None:
    api = cluster_api(apiserver, stack)
    _publish_from_nvml(api, "node-x")
    classes = {c["metadata"]["name"] for c in api.list_objects(DEVICE_CLASSES).items}
    assert "mig-2g.48gb.instaslice.dev" not in classes  # only the generic class can name it
    claim = claim_object(
        "big-claim",
        requests=[
            request(
                profile=None,
                device_class=DEVICE_CLASS_ANY,
                selectors=[profile_expression("2g.48gb")],
                count=2,
            )
        ],
    )
    create_pod_with_claim(api, "big", claim)
    start_controller(apiserver, stack)
    wait_for(lambda: ungated(api, "big"), what="big ungated")
    allocated = api.get(RESOURCE_CLAIMS, name="big-claim", namespace=NS)["status"]["allocation"]
    assert [(r["driver"], r["pool"], r["device"]) for r in allocated["devices"]["results"]] == [
        (DRIVER_NAME, "node-x", "gpu-0-2g-48gb-0"),
        (DRIVER_NAME, "node-x", "gpu-0-2g-48gb-2"),
    ]
