"""A small cluster for the planning commands: two nodes of one A100-40GB each, three pods holding
slices (``populate``), created through the API like the allocator would leave them."""

from __future__ import annotations

from driver.cluster.kube import KubeClusterApi
from driver.cluster.port import PODS, RESOURCE_CLAIMS, RESOURCE_SLICES
from tests.cli.objects import claim, pod, pool


def allocated(api: KubeClusterApi, name: str, device: str, *, node: str, holder: str) -> None:
    created_pod = pod(holder, namespace="default", phase="Running", node=node)
    created_pod["metadata"].pop("uid")
    made = api.create(PODS, created_pod)
    body = claim(name, device, node=node, namespace="default",
                 reserved_for=[(holder, made["metadata"]["uid"])])  # fmt: skip
    status = body.pop("status")
    body["metadata"].pop("uid")
    body["spec"] = {
        "devices": {
            "requests": [{"name": "mig", "exactly": {"deviceClassName": "mig.instaslice.dev"}}]
        }
    }
    created = api.create(RESOURCE_CLAIMS, body)
    status["allocation"]["allocationTimestamp"] = "2026-01-01T00:00:00Z"
    api.update_status(RESOURCE_CLAIMS, {**created, "status": status})


def populate(api: KubeClusterApi) -> None:
    """Two nodes with one A100-40GB each: node-0 holds 1g slices at 0 and 6 (pods a, b),
    node-1 a 3g at 0 (pod c). No 7g fits; moving a and b to node-1 frees node-0."""
    for obj in pool("node-0", gpus=1) + pool("node-1", gpus=1):
        api.create(RESOURCE_SLICES, obj)
    allocated(api, "a-mig", "gpu-0-1g-5gb-0", node="node-0", holder="a")
    allocated(api, "b-mig", "gpu-0-1g-5gb-6", node="node-0", holder="b")
    allocated(api, "c-mig", "gpu-0-3g-20gb-0", node="node-1", holder="c")
