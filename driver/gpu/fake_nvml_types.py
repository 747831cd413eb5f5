"""The ctypes structures and the error class ``driver.gpu.fake_nvml`` answers with.

Same names and field names as pynvml's (nvml.h's), so code reading them cannot tell the difference;
opaque handles (device, GPU instance, MIG device) are plain 64-bit integers here.
"""
# Names below are pynvml's and nvml.h's, hence not PEP 8:
# ruff: noqa: N801

import ctypes
from typing import Final

from driver.gpu import nvml_api as api

NAME_SIZE: Final = 96

_ERROR_TEXT: Final = {
    api.NVML_ERROR_UNINITIALIZED: "Uninitialized",
    api.NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    api.NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    api.NVML_ERROR_NOT_FOUND: "Not Found",
    api.NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    api.NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    api.NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    api.NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    api.NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    api.NVML_ERROR_UNKNOWN: "Unknown Error",
    api.NVML_ERROR_IN_USE: "In use by another client",
    api.NVML_ERROR_TIMEOUT: "Timeout",
    api.NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient Resources",
}


class FakeNvmlError(Exception):
    """pynvml's ``NVMLError``: ``value`` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_TEXT.get(self.value, f"NVML Error with code {self.value}")


class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class c_nvmlComputeInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


_GI_PROFILE_FIELDS: Final = [
    ("id", ctypes.c_uint),
    ("isP2pSupported", ctypes.c_uint),
    ("sliceCount", ctypes.c_uint),
    ("instanceCount", ctypes.c_uint),
    ("multiprocessorCount", ctypes.c_uint),
    ("copyEngineCount", ctypes.c_uint),
    ("decoderCount", ctypes.c_uint),
    ("encoderCount", ctypes.c_uint),
    ("jpegCount", ctypes.c_uint),
    ("ofaCount", ctypes.c_uint),
    ("memorySizeMB", ctypes.c_ulonglong),
]


class c_nvmlGpuInstanceProfileInfo_t(ctypes.Structure):
    _fields_ = _GI_PROFILE_FIELDS


class c_nvmlGpuInstanceProfileInfo_v2_t(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        *_GI_PROFILE_FIELDS,
        ("name", ctypes.c_char * NAME_SIZE),
    ]


_CI_PROFILE_FIELDS: Final = [
    ("id", ctypes.c_uint),
    ("sliceCount", ctypes.c_uint),
    ("instanceCount", ctypes.c_uint),
    ("multiprocessorCount", ctypes.c_uint),
    ("sharedCopyEngineCount", ctypes.c_uint),
    ("sharedDecoderCount", ctypes.c_uint),
    ("sharedEncoderCount", ctypes.c_uint),
    ("sharedJpegCount", ctypes.c_uint),
    ("sharedOfaCount", ctypes.c_uint),
]


class c_nvmlComputeInstanceProfileInfo_t(ctypes.Structure):
    _fields_ = _CI_PROFILE_FIELDS


class c_nvmlComputeInstanceProfileInfo_v2_t(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        *_CI_PROFILE_FIELDS,
        ("name", ctypes.c_char * NAME_SIZE),
    ]


class c_nvmlGpuInstanceInfo_t(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_uint64),
        ("id", ctypes.c_uint),
        ("profileId", ctypes.c_uint),
        ("placement", c_nvmlGpuInstancePlacement_t),
    ]


class c_nvmlComputeInstanceInfo_t(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_uint64),
        ("gpuInstance", ctypes.c_uint64),
        ("id", ctypes.c_uint),
        ("profileId", ctypes.c_uint),
        ("placement", c_nvmlComputeInstancePlacement_t),
    ]


class c_nvmlMemory_t(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class c_nvmlUtilization_t(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]
