"""Minimal valid objects of every kind the port serves, as wire JSON."""

from __future__ import annotations

from api.names import DRIVER_NAME, SCHEDULING_GATE
from driver.cluster.port import JsonObject

NAMESPACE = "default"


def pod(
    name: str, *, gates: list[str] | None = None, labels: dict[str, str] | None = None
) -> JsonObject:
    spec: JsonObject = {"containers": [{"name": "main", "image": "busybox"}]}
    if gates is None:
        gates = [SCHEDULING_GATE]
    if gates:
        spec["schedulingGates"] = [{"name": gate} for gate in gates]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels or {}},
        "spec": spec,
    }


def node(name: str) -> JsonObject:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
    }


def claim_spec() -> JsonObject:
    return {
        "devices": {
            "requests": [
                {
                    "name": "mig",
                    "exactly": {
                        "deviceClassName": "mig-1g.5gb.instaslice.dev",
                        "allocationMode": "ExactCount",
                        "count": 1,
                        "selectors": [
                            {
                                "cel": {
                                    "expression": f'device.attributes["{DRIVER_NAME}"].profile == "1g.5gb"'
                                }
                            }
                        ],
                    },
                }
            ]
        }
    }


def claim(name: str, *, labels: dict[str, str] | None = None) -> JsonObject:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels or {}},
        "spec": claim_spec(),
    }


def claim_template(name: str) -> JsonObject:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"spec": claim_spec()},
    }


def resource_slice(name: str, *, node_name: str) -> JsonObject:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER_NAME,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "gpu-0-1g-5gb-0",
                    "attributes": {
                        "profile": {"string": "1g.5gb"},
                        "gpuIndex": {"int": 0},
                    },
                    "capacity": {"memory": {"value": "5Gi"}},
                }
            ],
        },
    }


def device_class(name: str) -> JsonObject:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {
            "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}],
        },
    }


def lease(name: str) -> JsonObject:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"holderIdentity": "someone", "leaseDurationSeconds": 15},
    }


def event(name: str) -> JsonObject:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "involvedObject": {"kind": "Pod", "namespace": NAMESPACE, "name": "p", "apiVersion": "v1"},
        "reason": "Testing",
        "message": "hello",
        "type": "Normal",
        "count": 1,
        "firstTimestamp": "2026-01-01T00:00:00Z",
        "lastTimestamp": "2026-01-01T00:00:00Z",
        "source": {"component": "tests"},
    }
