"""The kubelet's pod-resources API (``v1.PodResourcesLister``) for one emulated node.

``List`` reports every active pod of the node (not terminal, not deleted) with, per container, the
device-plugin device ids it holds (``devices``) and its prepared DRA devices
(``dynamic_resources``: claim name/namespace, driver, pool, device, CDI ids); ``Get`` one pod by
name; ``GetAllocatableResources`` the healthy device-plugin devices. This is how a device plugin
learns which pod got the ids it was asked to ``Allocate``. CPU and memory assignments are empty
(no CPU or memory manager here).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import grpc

from driver.cluster.port import JsonObject, name_of, namespace_of, uid_of
from localcluster.cluster.devicemanager import ContainerAllocation
from localcluster.cluster.dramanager import ClaimDevice
from protos.podresources.v1 import api_pb2 as pr
from protos.podresources.v1 import api_pb2_grpc as pr_grpc


class PodResourcesSource(Protocol):
    def active_pods(self) -> Sequence[JsonObject]: ...

    def device_allocations(self, pod_uid: str, container: str) -> list[ContainerAllocation]: ...

    def claim_devices(self, pod: JsonObject, container: JsonObject) -> list[ClaimDevice]: ...

    def allocatable_devices(self) -> dict[str, list[str]]: ...


def pod_resources(source: PodResourcesSource, pod: JsonObject) -> pr.PodResources:
    spec = pod.get("spec") or {}
    containers = list(spec.get("containers") or [])
    # sidecars (restartable init containers) are listed too, as the kubelet does
    containers += [
        c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"
    ]
    result = pr.PodResources(name=name_of(pod), namespace=namespace_of(pod) or "")
    for container in containers:
        name = str(container.get("name"))
        entry = result.containers.add(name=name)
        for allocation in source.device_allocations(uid_of(pod), name):
            entry.devices.add(resource_name=allocation.resource, device_ids=allocation.device_ids)
        by_claim: dict[tuple[str, str], pr.DynamicResource] = {}
        for device in source.claim_devices(pod, container):
            key = (device.claim_namespace, device.claim_name)
            dynamic = by_claim.get(key)
            if dynamic is None:
                dynamic = entry.dynamic_resources.add(
                    claim_name=device.claim_name, claim_namespace=device.claim_namespace
                )
                by_claim[key] = dynamic
            dynamic.claim_resources.add(
                driver_name=device.driver,
                pool_name=device.device.pool,
                device_name=device.device.device,
                cdi_devices=[pr.CDIDevice(name=n) for n in device.device.cdi_device_ids],
            )
    return result


class PodResourcesServicer(pr_grpc.PodResourcesListerServicer):
    def __init__(self, source: PodResourcesSource) -> None:
        self._source = source

    def List(  # noqa: N802 - gRPC method name
        self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr.ListPodResourcesResponse:
        pods = self._source.active_pods()
        return pr.ListPodResourcesResponse(
            pod_resources=[pod_resources(self._source, pod) for pod in pods]
        )

    def Get(  # noqa: N802 - gRPC method name
        self, request: pr.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr.GetPodResourcesResponse:
        for pod in self._source.active_pods():
            if name_of(pod) == request.pod_name and namespace_of(pod) == request.pod_namespace:
                return pr.GetPodResourcesResponse(pod_resources=pod_resources(self._source, pod))
        context.abort(
            grpc.StatusCode.NOT_FOUND,
            f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
        )
        raise AssertionError("unreachable")

    def GetAllocatableResources(  # noqa: N802 - gRPC method name
        self, request: pr.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pr.AllocatableResourcesResponse:
        response = pr.AllocatableResourcesResponse()
        for resource, ids in sorted(self._source.allocatable_devices().items()):
            response.devices.add(resource_name=resource, device_ids=ids)
        return response
