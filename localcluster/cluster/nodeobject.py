"""The Node object an emulated kubelet registers and keeps up to date (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from driver.cluster.port import JsonObject

if TYPE_CHECKING:
    from localcluster.cluster.kubelet import NodeSpec

KUBELET_VERSION = "v1.36.0-localcluster"
MIG_CAPABLE_LABEL = "nvidia.com/mig.capable"


def node_object(
    spec: NodeSpec, device_resources: Mapping[str, tuple[int, int]], *, host_ip: str, now: str
) -> JsonObject:
    """``device_resources``: resource -> (capacity, allocatable) from the device manager."""
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        MIG_CAPABLE_LABEL: "true",
        **spec.labels,
    }
    base = {"cpu": spec.cpu, "memory": spec.memory, "pods": str(spec.pods),
            "ephemeral-storage": "100Gi"}  # fmt: skip
    capacity = {**base, **{r: str(c) for r, (c, _) in device_resources.items()}}
    allocatable = {**base, **{r: str(a) for r, (_, a) in device_resources.items()}}

    def condition(kind: str, status: str, reason: str, message: str) -> JsonObject:
        return {"type": kind, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip

    node: JsonObject = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels},
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": [
                condition(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                condition(
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                ),
                condition(
                    "PIDPressure",
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
                condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": host_ip},
                {"type": "Hostname", "address": spec.name},
            ],
            "nodeInfo": {
                "kubeletVersion": KUBELET_VERSION,
                "containerRuntimeVersion": "localcluster://1.0",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "osImage": "localcluster",
                "kernelVersion": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kubeProxyVersion": "",
            },
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        },
    }
    if spec.taints:
        node["spec"]["taints"] = [dict(t) for t in spec.taints]
    return node
