"""``resource.k8s.io/v1`` (DRA): the ResourceClaims and ResourceSlices we write."""

from __future__ import annotations

from typing import Any, Literal, Required, TypedDict

from api.wire.core import NodeSelector
from api.wire.meta import ObjectMeta

# -- ResourceClaim ---------------------------------------------------------------------------


class ExactDeviceRequest(TypedDict, total=False):
    deviceClassName: Required[str]
    allocationMode: Literal["ExactCount", "All"]
    count: int


class DeviceRequest(TypedDict, total=False):
    name: Required[str]
    exactly: ExactDeviceRequest


class DeviceClaim(TypedDict, total=False):
    requests: list[DeviceRequest]


class ResourceClaimSpec(TypedDict, total=False):
    devices: DeviceClaim


class OpaqueDeviceConfiguration(TypedDict):
    driver: str
    parameters: Any
    """The driver's own object (for ours, ``api.config.MigDeviceConfig``), copied as written."""


class DeviceAllocationConfiguration(TypedDict, total=False):
    source: Required[Literal["FromClass", "FromClaim"]]
    requests: list[str]
    opaque: OpaqueDeviceConfiguration


class DeviceRequestAllocationResult(TypedDict):
    request: str
    driver: str
    pool: str
    device: str


class DeviceAllocationResult(TypedDict, total=False):
    results: list[DeviceRequestAllocationResult]
    config: list[DeviceAllocationConfiguration]


class AllocationResult(TypedDict, total=False):
    devices: DeviceAllocationResult
    nodeSelector: NodeSelector
    allocationTimestamp: str


class ResourceClaimConsumerReference(TypedDict):
    """An entry of ``status.reservedFor``."""

    resource: str
    name: str
    uid: str


class AllocatedDeviceStatus(TypedDict, total=False):
    """An entry of ``status.devices``: what the driver says about one allocated device."""

    driver: Required[str]
    pool: Required[str]
    device: Required[str]
    data: dict[str, Any]


class ResourceClaimStatus(TypedDict, total=False):
    allocation: AllocationResult
    reservedFor: list[ResourceClaimConsumerReference]
    devices: list[AllocatedDeviceStatus]


class ResourceClaim(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: Required[ResourceClaimSpec]
    status: ResourceClaimStatus


# -- ResourceSlice ---------------------------------------------------------------------------


class DeviceAttribute(TypedDict, total=False):
    """Exactly one of the four."""

    int: int
    bool: bool
    string: str
    version: str


class DeviceCapacity(TypedDict):
    value: str
    """A quantity (``"5Gi"``, ``"14"``)."""


class Counter(TypedDict):
    value: str


class CounterSet(TypedDict):
    name: str
    counters: dict[str, Counter]


class DeviceCounterConsumption(TypedDict):
    counterSet: str
    counters: dict[str, Counter]


class DeviceTaint(TypedDict, total=False):
    key: Required[str]
    value: str
    effect: Required[str]
    """``NoSchedule``, ``NoExecute`` or ``None``."""
    timeAdded: str


class Device(TypedDict, total=False):
    name: Required[str]
    attributes: dict[str, DeviceAttribute]
    capacity: dict[str, DeviceCapacity]
    consumesCounters: list[DeviceCounterConsumption]
    taints: list[DeviceTaint]


class ResourcePool(TypedDict):
    name: str
    generation: int
    resourceSliceCount: int


class ResourceSliceSpec(TypedDict, total=False):
    driver: Required[str]
    pool: Required[ResourcePool]
    nodeName: str
    devices: list[Device]
    sharedCounters: list[CounterSet]


class ResourceSlice(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: Required[ResourceSliceSpec]
