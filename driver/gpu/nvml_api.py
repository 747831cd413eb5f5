# Names below are pynvml's, hence not PEP 8:
# ruff: noqa: N802, N803
"""The slice of the ``pynvml`` API the NVML backend calls, as a Protocol, and the NVML constants.

``driver.gpu.nvml`` talks to whatever object satisfies ``NvmlLibrary``: the real ``pynvml`` module
by default, ``driver.gpu.fake_nvml.FakeNvml`` in tests. Names and signatures are pynvml's
(``nvidia-ml-py``); the constants are ``nvml.h``'s and fixed by the C ABI, so they live here and
neither the backend nor the fake imports ``pynvml`` for them.

NVML conventions both sides follow: handles are opaque; a failing call raises
``NvmlLibrary.NVMLError`` whose ``value`` is an ``NVML_ERROR_*`` code; structures are ctypes
structures with nvml.h's field names; "Ref" arguments are ctypes pointers (``ctypes.pointer``) or
ctypes arrays, ``None`` where NVML allows NULL (to ask for a count).
"""

from typing import Any, Final, Protocol

from driver.mig.model import CI_PROFILE_BY_COMPUTE_SLICES

# nvml.h return codes (the ones the backend tells apart).
NVML_ERROR_UNINITIALIZED: Final = 1
NVML_ERROR_INVALID_ARGUMENT: Final = 2
NVML_ERROR_NOT_SUPPORTED: Final = 3
NVML_ERROR_NO_PERMISSION: Final = 4
NVML_ERROR_NOT_FOUND: Final = 6
NVML_ERROR_INSUFFICIENT_SIZE: Final = 7
NVML_ERROR_DRIVER_NOT_LOADED: Final = 9
NVML_ERROR_LIBRARY_NOT_FOUND: Final = 12
NVML_ERROR_TIMEOUT: Final = 10
NVML_ERROR_FUNCTION_NOT_FOUND: Final = 13
NVML_ERROR_GPU_IS_LOST: Final = 15
NVML_ERROR_RESET_REQUIRED: Final = 16
NVML_ERROR_IN_USE: Final = 19
NVML_ERROR_INSUFFICIENT_RESOURCES: Final = 23
NVML_ERROR_UNKNOWN: Final = 999

NVML_DEVICE_MIG_DISABLE: Final = 0
NVML_DEVICE_MIG_ENABLE: Final = 1
NVML_SUCCESS: Final = 0

# nvmlEventType* bit masks (pynvml: nvmlEventTypeXidCriticalError, ...) (nvmlDeviceRegisterEvents, c_nvmlEventData_t.eventType).
NVML_EVENT_TYPE_SINGLE_BIT_ECC_ERROR: Final = 0x1
NVML_EVENT_TYPE_DOUBLE_BIT_ECC_ERROR: Final = 0x2
NVML_EVENT_TYPE_XID_CRITICAL_ERROR: Final = 0x8
NVML_NO_INSTANCE_ID: Final = 0xFFFFFFFF
"""``gpuInstanceId``/``computeInstanceId`` of an event that is not about one MIG instance."""

# nvmlEnableState_t (what nvmlDeviceGetRetiredPagesPendingStatus answers).
NVML_FEATURE_DISABLED: Final = 0
NVML_FEATURE_ENABLED: Final = 1

# GPU-instance profile selectors (the ``profile`` argument of nvmlDeviceGetGpuInstanceProfileInfo,
# not the profile *id* it returns: 1g.5gb is selector 0 and id 19 on an A100).
NVML_GPU_INSTANCE_PROFILE_1_SLICE: Final = 0x0
NVML_GPU_INSTANCE_PROFILE_2_SLICE: Final = 0x1
NVML_GPU_INSTANCE_PROFILE_3_SLICE: Final = 0x2
NVML_GPU_INSTANCE_PROFILE_4_SLICE: Final = 0x3
NVML_GPU_INSTANCE_PROFILE_7_SLICE: Final = 0x4
NVML_GPU_INSTANCE_PROFILE_8_SLICE: Final = 0x5
NVML_GPU_INSTANCE_PROFILE_6_SLICE: Final = 0x6
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: Final = 0x7
NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1: Final = 0x8
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: Final = 0x9
NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX: Final = 0xA
NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX: Final = 0xB
NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX: Final = 0xC
NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME: Final = 0xD
NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME: Final = 0xE
NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME: Final = 0xF
NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME: Final = 0x10
NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX: Final = 0x11
NVML_GPU_INSTANCE_PROFILE_COUNT: Final = 0x12

# Compute-instance profile selectors; the one covering a whole GPU instance has its slice count.
NVML_COMPUTE_INSTANCE_PROFILE_COUNT: Final = 0x9
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED: Final = 0x0
CI_PROFILE_BY_SLICE_COUNT: Final = CI_PROFILE_BY_COMPUTE_SLICES

# Name suffixes of the GPU-instance profile variants (as in go-nvlib's MigProfileInfo.String()).
GI_PROFILE_NAME_SUFFIX: Final = {
    NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: "+me",
    NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1: "+me",
    NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME: "+me.all",
    NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME: "+me.all",
    NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME: "-me",
    NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME: "-me",
    NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX: "+gfx",
    NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX: "+gfx",
    NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX: "+gfx",
    NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX: "+gfx",
}


class NvmlLibrary(Protocol):
    """Exactly the pynvml names ``driver.gpu.nvml`` uses. Handles and structures are ``Any``."""

    @property
    def NVMLError(self) -> type[Exception]: ...
    @property
    def c_nvmlGpuInstancePlacement_t(self) -> Any: ...
    @property
    def c_nvmlGpuInstance_t(self) -> Any: ...
    @property
    def c_nvmlComputeInstance_t(self) -> Any: ...

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int: ...
    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]: ...
    def nvmlDeviceSetMigMode(self, device: Any, mode: int) -> int: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]: ...
    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Any) -> int: ...
    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]: ...
    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: Any, profile: int, version: int = 2
    ) -> Any: ...
    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int: ...
    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: Any, profileId: int, placement: Any
    ) -> Any: ...
    def nvmlDeviceGetGpuInstances(
        self, device: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int: ...
    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any: ...
    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any: ...
    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int: ...
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any: ...
    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any: ...
    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int: ...
    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> Any: ...
    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None: ...
    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any: ...
    def nvmlEventSetFree(self, eventSet: Any) -> None: ...
