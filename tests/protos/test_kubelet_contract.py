"""The generated descriptors carry exactly the kubelet's packages, gRPC method paths and fields.

Expected values are literals copied from the kubelet's api.proto files (see
docs/design.md F20): a renamed
service or a renumbered field would break the wire contract without any other test noticing.
"""

from __future__ import annotations

import subprocess
import sys
from types import ModuleType

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor

from protos import generate
from protos.deviceplugin.v1beta1 import api_pb2 as deviceplugin
from protos.dra.v1 import api_pb2 as dra_v1
from protos.dra.v1beta1 import api_pb2 as dra_v1beta1
from protos.drahealth.v1alpha1 import api_pb2 as drahealth
from protos.pluginregistration import api_pb2 as pluginregistration
from protos.podresources.v1 import api_pb2 as podresources

REPO_ROOT = generate.REPO_ROOT

GENERATED_MODULES = [
    f"protos.{api}{kind}"
    for api in (
        "dra.v1.api",
        "dra.v1beta1.api",
        "drahealth.v1alpha1.api",
        "pluginregistration.api",
        "deviceplugin.v1beta1.api",
        "podresources.v1.api",
    )
    for kind in ("_pb2", "_pb2_grpc")
]


def test_all_generated_modules_import_together_in_a_fresh_process() -> None:
    # Two APIs use the bare packages `v1beta1` / `v1`; distinct .proto paths keep them apart in
    # the default descriptor pool. A fresh interpreter with warnings as errors also catches a
    # protobuf / grpcio runtime older or newer than the generator supports.
    imports = "; ".join(f"import {name}" for name in GENERATED_MODULES)
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", imports],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("module", "package"),
    [
        (dra_v1, "k8s.io.kubelet.pkg.apis.dra.v1"),
        (dra_v1beta1, "k8s.io.kubelet.pkg.apis.dra.v1beta1"),
        (drahealth, "v1alpha1"),
        (pluginregistration, "pluginregistration"),
        (deviceplugin, "v1beta1"),
        (podresources, "v1"),
    ],
    ids=["dra-v1", "dra-v1beta1", "dra-health", "registration", "deviceplugin", "podresources"],
)
def test_proto_package_and_no_imports(module: ModuleType, package: str) -> None:
    descriptor: FileDescriptor = module.DESCRIPTOR
    assert descriptor.package == package
    assert list(descriptor.dependencies) == []  # no gogoproto, nothing else


def _methods(module: ModuleType) -> dict[str, str]:
    """Full gRPC path -> "unary" or "server-streaming", read from the file's service descriptors."""
    descriptor: FileDescriptor = module.DESCRIPTOR
    paths: dict[str, str] = {}
    for service in descriptor.services_by_name.values():
        for method in service.methods:
            assert not method.client_streaming
            kind = "server-streaming" if method.server_streaming else "unary"
            paths[f"/{service.full_name}/{method.name}"] = kind
    return paths


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        (
            dra_v1,
            {
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources": "unary",
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources": "unary",
            },
        ),
        (
            dra_v1beta1,
            {
                "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources": "unary",
                "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources": "unary",
            },
        ),
        (
            drahealth,
            {"/v1alpha1.DRAResourceHealth/NodeWatchResources": "server-streaming"},
        ),
        (
            pluginregistration,
            {
                "/pluginregistration.Registration/GetInfo": "unary",
                "/pluginregistration.Registration/NotifyRegistrationStatus": "unary",
            },
        ),
        (
            deviceplugin,
            {
                "/v1beta1.Registration/Register": "unary",
                "/v1beta1.DevicePlugin/GetDevicePluginOptions": "unary",
                "/v1beta1.DevicePlugin/ListAndWatch": "server-streaming",
                "/v1beta1.DevicePlugin/GetPreferredAllocation": "unary",
                "/v1beta1.DevicePlugin/Allocate": "unary",
                "/v1beta1.DevicePlugin/PreStartContainer": "unary",
            },
        ),
        (
            podresources,
            {
                "/v1.PodResourcesLister/List": "unary",
                "/v1.PodResourcesLister/GetAllocatableResources": "unary",
                "/v1.PodResourcesLister/Get": "unary",
            },
        ),
    ],
    ids=["dra-v1", "dra-v1beta1", "dra-health", "registration", "deviceplugin", "podresources"],
)
def test_grpc_method_paths_are_the_kubelets(module: ModuleType, expected: dict[str, str]) -> None:
    assert _methods(module) == expected


_SCALARS = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_UINT64: "uint64",
}


def _type_name(field: FieldDescriptor) -> str:
    if field.message_type is not None:
        return field.message_type.name
    if field.enum_type is not None:
        return field.enum_type.name
    return _SCALARS[field.type]


def _render(field: FieldDescriptor) -> str:
    """The field's type as written in a .proto file, e.g. `repeated string`, `map<string, X>`."""
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
        return f"map<{_type_name(key)}, {_type_name(value)}>"
    if field.is_repeated:
        return f"repeated {_type_name(field)}"
    if field.has_presence and field.message_type is None:
        return f"optional {_type_name(field)}"
    return _type_name(field)


def _fields(message: Descriptor) -> dict[str, tuple[int, str]]:
    return {field.name: (field.number, _render(field)) for field in message.fields}


_DRA_COMMON: dict[str, dict[str, tuple[int, str]]] = {
    "NodePrepareResourcesRequest": {"claims": (1, "repeated Claim")},
    "NodePrepareResourcesResponse": {
        "claims": (1, "map<string, NodePrepareResourceResponse>"),
    },
    "NodePrepareResourceResponse": {
        "devices": (1, "repeated Device"),
        "error": (2, "string"),
    },
    "NodeUnprepareResourcesRequest": {"claims": (1, "repeated Claim")},
    "NodeUnprepareResourcesResponse": {
        "claims": (1, "map<string, NodeUnprepareResourceResponse>"),
    },
    "NodeUnprepareResourceResponse": {"error": (1, "string")},
    "Claim": {"namespace": (1, "string"), "uid": (2, "string"), "name": (3, "string")},
}
_DRA_DEVICE_V1BETA1 = {
    "request_names": (1, "repeated string"),
    "pool_name": (2, "string"),
    "device_name": (3, "string"),
    "cdi_device_ids": (4, "repeated string"),
}

FIELD_TABLE: list[tuple[str, ModuleType, str, dict[str, tuple[int, str]]]] = [
    *(("dra-v1", dra_v1, name, fields) for name, fields in _DRA_COMMON.items()),
    ("dra-v1", dra_v1, "Device", {**_DRA_DEVICE_V1BETA1, "share_id": (5, "optional string")}),
    *(("dra-v1beta1", dra_v1beta1, name, fields) for name, fields in _DRA_COMMON.items()),
    ("dra-v1beta1", dra_v1beta1, "Device", _DRA_DEVICE_V1BETA1),
    ("dra-health", drahealth, "NodeWatchResourcesRequest", {}),
    (
        "dra-health",
        drahealth,
        "DeviceIdentifier",
        {"pool_name": (1, "string"), "device_name": (2, "string")},
    ),
    (
        "dra-health",
        drahealth,
        "DeviceHealth",
        {
            "device": (1, "DeviceIdentifier"),
            "health": (2, "HealthStatus"),
            "last_updated_time": (3, "int64"),
            "health_check_timeout_seconds": (4, "int64"),
            "message": (5, "string"),
        },
    ),
    (
        "dra-health",
        drahealth,
        "NodeWatchResourcesResponse",
        {"devices": (1, "repeated DeviceHealth")},
    ),
    (
        "registration",
        pluginregistration,
        "PluginInfo",
        {
            "type": (1, "string"),
            "name": (2, "string"),
            "endpoint": (3, "string"),
            "supported_versions": (4, "repeated string"),
        },
    ),
    (
        "registration",
        pluginregistration,
        "RegistrationStatus",
        {"plugin_registered": (1, "bool"), "error": (2, "string")},
    ),
    ("registration", pluginregistration, "RegistrationStatusResponse", {}),
    ("registration", pluginregistration, "InfoRequest", {}),
    (
        "deviceplugin",
        deviceplugin,
        "DevicePluginOptions",
        {"pre_start_required": (1, "bool"), "get_preferred_allocation_available": (2, "bool")},
    ),
    (
        "deviceplugin",
        deviceplugin,
        "RegisterRequest",
        {
            "version": (1, "string"),
            "endpoint": (2, "string"),
            "resource_name": (3, "string"),
            "options": (4, "DevicePluginOptions"),
        },
    ),
    ("deviceplugin", deviceplugin, "Empty", {}),
    ("deviceplugin", deviceplugin, "ListAndWatchResponse", {"devices": (1, "repeated Device")}),
    ("deviceplugin", deviceplugin, "TopologyInfo", {"nodes": (1, "repeated NUMANode")}),
    ("deviceplugin", deviceplugin, "NUMANode", {"ID": (1, "int64")}),
    (
        "deviceplugin",
        deviceplugin,
        "Device",
        {"ID": (1, "string"), "health": (2, "string"), "topology": (3, "TopologyInfo")},
    ),
    (
        "deviceplugin",
        deviceplugin,
        "PreStartContainerRequest",
        {"devices_ids": (1, "repeated string")},
    ),
    ("deviceplugin", deviceplugin, "PreStartContainerResponse", {}),
    (
        "deviceplugin",
        deviceplugin,
        "PreferredAllocationRequest",
        {"container_requests": (1, "repeated ContainerPreferredAllocationRequest")},
    ),
    (
        "deviceplugin",
        deviceplugin,
        "ContainerPreferredAllocationRequest",
        {
            "available_deviceIDs": (1, "repeated string"),
            "must_include_deviceIDs": (2, "repeated string"),
            "allocation_size": (3, "int32"),
        },
    ),
    (
        "deviceplugin",
        deviceplugin,
        "PreferredAllocationResponse",
        {"container_responses": (1, "repeated ContainerPreferredAllocationResponse")},
    ),
    (
        "deviceplugin",
        deviceplugin,
        "ContainerPreferredAllocationResponse",
        {"deviceIDs": (1, "repeated string")},
    ),
    (
        "deviceplugin",
        deviceplugin,
        "AllocateRequest",
        {"container_requests": (1, "repeated ContainerAllocateRequest")},
    ),
    (
        "deviceplugin",
        deviceplugin,
        "ContainerAllocateRequest",
        {"devices_ids": (1, "repeated string")},
    ),
    ("deviceplugin", deviceplugin, "CDIDevice", {"name": (1, "string")}),
    (
        "deviceplugin",
        deviceplugin,
        "AllocateResponse",
        {"container_responses": (1, "repeated ContainerAllocateResponse")},
    ),
    (
        "deviceplugin",
        deviceplugin,
        "ContainerAllocateResponse",
        {
            "envs": (1, "map<string, string>"),
            "mounts": (2, "repeated Mount"),
            "devices": (3, "repeated DeviceSpec"),
            "annotations": (4, "map<string, string>"),
            "cdi_devices": (5, "repeated CDIDevice"),
        },
    ),
    (
        "deviceplugin",
        deviceplugin,
        "Mount",
        {"container_path": (1, "string"), "host_path": (2, "string"), "read_only": (3, "bool")},
    ),
    (
        "deviceplugin",
        deviceplugin,
        "DeviceSpec",
        {"container_path": (1, "string"), "host_path": (2, "string"), "permissions": (3, "string")},
    ),
    ("podresources", podresources, "ListPodResourcesRequest", {}),
    ("podresources", podresources, "AllocatableResourcesRequest", {}),
    (
        "podresources",
        podresources,
        "ListPodResourcesResponse",
        {"pod_resources": (1, "repeated PodResources")},
    ),
    (
        "podresources",
        podresources,
        "GetPodResourcesRequest",
        {"pod_name": (1, "string"), "pod_namespace": (2, "string")},
    ),
    (
        "podresources",
        podresources,
        "GetPodResourcesResponse",
        {"pod_resources": (1, "PodResources")},
    ),
    (
        "podresources",
        podresources,
        "AllocatableResourcesResponse",
        {
            "devices": (1, "repeated ContainerDevices"),
            "cpu_ids": (2, "repeated int64"),
            "memory": (3, "repeated ContainerMemory"),
        },
    ),
    (
        "podresources",
        podresources,
        "PodResources",
        {
            "name": (1, "string"),
            "namespace": (2, "string"),
            "containers": (3, "repeated ContainerResources"),
        },
    ),
    (
        "podresources",
        podresources,
        "ContainerResources",
        {
            "name": (1, "string"),
            "devices": (2, "repeated ContainerDevices"),
            "cpu_ids": (3, "repeated int64"),
            "memory": (4, "repeated ContainerMemory"),
            "dynamic_resources": (5, "repeated DynamicResource"),
        },
    ),
    (
        "podresources",
        podresources,
        "ContainerMemory",
        {"memory_type": (1, "string"), "size": (2, "uint64"), "topology": (3, "TopologyInfo")},
    ),
    (
        "podresources",
        podresources,
        "ContainerDevices",
        {
            "resource_name": (1, "string"),
            "device_ids": (2, "repeated string"),
            "topology": (3, "TopologyInfo"),
        },
    ),
    ("podresources", podresources, "TopologyInfo", {"nodes": (1, "repeated NUMANode")}),
    ("podresources", podresources, "NUMANode", {"ID": (1, "int64")}),
    (
        "podresources",
        podresources,
        "DynamicResource",
        {
            "claim_name": (2, "string"),
            "claim_namespace": (3, "string"),
            "claim_resources": (4, "repeated ClaimResource"),
        },
    ),
    (
        "podresources",
        podresources,
        "ClaimResource",
        {
            "cdi_devices": (1, "repeated CDIDevice"),
            "driver_name": (2, "string"),
            "pool_name": (3, "string"),
            "device_name": (4, "string"),
            "share_id": (5, "optional string"),
        },
    ),
    ("podresources", podresources, "CDIDevice", {"name": (1, "string")}),
]


@pytest.mark.parametrize(
    ("module", "message", "expected"),
    [(module, message, fields) for _, module, message, fields in FIELD_TABLE],
    ids=[f"{api}-{message}" for api, _, message, _ in FIELD_TABLE],
)
def test_field_names_numbers_and_types_are_the_kubelets(
    module: ModuleType, message: str, expected: dict[str, tuple[int, str]]
) -> None:
    descriptor: FileDescriptor = module.DESCRIPTOR
    assert _fields(descriptor.message_types_by_name[message]) == expected


@pytest.mark.parametrize(
    ("module", "messages"),
    [
        (dra_v1, {*_DRA_COMMON, "Device"}),
        (dra_v1beta1, {*_DRA_COMMON, "Device"}),
        (drahealth, {m for api, _, m, _ in FIELD_TABLE if api == "dra-health"}),
        (pluginregistration, {m for api, _, m, _ in FIELD_TABLE if api == "registration"}),
        (deviceplugin, {m for api, _, m, _ in FIELD_TABLE if api == "deviceplugin"}),
        (podresources, {m for api, _, m, _ in FIELD_TABLE if api == "podresources"}),
    ],
    ids=["dra-v1", "dra-v1beta1", "dra-health", "registration", "deviceplugin", "podresources"],
)
def test_field_table_covers_every_message(module: ModuleType, messages: set[str]) -> None:
    descriptor: FileDescriptor = module.DESCRIPTOR
    assert set(descriptor.message_types_by_name) == messages


def test_health_status_enum_values() -> None:
    descriptor: FileDescriptor = drahealth.DESCRIPTOR
    enum = descriptor.enum_types_by_name["HealthStatus"]
    assert {value.name: value.number for value in enum.values} == {
        "UNKNOWN": 0,
        "HEALTHY": 1,
        "UNHEALTHY": 2,
    }
