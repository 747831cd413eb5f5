"""Builders of the API objects the slice map is made of (wire JSON, as the API server returns it)."""

from __future__ import annotations

from typing import Any

from api import names
from driver.cluster.port import as_json
from driver.mig.catalog import gpu_model
from driver.resourceslices import GpuInventory, build_pool

JsonObject = dict[str, Any]


def pool(
    node: str, *, gpus: int = 2, model: str = "A100-40GB", generation: int = 1
) -> list[JsonObject]:
    m = gpu_model(model)
    inventory = [
        GpuInventory(
            index=i,
            uuid=f"GPU-{node}-{i}",
            product_name=m.product_name,
            memory_slices=m.memory_slices,
            profiles=m.profiles,
        )
        for i in range(gpus)
    ]
    return [as_json(s) for s in build_pool(node=node, gpus=inventory, generation=generation)]


def claim(
    name: str,
    *devices: str,
    node: str = "node-0",
    namespace: str = "demo",
    uid: str | None = None,
    reserved_for: list[tuple[str, str]] | None = None,
    owner_pod: tuple[str, str] | None = None,
    shadow_for: str | None = None,
    driver: str = names.DRIVER_NAME,
    device_data: dict[str, JsonObject] | None = None,
) -> JsonObject:
    """A claim allocated to ``devices`` of ``node``'s pool."""
    meta: JsonObject = {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"}
    if owner_pod is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": owner_pod[0],
                "uid": owner_pod[1],
                "controller": True,
            }
        ]
    if shadow_for is not None:
        meta["labels"] = {names.SHADOW_CLAIM_LABEL: shadow_for}
    status: JsonObject = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "mig", "driver": driver, "pool": node, "device": d} for d in devices
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        }
    }
    if reserved_for:
        status["reservedFor"] = [{"resource": "pods", "name": n, "uid": u} for n, u in reserved_for]
    if device_data:
        status["devices"] = [
            {"driver": driver, "pool": node, "device": d, "data": data}
            for d, data in device_data.items()
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": {"requests": []}},
        "status": status,
    }


def pod(
    name: str,
    *,
    uid: str | None = None,
    namespace: str = "demo",
    phase: str = "Running",
    gates: tuple[str, ...] = (),
    node: str | None = None,
) -> JsonObject:
    spec: JsonObject = {"containers": [{"name": "app", "image": "busybox"}]}
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"pod-{name}"},
        "spec": spec,
        "status": {"phase": phase},
    }
