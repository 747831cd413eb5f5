"""Device health on real Kubernetes 1.36: the real kubelet reads our health stream (a pod shows an
unhealthy slice in ``allocatedResourcesStatus``; no more ``NodeWatchResources`` errors), and real
kube-scheduler honours the taint we put on an unhealthy GPU's devices.

A GPU is marked unhealthy through the node's emulated state file, as an operator's tool would; the
plugin sees it on its next inventory poll. Each scenario marks the GPU healthy again before it ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from api import names
from driver.cluster.port import PODS, RESOURCE_CLAIMS, RESOURCE_SLICES, JsonObject
from driver.errors import ApiNotFoundError
from driver.gpu.emulated import EmulatedGpuBackend
from driver.taints import UNHEALTHY_TAINT_KEY
from localcluster.realstack import RealStack
from tests.e2e.conftest import E2E_NS
from tests.e2e.helpers import (
    apply,
    claim_pod,
    claim_template,
    dra_pod,
    get_pod,
    wait_for,
    wait_pod_running,
)

POLL_WAIT_S = 40.0
"""The plugin notices a mark within one inventory poll (30 s in this tier); scaled by the stack."""
SYSTEM_NS = "kube-system"
"""Our webhook leaves this namespace alone: kube-scheduler allocates claims of pods there itself."""


def _operator(stack: RealStack, node: str) -> EmulatedGpuBackend:
    state = stack.node_paths(node).emulated_state_file
    return EmulatedGpuBackend(node_name=node, spec=stack.config.gpus, state_file=state)


@contextlib.contextmanager
def unhealthy_gpu(stack: RealStack, node: str, index: int, reason: str) -> Iterator[str]:
    """GPU ``index`` of ``node`` marked unhealthy, and healthy again (untainted) afterwards;
    yields its UUID."""
    operator = _operator(stack, node)
    try:
        operator.set_health(index, healthy=False, reason=reason)
        yield operator.gpus()[index].uuid
    finally:
        operator.set_health(index, healthy=True)
        operator.close()
        wait_for(
            stack,
            lambda: taints_of_gpu(stack, node, index) == set(),
            timeout=POLL_WAIT_S,
            message=f"GPU {index} of {node} untainted again",
        )


def taints_of_gpu(stack: RealStack, node: str, index: int) -> set[str]:
    """The distinct taints (``key=value:effect``) on the published devices of one GPU."""
    found: set[str] = set()
    for obj in stack.api.list_objects(RESOURCE_SLICES).items:
        spec = obj["spec"]
        if spec.get("driver") != names.DRIVER_NAME or spec.get("nodeName") != node:
            continue
        for device in spec.get("devices") or []:
            if device["name"].startswith(f"gpu-{index}-"):
                found |= {
                    f"{t['key']}={t.get('value', '')}:{t['effect']}"
                    for t in device.get("taints") or []
                }
    return found


def _allocated(stack: RealStack, namespace: str, claim: str) -> list[JsonObject]:
    got = stack.api.get(RESOURCE_CLAIMS, name=claim, namespace=namespace)
    allocation = (got.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or [])


def _health_entries(pod: JsonObject | None) -> list[JsonObject]:
    entries: list[JsonObject] = []
    for status in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        for resource in status.get("allocatedResourcesStatus") or []:
            entries.extend(resource.get("resources") or [])
    return entries


def test_the_kubelet_hears_our_health_stream_and_the_pod_shows_its_unhealthy_slice(
    cluster: RealStack,
) -> None:
    apply(cluster, [claim_template("health-1g", profile="1g.5gb", namespace=E2E_NS)])
    apply(cluster, [dra_pod("health-pod", template="health-1g", namespace=E2E_NS)])
    pod = wait_pod_running(cluster, E2E_NS, "health-pod")
    node = str(pod["spec"]["nodeName"])
    (claim_status,) = pod["status"]["resourceClaimStatuses"]
    (result,) = _allocated(cluster, E2E_NS, claim_status["resourceClaimName"])
    gpu = int(str(result["device"]).split("-")[1])

    # healthy first: the kubelet reports what our stream says
    def all_healthy() -> list[JsonObject] | None:
        entries = _health_entries(get_pod(cluster, E2E_NS, "health-pod"))
        return entries if entries and {e.get("health") for e in entries} == {"Healthy"} else None

    healthy = wait_for(cluster, all_healthy, message="the kubelet reporting the slice Healthy")
    assert len(healthy) == 1

    reason = "XID 79: GPU has fallen off the bus (test)"
    with unhealthy_gpu(cluster, node, gpu, reason):
        wait_for(
            cluster,
            lambda: (
                taints_of_gpu(cluster, node, gpu)
                == {f"{UNHEALTHY_TAINT_KEY}=MarkedUnhealthy:NoSchedule"}
            ),
            timeout=POLL_WAIT_S,
            message=f"GPU {gpu} of {node} tainted",
        )
        unhealthy = wait_for(
            cluster,
            lambda: (
                [
                    e
                    for e in _health_entries(get_pod(cluster, E2E_NS, "health-pod"))
                    if e.get("health") == "Unhealthy"
                ]
                or None
            ),
            message="the pod's slice reported Unhealthy",
        )
        assert any(reason in str(e.get("message", "")) for e in unhealthy)
        assert get_pod(cluster, E2E_NS, "health-pod") is not None  # NoSchedule: the pod stays

    errors = [
        line
        for line in cluster.kubelet(node).error_lines()
        if "NodeWatchResources" in line or "DRAResourceHealth" in line
    ]
    assert errors == []


def _system_claim(name: str, *, parent_uuid: str, tolerate: bool) -> JsonObject:
    exactly: JsonObject = {
        "deviceClassName": names.profile_device_class("1g.5gb"),
        "selectors": [
            {
                "cel": {
                    "expression": f'device.attributes["{names.DRIVER_NAME}"].parentUUID == '
                    f'"{parent_uuid}"'
                }
            }
        ],
    }
    if tolerate:
        exactly["tolerations"] = [{"key": UNHEALTHY_TAINT_KEY, "operator": "Exists"}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": SYSTEM_NS},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": exactly}]}},
    }


def _unschedulable(stack: RealStack, name: str) -> str | None:
    pod = get_pod(stack, SYSTEM_NS, name)
    for condition in ((pod or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return str(condition.get("message", ""))
    return None


@pytest.fixture
def system_objects(cluster: RealStack) -> Iterator[list[tuple[str, str]]]:
    """(kind, name) of what a test makes in kube-system; deleted (and waited for) afterwards."""
    made: list[tuple[str, str]] = []
    yield made
    for kind, name in made:
        resource = PODS if kind == "Pod" else RESOURCE_CLAIMS
        with contextlib.suppress(ApiNotFoundError):
            cluster.api.delete(resource, name=name, namespace=SYSTEM_NS)

    def gone() -> bool:
        for kind, name in made:
            resource = PODS if kind == "Pod" else RESOURCE_CLAIMS
            try:
                cluster.api.get(resource, name=name, namespace=SYSTEM_NS)
            except ApiNotFoundError:
                continue
            return False
        return True

    wait_for(cluster, gone, timeout=60, message="kube-system test objects deleted")


def test_kube_scheduler_allocates_a_tainted_device_only_to_a_tolerating_claim(
    cluster: RealStack, system_objects: list[tuple[str, str]]
) -> None:
    node = cluster.node_names[0]
    with unhealthy_gpu(cluster, node, 1, "row remapping failed (test)") as uuid:
        wait_for(
            cluster,
            lambda: bool(taints_of_gpu(cluster, node, 1)),
            timeout=POLL_WAIT_S,
            message=f"GPU 1 of {node} tainted",
        )
        for kind, name in (
            ("ResourceClaim", "taint-plain"),
            ("Pod", "taint-plain"),
            ("ResourceClaim", "taint-tolerant"),
            ("Pod", "taint-tolerant"),
        ):
            system_objects.append((kind, name))  # fmt: skip
        apply(cluster, [_system_claim("taint-plain", parent_uuid=uuid, tolerate=False)])
        apply(cluster, [claim_pod("taint-plain", claim="taint-plain", namespace=SYSTEM_NS)])
        message = wait_for(
            cluster,
            lambda: _unschedulable(cluster, "taint-plain"),
            message="kube-scheduler refusing the pod whose only devices are tainted",
        )
        assert "claim" in message.lower()
        assert _allocated(cluster, SYSTEM_NS, "taint-plain") == []

        apply(cluster, [_system_claim("taint-tolerant", parent_uuid=uuid, tolerate=True)])
        apply(cluster, [claim_pod("taint-tolerant", claim="taint-tolerant", namespace=SYSTEM_NS)])
        pod = wait_pod_running(cluster, SYSTEM_NS, "taint-tolerant")
        assert pod["spec"]["nodeName"] == node
        (result,) = _allocated(cluster, SYSTEM_NS, "taint-tolerant")
        assert str(result["device"]).startswith("gpu-1-1g-5gb-")
        assert _unschedulable(cluster, "taint-plain") is not None  # still refused

        for kind, name in system_objects:
            resource = PODS if kind == "Pod" else RESOURCE_CLAIMS
            with contextlib.suppress(ApiNotFoundError):
                cluster.api.delete(resource, name=name, namespace=SYSTEM_NS)
