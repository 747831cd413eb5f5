"""A fake of the ``pynvml`` functions the NVML backend calls, answering as NVML does.

Shipped beside the real backend (as httpx ships its mock transport) so the NVML backend runs its
contract tests without a GPU. It is built on the catalog's GPUs and on the same placement rules as
the emulated backend (``driver.gpu.rules``); what it adds is NVML's shape:

- failures raise ``FakeNvml.NVMLError`` with the real ``NVML_ERROR_*`` value in ``.value``
  (an occupied placement, a second ``+me`` or a full profile → ``INSUFFICIENT_RESOURCES``; a start
  the profile does not allow → ``INVALID_ARGUMENT``; an unknown GI → ``NOT_FOUND``; destroying a GI
  that still has compute instances → ``IN_USE``);
- answers are ctypes structures with nvml.h's field names; handles are opaque integers;
- GPU-instance profiles are addressed by NVML's selectors (``NVML_GPU_INSTANCE_PROFILE_*``) and ids
  (19 for 1g.5gb on an A100), names come back as ``MIG 1g.5gb``;
- every MIG device gets a fresh UUID, as on hardware.

Tests steer it with ``fail(function, code=…)`` (the next call(s) of that function fail),
``profile_info_v2=False`` (a driver without the V call, so profiles have no names),
``mig_enabled`` per GPU, and health per GPU: ``set_lost`` (every query of the GPU answers
``GPU_IS_LOST``, as when it fell off the bus), ``set_retired_pages_pending`` (``None``, the default,
answers ``NOT_SUPPORTED`` as Ampere and newer GPUs do) and ``set_remapped_rows``. XID events:
``inject_xid`` reports one the way the GPU driver would, to the event sets registered for it
(NVML's event API, ``driver.gpu.fake_nvml_events``). Usage of a MIG device: its handle by MIG UUID,
its memory (the GPU instance's size, ``used`` 0 until ``set_mig_usage``), and its utilization,
which answers ``NOT_SUPPORTED`` as most GPUs do for MIG devices unless ``set_mig_usage`` gives one.

MIG mode follows NVML's rules for ``nvmlDeviceSetMigMode``: the *pending* mode is set at once; it
becomes the *current* mode at once only when the GPU can apply it without a reset (constructor
``mig_mode_needs_reset=False``, as on GPUs and drivers that allow it) and no process runs on it;
otherwise the call answers an ``activationStatus`` of ``IN_USE`` and the mode waits for a GPU reset.
Turning MIG off while GPU instances exist fails with ``IN_USE``. Processes per GPU are set with
``set_processes`` (``nvmlDeviceGet{Compute,Graphics}RunningProcesses`` list them).
NVML has no reset call: the driver's ``nvidia-smi --gpu-reset`` does it. ``reset_gpu`` stands for
that reset here: refused (``IN_USE``) while processes run, or as told by ``fail_reset``; otherwise
the pending mode becomes current and every MIG instance of the GPU is gone.
"""
# Names below are pynvml's and nvml.h's, hence not PEP 8:
# ruff: noqa: N802, N803, N815

import ctypes
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from driver.gpu import nvml_api as api
from driver.gpu.emulated import emulated_gpu_uuid, parse_gpu_spec
from driver.gpu.fake_nvml_events import SUPPORTED_EVENT_TYPES, FakeEventHub, c_nvmlEventData_t
from driver.gpu.fake_nvml_types import (
    FakeNvmlError,
    c_nvmlComputeInstanceInfo_t,
    c_nvmlComputeInstanceProfileInfo_t,
    c_nvmlComputeInstanceProfileInfo_v2_t,
    c_nvmlGpuInstanceInfo_t,
    c_nvmlGpuInstancePlacement_t,
    c_nvmlGpuInstanceProfileInfo_t,
    c_nvmlGpuInstanceProfileInfo_v2_t,
    c_nvmlMemory_t,
    c_nvmlUtilization_t,
)
from driver.gpu.rules import Occupant, Refusal, lowest_free_id, refusal
from driver.mig.model import MIB, GpuModel, MigProfile, Placement

__all__ = ["FakeNvml", "FakeNvmlError", "gi_profile_selector"]

_UUID_NAMESPACE: Final = uuid.UUID("0b1e3a4c-7d52-4f0e-8f6a-2c9d1e7b5a13")

# Handles: a kind tag in the high bits, then GPU index, GI id and CI id.
_DEVICE: Final = 1 << 48
_GPU_INSTANCE: Final = 2 << 48
_COMPUTE_INSTANCE: Final = 3 << 48
_MIG_DEVICE: Final = 4 << 48
_KIND_MASK: Final = 0xFFFF << 48

# Compute-instance sizes a GPU instance of N compute slices offers (nvidia-smi mig -lcip).
_CI_SIZES_IN_GI: Final = {
    1: (1,),
    2: (1, 2),
    3: (1, 2, 3),
    4: (1, 2, 4),
    6: (1, 2, 3, 6),
    7: (1, 2, 3, 4, 7),
    8: (1, 2, 4, 8),
}
_CI_SLICES_BY_SELECTOR: Final = {v: k for k, v in api.CI_PROFILE_BY_SLICE_COUNT.items()}


def gi_profile_selector(profile: MigProfile) -> int:
    """The ``NVML_GPU_INSTANCE_PROFILE_*`` selector NVML lists ``profile`` under."""
    if profile.media_extensions:
        if profile.compute_slices == 1:
            return api.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
        return api.NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1
    if profile.compute_slices == 1 and profile.memory_slices == 2:
        return api.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
    return {
        1: api.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
        2: api.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
        3: api.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
        4: api.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
        6: api.NVML_GPU_INSTANCE_PROFILE_6_SLICE,
        7: api.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
        8: api.NVML_GPU_INSTANCE_PROFILE_8_SLICE,
    }[profile.compute_slices]


@dataclass
class _Ci:
    id: int
    selector: int
    start: int
    slices: int
    uuid: str


@dataclass
class _Gi:
    id: int
    profile: MigProfile
    placement: Placement
    cis: dict[int, _Ci] = field(default_factory=dict)


@dataclass
class _Gpu:
    index: int
    model: GpuModel
    uuid: str
    mig_current: int
    mig_pending: int
    gis: dict[int, _Gi] = field(default_factory=dict)
    lost: bool = False
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool = False
    remapped_rows_failure: bool = False
    compute_processes: int = 0
    graphics_processes: int = 0


@dataclass(frozen=True)
class FakeProcessInfo:
    """What pynvml's running-process lists hold per process (its friendly-object field names)."""

    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int
    computeInstanceId: int


class FakeNvml:
    """An ``NvmlLibrary`` over catalog GPUs. Thread-safe, like NVML."""

    NVMLError = FakeNvmlError
    c_nvmlGpuInstancePlacement_t = c_nvmlGpuInstancePlacement_t
    c_nvmlGpuInstance_t = ctypes.c_uint64
    c_nvmlComputeInstance_t = ctypes.c_uint64

    def __init__(
        self,
        *,
        gpus: str | Sequence[GpuModel],
        node_name: str = "fake-node",
        mig_enabled: bool | Sequence[bool] = True,
        profile_info_v2: bool = True,
        mig_mode_needs_reset: bool = True,
    ) -> None:
        models = parse_gpu_spec(gpus) if isinstance(gpus, str) else tuple(gpus)
        enabled = [mig_enabled] * len(models) if isinstance(mig_enabled, bool) else mig_enabled
        self._gpus = [
            _Gpu(
                index=i,
                model=m,
                uuid=emulated_gpu_uuid(node_name=node_name, gpu_index=i),
                mig_current=int(on),
                mig_pending=int(on),
            )
            for i, (m, on) in enumerate(zip(models, enabled, strict=True))
        ]
        self._node_name = node_name
        self._profile_info_v2 = profile_info_v2
        self._mig_mode_needs_reset = mig_mode_needs_reset
        self._reset_failures: list[int] = []
        self._lock = threading.RLock()
        self._init_count = 0
        self._serial = 0
        self._failures: dict[str, list[int]] = {}
        self._events = FakeEventHub()
        self._mig_usage: dict[str, tuple[int, tuple[int, int] | None]] = {}
        self.calls: list[str] = []
        """Names of the functions called, in order (tests assert on what was, or was not, called)."""

    # -- test controls ----------------------------------------------------------------------

    def fail(self, function: str, *, code: int, times: int = 1) -> None:
        """Make the next ``times`` calls of ``function`` raise ``NVMLError(code)``."""
        with self._lock:
            self._failures.setdefault(function, []).extend([code] * times)

    def set_mig_mode(self, index: int, *, current: bool, pending: bool) -> None:
        with self._lock:
            self._gpus[index].mig_current = int(current)
            self._gpus[index].mig_pending = int(pending)

    def set_lost(self, index: int, *, lost: bool = True) -> None:
        """A lost GPU answers ``GPU_IS_LOST`` to every query except its handle by index."""
        with self._lock:
            self._gpus[index].lost = lost

    def set_retired_pages_pending(self, index: int, *, pending: bool | None) -> None:
        """``None``: the GPU does not support page retirement (``NOT_SUPPORTED``)."""
        with self._lock:
            self._gpus[index].retired_pages_pending = pending

    def set_remapped_rows(self, index: int, *, pending: bool, failure: bool) -> None:
        with self._lock:
            self._gpus[index].remapped_rows_pending = pending
            self._gpus[index].remapped_rows_failure = failure

    def inject_xid(
        self,
        index: int,
        xid: int,
        *,
        gi_id: int | None = None,
        ci_id: int | None = None,
        event_type: int = api.NVML_EVENT_TYPE_XID_CRITICAL_ERROR,
    ) -> int:
        """GPU ``index`` reports ``xid`` (an event of ``event_type``); how many event sets got it."""
        with self._lock:
            if not 0 <= index < len(self._gpus):
                raise IndexError(f"no fake GPU {index}")
        return self._events.post(
            gpu_index=index, event_type=event_type, data=xid, gi_id=gi_id, ci_id=ci_id
        )

    def set_mig_usage(
        self, mig_uuid: str, *, memory_used: int, utilization: tuple[int, int] | None = None
    ) -> None:
        """The MIG device's memory in use and, if given, its (GPU, memory) utilization percent."""
        with self._lock:
            self._mig_usage[mig_uuid] = (memory_used, utilization)

    def set_processes(self, index: int, *, compute: int = 0, graphics: int = 0) -> None:
        """How many compute and graphics processes run on GPU ``index``."""
        with self._lock:
            self._gpus[index].compute_processes = compute
            self._gpus[index].graphics_processes = graphics

    def mig_mode(self, index: int) -> tuple[bool, bool]:
        """(current, pending) MIG mode of GPU ``index``, as a test reads it."""
        with self._lock:
            gpu = self._gpus[index]
            return bool(gpu.mig_current), bool(gpu.mig_pending)

    def fail_reset(self, *, code: int, times: int = 1) -> None:
        """Make the next ``times`` GPU resets fail with ``code`` (e.g. ``NO_PERMISSION``)."""
        with self._lock:
            self._reset_failures.extend([code] * times)

    def reset_gpu(self, index: int) -> None:
        """The driver's GPU reset (``nvidia-smi --gpu-reset -i <index>``); see the module docstring."""
        with self._lock:
            self.calls.append("reset_gpu")
            if self._reset_failures:
                raise FakeNvmlError(self._reset_failures.pop(0))
            if not 0 <= index < len(self._gpus):
                raise FakeNvmlError(api.NVML_ERROR_INVALID_ARGUMENT)
            gpu = self._gpus[index]
            if gpu.lost:
                raise FakeNvmlError(api.NVML_ERROR_GPU_IS_LOST)
            if gpu.compute_processes or gpu.graphics_processes:
                raise FakeNvmlError(api.NVML_ERROR_IN_USE)
            gpu.mig_current = gpu.mig_pending
            gpu.gis.clear()

    @property
    def initialised(self) -> bool:
        return self._init_count > 0

    # -- library ----------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        with self._lock:
            self._enter("nvmlInit", needs_init=False)
            self._init_count += 1

    def nvmlShutdown(self) -> None:
        with self._lock:
            self._enter("nvmlShutdown")
            self._init_count -= 1

    def nvmlDeviceGetCount(self) -> int:
        with self._lock:
            self._enter("nvmlDeviceGetCount")
            return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        with self._lock:
            self._enter("nvmlDeviceGetHandleByIndex")
            if not 0 <= index < len(self._gpus):
                raise FakeNvmlError(api.NVML_ERROR_INVALID_ARGUMENT)
            return _DEVICE | index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        with self._lock:
            self._enter("nvmlDeviceGetHandleByUUID")
            for gpu in self._gpus:
                if gpu.uuid == uuid:
                    return _DEVICE | gpu.index
                for gi in gpu.gis.values():
                    for ci in gi.cis.values():
                        if ci.uuid == uuid:
                            return _MIG_DEVICE | gpu.index << 16 | gi.id << 8 | ci.id
            raise FakeNvmlError(api.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        with self._lock:
            self._enter("nvmlDeviceGetUUID")
            if int(handle) & _KIND_MASK == _MIG_DEVICE:
                return self._ci(int(handle) - _MIG_DEVICE + _COMPUTE_INSTANCE)[1].uuid
            return self._device(handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        with self._lock:
            self._enter("nvmlDeviceGetName")
            return self._device(handle).model.product_name

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> c_nvmlMemory_t:
        with self._lock:
            self._enter("nvmlDeviceGetMemoryInfo")
            if int(handle) & _KIND_MASK == _MIG_DEVICE:
                (_, gi), ci = self._ci(int(handle) - _MIG_DEVICE + _COMPUTE_INSTANCE)
                total = gi.profile.memory_bytes
                used = self._mig_usage.get(ci.uuid, (0, None))[0]
                return c_nvmlMemory_t(total=total, free=total - used, used=used)
            total = self._device(handle).model.memory_bytes
            return c_nvmlMemory_t(total=total, free=total, used=0)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> c_nvmlUtilization_t:
        with self._lock:
            self._enter("nvmlDeviceGetUtilizationRates")
            if int(handle) & _KIND_MASK != _MIG_DEVICE:
                self._device(handle)
                return c_nvmlUtilization_t(gpu=0, memory=0)
            _, ci = self._ci(int(handle) - _MIG_DEVICE + _COMPUTE_INSTANCE)
            rates = self._mig_usage.get(ci.uuid, (0, None))[1]
            if rates is None:
                raise FakeNvmlError(api.NVML_ERROR_NOT_SUPPORTED)
            return c_nvmlUtilization_t(gpu=rates[0], memory=rates[1])

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        with self._lock:
            self._enter("nvmlDeviceGetMinorNumber")
            return self._device(handle).index

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        with self._lock:
            self._enter("nvmlDeviceGetMigMode")
            gpu = self._device(device)
            return [gpu.mig_current, gpu.mig_pending]

    def nvmlDeviceSetMigMode(self, device: Any, mode: int) -> int:
        """Returns the activation status, as pynvml does (``NVML_SUCCESS`` when applied now)."""
        with self._lock:
            self._enter("nvmlDeviceSetMigMode")
            gpu = self._device(device)
            if mode not in (api.NVML_DEVICE_MIG_DISABLE, api.NVML_DEVICE_MIG_ENABLE):
                raise FakeNvmlError(api.NVML_ERROR_INVALID_ARGUMENT)
            if mode == api.NVML_DEVICE_MIG_DISABLE and gpu.gis:
                raise FakeNvmlError(api.NVML_ERROR_IN_USE)
            gpu.mig_pending = mode
            busy = gpu.compute_processes or gpu.graphics_processes
            if gpu.mig_current == mode:
                return api.NVML_SUCCESS
            if self._mig_mode_needs_reset or busy:
                return api.NVML_ERROR_IN_USE
            gpu.mig_current = mode
            return api.NVML_SUCCESS

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[FakeProcessInfo]:
        with self._lock:
            self._enter("nvmlDeviceGetComputeRunningProcesses")
            gpu = self._device(handle)
            return _processes(gpu.compute_processes, first_pid=1000 + 100 * gpu.index)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[FakeProcessInfo]:
        with self._lock:
            self._enter("nvmlDeviceGetGraphicsRunningProcesses")
            gpu = self._device(handle)
            return _processes(gpu.graphics_processes, first_pid=5000 + 100 * gpu.index)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Any) -> int:
        with self._lock:
            self._enter("nvmlDeviceGetRetiredPagesPendingStatus")
            pending = self._device(device).retired_pages_pending
            if pending is None:
                raise FakeNvmlError(api.NVML_ERROR_NOT_SUPPORTED)
            return api.NVML_FEATURE_ENABLED if pending else api.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        """(corrected rows, uncorrected rows, remapping pending, remapping failed)."""
        with self._lock:
            self._enter("nvmlDeviceGetRemappedRows")
            gpu = self._device(device)
            pending, failure = int(gpu.remapped_rows_pending), int(gpu.remapped_rows_failure)
            return 0, pending + failure, pending, failure

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: Any, profile: int, version: int = 2
    ) -> Any:
        with self._lock:
            self._enter("nvmlDeviceGetGpuInstanceProfileInfo")
            if version == 2 and not self._profile_info_v2:
                raise FakeNvmlError(api.NVML_ERROR_FUNCTION_NOT_FOUND)
            if version not in (1, 2):
                raise FakeNvmlError(api.NVML_ERROR_FUNCTION_NOT_FOUND)
            gpu = self._mig_device(device)
            if not 0 <= profile < api.NVML_GPU_INSTANCE_PROFILE_COUNT:
                raise FakeNvmlError(api.NVML_ERROR_INVALID_ARGUMENT)
            found = [p for p in gpu.model.profiles if gi_profile_selector(p) == profile]
            if not found:
                raise FakeNvmlError(api.NVML_ERROR_NOT_SUPPORTED)
            mig = found[0]
            info: Any = (
                c_nvmlGpuInstanceProfileInfo_v2_t()
                if version == 2
                else c_nvmlGpuInstanceProfileInfo_t()
            )
            if version == 2:
                info.version = 0x02000098
                info.name = f"MIG {mig.name}".encode()
            info.id = mig.gi_profile_id
            info.isP2pSupported = 0
            info.sliceCount = mig.compute_slices
            info.instanceCount = mig.max_count
            info.multiprocessorCount = mig.multiprocessors
            info.memorySizeMB = mig.memory_bytes // MIB
            return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        with self._lock:
            self._enter("nvmlDeviceGetGpuInstancePossiblePlacements")
            placements = self._gi_profile(self._mig_device(device), profileId).placements
            if placementsRef is not None:
                if len(placementsRef) < len(placements):
                    raise FakeNvmlError(api.NVML_ERROR_INSUFFICIENT_SIZE)
                for slot, placement in zip(placementsRef, placements, strict=False):
                    slot.start, slot.size = placement.start, placement.size
            _set_count(countRef, len(placements))
            return 0

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: Any, profileId: int, placement: Any
    ) -> int:
        with self._lock:
            self._enter("nvmlDeviceCreateGpuInstanceWithPlacement")
            gpu = self._mig_device(device)
            profile = self._gi_profile(gpu, profileId)
            wanted = _deref(placement)
            start, size = int(wanted.start), int(wanted.size)
            occupants = [
                Occupant(profile=g.profile, placement=g.placement) for g in gpu.gis.values()
            ]
            verdict = refusal(profile=profile, start=start, occupants=occupants)
            if verdict is not None and verdict[0] is Refusal.START_NOT_ALLOWED:
                raise FakeNvmlError(api.NVML_ERROR_INVALID_ARGUMENT)
            if profile.placement_at(start).size != size:
                raise FakeNvmlError(api.NVML_ERROR_INVALID_ARGUMENT)
            if verdict is not None:
                raise FakeNvmlError(api.NVML_ERROR_INSUFFICIENT_RESOURCES)
            gi_id = lowest_free_id(gpu.gis, first=1)
            gpu.gis[gi_id] = _Gi(
                id=gi_id, profile=profile, placement=Placement(start=start, size=size)
            )
            return _GPU_INSTANCE | gpu.index << 16 | gi_id

    def nvmlDeviceGetGpuInstances(
        self, device: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        with self._lock:
            self._enter("nvmlDeviceGetGpuInstances")
            gpu = self._mig_device(device)
            self._gi_profile(gpu, profileId)
            ids = sorted(g.id for g in gpu.gis.values() if g.profile.gi_profile_id == profileId)
            if len(gpuInstancesRef) < len(ids):
                raise FakeNvmlError(api.NVML_ERROR_INSUFFICIENT_SIZE)
            for slot, gi_id in enumerate(ids):
                gpuInstancesRef[slot] = _GPU_INSTANCE | gpu.index << 16 | gi_id
            _set_count(countRef, len(ids))
            return 0

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> int:
        with self._lock:
            self._enter("nvmlDeviceGetGpuInstanceById")
            gpu = self._mig_device(device)
            if gpuInstanceId not in gpu.gis:
                raise FakeNvmlError(api.NVML_ERROR_NOT_FOUND)
            return _GPU_INSTANCE | gpu.index << 16 | gpuInstanceId

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> c_nvmlGpuInstanceInfo_t:
        with self._lock:
            self._enter("nvmlGpuInstanceGetInfo")
            gpu, gi = self._gi(gpuInstance)
            info = c_nvmlGpuInstanceInfo_t(
                device=_DEVICE | gpu.index, id=gi.id, profileId=gi.profile.gi_profile_id
            )
            info.placement.start, info.placement.size = gi.placement.start, gi.placement.size
            return info

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        with self._lock:
            self._enter("nvmlGpuInstanceDestroy")
            gpu, gi = self._gi(gpuInstance)
            if gi.cis:
                raise FakeNvmlError(api.NVML_ERROR_IN_USE)
            del gpu.gis[gi.id]
            return 0

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        with self._lock:
            self._enter("nvmlGpuInstanceGetComputeInstanceProfileInfo")
            if version not in (1, 2) or (version == 2 and not self._profile_info_v2):
                raise FakeNvmlError(api.NVML_ERROR_FUNCTION_NOT_FOUND)
            _, gi = self._gi(device)
            if not 0 <= profile < api.NVML_COMPUTE_INSTANCE_PROFILE_COUNT or engProfile != 0:
                raise FakeNvmlError(api.NVML_ERROR_INVALID_ARGUMENT)
            slices = _CI_SLICES_BY_SELECTOR.get(profile)
            if slices is None or slices not in _CI_SIZES_IN_GI[gi.profile.compute_slices]:
                raise FakeNvmlError(api.NVML_ERROR_NOT_SUPPORTED)
            info: Any = (
                c_nvmlComputeInstanceProfileInfo_v2_t()
                if version == 2
                else c_nvmlComputeInstanceProfileInfo_t()
            )
            if version == 2:
                info.version = 0x02000088
                info.name = f"MIG {slices}c.{gi.profile.name}".encode()
            info.id = profile
            info.sliceCount = slices
            info.instanceCount = gi.profile.compute_slices // slices
            info.multiprocessorCount = (
                gi.profile.multiprocessors * slices // gi.profile.compute_slices
            )
            return info

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> int:
        with self._lock:
            self._enter("nvmlGpuInstanceCreateComputeInstance")
            gpu, gi = self._gi(gpuInstance)
            slices = _CI_SLICES_BY_SELECTOR.get(profileId)
            if slices is None or slices not in _CI_SIZES_IN_GI[gi.profile.compute_slices]:
                raise FakeNvmlError(api.NVML_ERROR_INVALID_ARGUMENT)
            used = sum(ci.slices for ci in gi.cis.values())
            if used + slices > gi.profile.compute_slices:
                raise FakeNvmlError(api.NVML_ERROR_INSUFFICIENT_RESOURCES)
            ci_id = lowest_free_id(gi.cis, first=0)
            self._serial += 1
            key = f"{self._node_name}/{gpu.index}/{gi.id}/{ci_id}/{self._serial}"
            gi.cis[ci_id] = _Ci(id=ci_id, selector=profileId, start=used, slices=slices,
                                uuid=f"MIG-{uuid.uuid5(_UUID_NAMESPACE, key)}")  # fmt: skip
            return _COMPUTE_INSTANCE | gpu.index << 16 | gi.id << 8 | ci_id

    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int:
        with self._lock:
            self._enter("nvmlGpuInstanceGetComputeInstances")
            gpu, gi = self._gi(gpuInstance)
            ids = sorted(ci.id for ci in gi.cis.values() if ci.selector == profileId)
            if len(computeInstancesRef) < len(ids):
                raise FakeNvmlError(api.NVML_ERROR_INSUFFICIENT_SIZE)
            for slot, ci_id in enumerate(ids):
                computeInstancesRef[slot] = _COMPUTE_INSTANCE | gpu.index << 16 | gi.id << 8 | ci_id
            _set_count(countRef, len(ids))
            return 0

    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> c_nvmlComputeInstanceInfo_t:
        with self._lock:
            self._enter("nvmlComputeInstanceGetInfo")
            (gpu, gi), ci = self._ci(computeInstance)
            suffix = gpu.index << 16 | gi.id << 8 | ci.id
            info = c_nvmlComputeInstanceInfo_t(
                device=_MIG_DEVICE | suffix,
                gpuInstance=_GPU_INSTANCE | gpu.index << 16 | gi.id,
                id=ci.id,
                profileId=ci.selector,
            )
            info.placement.start, info.placement.size = ci.start, ci.slices
            return info

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        with self._lock:
            self._enter("nvmlComputeInstanceDestroy")
            (_, gi), ci = self._ci(computeInstance)
            del gi.cis[ci.id]
            return 0

    # -- internals --------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> int:
        with self._lock:
            self._enter("nvmlEventSetCreate")
        return self._events.create()

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        with self._lock:
            self._enter("nvmlDeviceGetSupportedEventTypes")
            self._device(handle)
        return SUPPORTED_EVENT_TYPES

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        with self._lock:
            self._enter("nvmlDeviceRegisterEvents")
            gpu = self._device(handle)
        self._events.register(eventSet, gpu_index=gpu.index, event_types=int(eventTypes))

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> c_nvmlEventData_t:
        with self._lock:
            self._enter("nvmlEventSetWait_v2")
        return self._events.wait(eventSet, timeout_ms=int(timeoutms), device_handle=_DEVICE)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        with self._lock:
            self._enter("nvmlEventSetFree")
        self._events.free(eventSet)

    # -- helpers ----------------------------------------------------------------------------

    def _enter(self, function: str, *, needs_init: bool = True) -> None:
        self.calls.append(function)
        pending = self._failures.get(function)
        if pending:
            raise FakeNvmlError(pending.pop(0))
        if needs_init and self._init_count <= 0:
            raise FakeNvmlError(api.NVML_ERROR_UNINITIALIZED)

    def _device(self, handle: Any) -> _Gpu:
        value = int(handle)
        index = value & 0xFFFF
        if value & _KIND_MASK != _DEVICE or index >= len(self._gpus):
            raise FakeNvmlError(api.NVML_ERROR_INVALID_ARGUMENT)
        if self._gpus[index].lost:
            raise FakeNvmlError(api.NVML_ERROR_GPU_IS_LOST)
        return self._gpus[index]

    def _mig_device(self, handle: Any) -> _Gpu:
        gpu = self._device(handle)
        if gpu.mig_current != api.NVML_DEVICE_MIG_ENABLE:
            raise FakeNvmlError(api.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    @staticmethod
    def _gi_profile(gpu: _Gpu, profile_id: int) -> MigProfile:
        for profile in gpu.model.profiles:
            if profile.gi_profile_id == profile_id:
                return profile
        raise FakeNvmlError(api.NVML_ERROR_INVALID_ARGUMENT)

    def _gi(self, handle: Any) -> tuple[_Gpu, _Gi]:
        value = int(handle)
        index, gi_id = (value >> 16) & 0xFFFF, value & 0xFFFF
        if value & _KIND_MASK != _GPU_INSTANCE or index >= len(self._gpus):
            raise FakeNvmlError(api.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpus[index]
        if gpu.lost:
            raise FakeNvmlError(api.NVML_ERROR_GPU_IS_LOST)
        if gi_id not in gpu.gis:
            raise FakeNvmlError(api.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, gpu.gis[gi_id]

    def _ci(self, handle: Any) -> tuple[tuple[_Gpu, _Gi], _Ci]:
        value = int(handle)
        if value & _KIND_MASK != _COMPUTE_INSTANCE:
            raise FakeNvmlError(api.NVML_ERROR_INVALID_ARGUMENT)
        index, gi_id, ci_id = (value >> 16) & 0xFFFF, (value >> 8) & 0xFF, value & 0xFF
        gpu, gi = self._gi(_GPU_INSTANCE | index << 16 | gi_id)
        if ci_id not in gi.cis:
            raise FakeNvmlError(api.NVML_ERROR_INVALID_ARGUMENT)
        return (gpu, gi), gi.cis[ci_id]


def _deref(ref: Any) -> Any:
    """The object behind ``ctypes.pointer(x)`` or ``ctypes.byref(x)``, or ``x`` itself."""
    if hasattr(ref, "contents"):
        return ref.contents
    return getattr(ref, "_obj", ref)


def _set_count(count_ref: Any, value: int) -> None:
    _deref(count_ref).value = value


def _processes(count: int, *, first_pid: int) -> list[FakeProcessInfo]:
    # 0xFFFFFFFF: NVML's "no instance" for processes on a GPU without MIG.
    return [
        FakeProcessInfo(
            pid=first_pid + n,
            usedGpuMemory=256 * MIB,
            gpuInstanceId=0xFFFFFFFF,
            computeInstanceId=0xFFFFFFFF,
        )
        for n in range(count)
    ]
