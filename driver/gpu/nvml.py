"""The ``GpuBackend`` for real NVIDIA GPUs, through NVML — the only module that imports ``pynvml``.

What a GPU supports is read from the GPU, never from our catalog: GPU-instance profiles from
``nvmlDeviceGetGpuInstanceProfileInfo`` (named as NVML names them, e.g. ``1g.18gb``), placements
from ``nvmlDeviceGetGpuInstancePossiblePlacements``. A slice is a GPU instance created at an exact
placement plus its default compute instance; its MIG UUID is read from the compute instance's device
handle (walking every MIG device is O(10 s) on big nodes).

- NVML is initialised once, at construction, and shut down by ``close()``.
- Create/destroy on one GPU hold that GPU's lock; calls block (threads model).
- ``NVML_ERROR_INSUFFICIENT_RESOURCES`` on create means the placement is occupied
  (``PlacementOccupiedError``); every other NVML failure is a ``BackendError`` raised from it.
- If the compute instance cannot be created, the GPU instance is destroyed before raising.
- MIG mode is only read by the slice operations: a GPU with MIG off is reported
  (``GpuInfo.mig_enabled``) and creating on it is a ``ConfigError`` that says so. Only the
  ``MigModeBackend`` calls change it (``set_mig_mode``, ``reset_gpu``), used by the kubelet
  plugin's opt-in ``--mig-mode when-idle`` step.
- Health, read-only, in ``gpus()``: a lost GPU or one whose memory needs a reset is reported
  unhealthy instead of failing the list; the probes live in ``driver.gpu.nvml_health``.
- Usage of one MIG device (``slice_usage``): its handle by MIG UUID (``nvmlDeviceGetHandleByUUID``),
  then ``nvmlDeviceGetMemoryInfo`` and, where the GPU supports it for MIG devices,
  ``nvmlDeviceGetUtilizationRates`` — no GPU lock: reads only.
- XID critical-error events through NVML's event API (``next_xid_event``,
  ``driver.gpu.nvml_events``); the event set is freed by ``close()``.
"""

import ctypes
import logging
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, ParamSpec, TypeVar

from driver.errors import (
    BackendError,
    ConfigError,
    DriverError,
    NotFoundError,
    PlacementOccupiedError,
)
from driver.gpu import caps
from driver.gpu import nvml_api as api
from driver.gpu.backend import GpuInfo, MigInstance, SliceUsage, XidEvent
from driver.gpu.nvml_call import NvmlCallError, call_nvml
from driver.gpu.nvml_events import NvmlXidWatcher
from driver.gpu.nvml_health import NvmlGpuHealth
from driver.gpu.rules import slice_range
from driver.ids import GpuUuid, MigUuid
from driver.mig.model import MIB, GpuModel, MigProfile, Placement

__all__ = ["NvmlCallError", "NvmlGpuBackend"]  # NvmlCallError: where callers have always found it

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

_GIB: Final = 1024 * MIB
_NAME_PREFIX: Final = "MIG "


def _default_library() -> api.NvmlLibrary:
    import pynvml  # noqa: PLC0415 - imported only when no library is injected

    library: api.NvmlLibrary = pynvml
    return library


class NvmlGpuBackend:
    """``GpuBackend`` over NVML. ``nvml`` defaults to the ``pynvml`` module; tests pass a fake."""

    def __init__(
        self,
        *,
        nvml: api.NvmlLibrary | None = None,
        mig_minors_path: Path = caps.MIG_MINORS_PATH,
        capabilities_root: Path = caps.CAPABILITIES_ROOT,
        reset_gpu: Callable[[int], None] | None = None,
    ) -> None:
        self._nvml = nvml if nvml is not None else _default_library()
        self._mig_minors_path = mig_minors_path
        self._capabilities_root = capabilities_root
        self._reset_gpu = reset_gpu or nvidia_smi_reset
        self._mig_minors: Mapping[str, int] | None = None
        self._models: dict[GpuUuid, GpuModel] = {}
        self._state_lock = threading.Lock()
        self._gpu_locks: dict[int, threading.Lock] = {}
        self._health = NvmlGpuHealth(nvml=self._nvml)
        self._xids = NvmlXidWatcher(nvml=self._nvml)
        self._closed = False
        self._call("nvmlInit", self._nvml.nvmlInit)

    # -- GpuBackend -------------------------------------------------------------------------

    def gpus(self) -> tuple[GpuInfo, ...]:
        self._check_open()
        count = self._call("nvmlDeviceGetCount", self._nvml.nvmlDeviceGetCount)
        return tuple(
            self._health.gpu_and_health(index, read_gpu=self._gpu, handle=self._handle)
            for index in range(count)
        )

    def instances(self, *, gpu_index: int | None = None) -> tuple[MigInstance, ...]:
        self._check_open()
        indexes = range(self._gpu_count()) if gpu_index is None else (self._known(gpu_index),)
        found: list[MigInstance] = []
        for index in indexes:
            gpu = self._gpu(index)
            if gpu.model is not None:
                handle = self._handle(index)
                found.extend(self._instances_of(gpu, gpu.model, handle))
        return tuple(sorted(found, key=lambda i: (i.gpu_index, i.gi_id)))

    def create_slice(self, *, gpu_index: int, profile: str, start: int) -> MigInstance:
        self._check_open()
        with self._lock(self._known(gpu_index)):
            gpu = self._gpu(gpu_index)
            model = self._require_mig(gpu)
            mig_profile = model.profile(profile)
            placement = mig_profile.placement_at(start)
            handle = self._handle(gpu_index)
            gi = self._create_gi(gpu, handle, mig_profile, placement)
            try:
                gi_id = int(
                    self._call("nvmlGpuInstanceGetInfo", self._nvml.nvmlGpuInstanceGetInfo, gi).id
                )
                ci_id, mig_uuid = self._create_default_ci(gi, mig_profile)
            except Exception as exc:
                outcome = self._rollback_gi(gi, gpu_index=gpu_index)
                raise BackendError(
                    f"creating the compute instance of the new {profile} GPU instance at "
                    f"placement start {start} on GPU {gpu_index} failed: {exc}; {outcome}"
                ) from exc
        log.info("created %s at start %s on GPU %s (GI %s, CI %s, %s)", profile, start, gpu_index,
                 gi_id, ci_id, mig_uuid)  # fmt: skip
        return MigInstance(
            gpu_index=gpu_index,
            gpu_uuid=gpu.uuid,
            profile=mig_profile.name,
            placement=placement,
            gi_id=gi_id,
            ci_id=ci_id,
            mig_uuid=mig_uuid,
            gi_cap_minor=self._cap_minor(gpu, gi_id, None),
            ci_cap_minor=self._cap_minor(gpu, gi_id, ci_id),
        )

    def destroy_slice(self, *, gpu_index: int, gi_id: int) -> None:
        self._check_open()
        with self._lock(self._known(gpu_index)):
            gpu = self._gpu(gpu_index)
            if not gpu.mig_enabled:
                raise NotFoundError(
                    f"no GPU instance {gi_id} on GPU {gpu_index}: MIG mode is off there"
                )
            handle = self._handle(gpu_index)
            try:
                gi = self._call(
                    "nvmlDeviceGetGpuInstanceById",
                    self._nvml.nvmlDeviceGetGpuInstanceById,
                    handle,
                    gi_id,
                )
            except NvmlCallError as exc:
                if exc.code in (api.NVML_ERROR_NOT_FOUND, api.NVML_ERROR_INVALID_ARGUMENT):
                    raise NotFoundError(
                        f"no GPU instance {gi_id} on GPU {gpu_index}"
                    ) from exc.__cause__
                raise
            for ci in self._compute_instances(gi):
                self._call("nvmlComputeInstanceDestroy", self._nvml.nvmlComputeInstanceDestroy, ci)
            self._call("nvmlGpuInstanceDestroy", self._nvml.nvmlGpuInstanceDestroy, gi)
        log.info("destroyed GPU instance %s on GPU %s", gi_id, gpu_index)

    def slice_usage(self, *, mig_uuid: MigUuid) -> SliceUsage:
        self._check_open()
        try:
            handle = self._call(
                "nvmlDeviceGetHandleByUUID", self._nvml.nvmlDeviceGetHandleByUUID, mig_uuid
            )
        except NvmlCallError as exc:
            if exc.code in (api.NVML_ERROR_NOT_FOUND, api.NVML_ERROR_INVALID_ARGUMENT):
                raise NotFoundError(f"no MIG device {mig_uuid} on this node") from exc.__cause__
            raise
        memory = self._call("nvmlDeviceGetMemoryInfo", self._nvml.nvmlDeviceGetMemoryInfo, handle)
        rates = self._optional(self._nvml.nvmlDeviceGetUtilizationRates, handle)
        return SliceUsage(
            memory_used_bytes=int(memory.used),
            memory_total_bytes=int(memory.total),
            gpu_utilization_percent=None if rates is None else int(rates.gpu),
            memory_utilization_percent=None if rates is None else int(rates.memory),
        )

    def next_xid_event(self, *, timeout_seconds: float) -> XidEvent | None:
        self._check_open()
        return self._xids.next_event(timeout_seconds=timeout_seconds)

    # -- MigModeBackend ----------------------------------------------------------------------

    def running_processes(self, *, gpu_index: int) -> int:
        self._check_open()
        handle = self._handle(self._known(gpu_index))
        compute = self._call(
            "nvmlDeviceGetComputeRunningProcesses",
            self._nvml.nvmlDeviceGetComputeRunningProcesses,
            handle,
        )
        graphics = self._optional(self._nvml.nvmlDeviceGetGraphicsRunningProcesses, handle)
        return len(compute) + len(graphics or ())

    def set_mig_mode(self, *, gpu_index: int, enabled: bool) -> None:
        self._check_open()
        mode = api.NVML_DEVICE_MIG_ENABLE if enabled else api.NVML_DEVICE_MIG_DISABLE
        with self._lock(self._known(gpu_index)):
            handle = self._handle(gpu_index)
            status = self._call(
                "nvmlDeviceSetMigMode", self._nvml.nvmlDeviceSetMigMode, handle, mode
            )
        log.info("MIG mode %s asked on GPU %s (activation status %s)",
                 "on" if enabled else "off", gpu_index, status)  # fmt: skip

    def reset_gpu(self, *, gpu_index: int) -> None:
        self._check_open()
        with self._lock(self._known(gpu_index)):
            try:
                self._reset_gpu(gpu_index)
            except DriverError:
                raise
            except Exception as exc:
                raise BackendError(f"resetting GPU {gpu_index} failed: {exc}") from exc
            with self._state_lock:
                self._models.clear()
        log.info("reset GPU %s", gpu_index)

    def close(self) -> None:
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        self._xids.close()
        self._call("nvmlShutdown", self._nvml.nvmlShutdown)

    # -- discovery --------------------------------------------------------------------------

    def _gpu(self, index: int) -> GpuInfo:
        handle = self._handle(index)
        uuid = GpuUuid(_text(self._call("nvmlDeviceGetUUID", self._nvml.nvmlDeviceGetUUID, handle)))
        name = _text(self._call("nvmlDeviceGetName", self._nvml.nvmlDeviceGetName, handle))
        memory = int(
            self._call("nvmlDeviceGetMemoryInfo", self._nvml.nvmlDeviceGetMemoryInfo, handle).total
        )
        minor = self._optional(self._nvml.nvmlDeviceGetMinorNumber, handle)
        mig_mode = self._optional(self._nvml.nvmlDeviceGetMigMode, handle)
        enabled = mig_mode is not None and mig_mode[0] == api.NVML_DEVICE_MIG_ENABLE
        pending = None if mig_mode is None else mig_mode[1] == api.NVML_DEVICE_MIG_ENABLE
        model = self._model(handle, uuid=uuid, name=name, memory=memory) if enabled else None
        return GpuInfo(
            index=index,
            uuid=uuid,
            product_name=name,
            memory_bytes=memory,
            multiprocessors=max((p.multiprocessors for p in model.profiles), default=0)
            if model
            else 0,
            mig_enabled=enabled,
            mig_pending=pending,
            minor=None if minor is None else int(minor),
            model=model,
        )

    def _model(self, handle: Any, *, uuid: GpuUuid, name: str, memory: int) -> GpuModel:
        """The GPU's MIG profiles as NVML reports them; fixed while MIG mode stays on, so cached."""
        with self._state_lock:
            cached = self._models.get(uuid)
        if cached is not None:
            return cached
        profiles = []
        for selector in range(api.NVML_GPU_INSTANCE_PROFILE_COUNT):
            profile = self._profile(handle, selector, memory=memory)
            if profile is not None:
                profiles.append(profile)
        model = GpuModel(
            name=name,
            product_name=name,
            memory_bytes=memory,
            memory_slices=max((p.placements[-1].end for p in profiles), default=0),
            compute_slices=max((p.compute_slices for p in profiles), default=0),
            multiprocessors=max((p.multiprocessors for p in profiles), default=0),
            profiles=tuple(profiles),
        )
        with self._state_lock:
            self._models[uuid] = model
        return model

    def _profile(self, handle: Any, selector: int, *, memory: int) -> MigProfile | None:
        try:
            info = self._profile_info(handle, selector)
        except NvmlCallError as exc:
            if exc.code in (api.NVML_ERROR_NOT_SUPPORTED, api.NVML_ERROR_INVALID_ARGUMENT):
                return None
            raise
        placements = self._placements(handle, int(info.id))
        slices = int(info.sliceCount)
        ci_profile = api.CI_PROFILE_BY_SLICE_COUNT.get(slices)
        if not placements or ci_profile is None:
            log.warning("skipping GPU-instance profile id %s: %s placements, %s slices",
                        info.id, len(placements), slices)  # fmt: skip
            return None
        name = _profile_name(info, selector=selector, gpu_memory=memory)
        return MigProfile(
            name=name,
            gi_profile_id=int(info.id),
            ci_profile_id=ci_profile,
            memory_slices=placements[0].size,
            compute_slices=slices,
            memory_bytes=int(info.memorySizeMB) * MIB,
            multiprocessors=int(info.multiprocessorCount),
            media_extensions="+me" in name,
            max_count=int(info.instanceCount),
            placements=placements,
        )

    def _profile_info(self, handle: Any, selector: int) -> Any:
        get = self._nvml.nvmlDeviceGetGpuInstanceProfileInfo
        try:
            return self._call("nvmlDeviceGetGpuInstanceProfileInfo", get, handle, selector)
        except NvmlCallError as exc:
            if exc.code != api.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
        # Drivers before the V call: the v1 structure, which has no name.
        return self._call("nvmlDeviceGetGpuInstanceProfileInfo", get, handle, selector, 1)

    def _placements(self, handle: Any, profile_id: int) -> tuple[Placement, ...]:
        get = self._nvml.nvmlDeviceGetGpuInstancePossiblePlacements
        count = ctypes.c_uint(0)
        what = "nvmlDeviceGetGpuInstancePossiblePlacements"
        self._call(what, get, handle, profile_id, None, ctypes.pointer(count))
        buffer = (self._nvml.c_nvmlGpuInstancePlacement_t * count.value)()
        self._call(what, get, handle, profile_id, buffer, ctypes.pointer(count))
        return tuple(Placement(start=int(p.start), size=int(p.size)) for p in buffer[: count.value])

    def _instances_of(self, gpu: GpuInfo, model: GpuModel, handle: Any) -> Iterator[MigInstance]:
        for profile in model.profiles:
            count = ctypes.c_uint(0)
            buffer = (self._nvml.c_nvmlGpuInstance_t * max(profile.max_count, 1))()
            self._call(
                "nvmlDeviceGetGpuInstances",
                self._nvml.nvmlDeviceGetGpuInstances,
                handle,
                profile.gi_profile_id,
                buffer,
                ctypes.pointer(count),
            )
            for gi in buffer[: count.value]:
                info = self._call("nvmlGpuInstanceGetInfo", self._nvml.nvmlGpuInstanceGetInfo, gi)
                gi_id = int(info.id)
                ci_id: int | None = None
                mig_uuid: MigUuid | None = None
                cis = sorted(
                    (self._ci_info(ci) for ci in self._compute_instances(gi)),
                    key=lambda c: int(c.id),
                )
                if cis:
                    if len(cis) > 1:
                        log.warning("GPU instance %s on GPU %s has %s compute instances; "
                                    "reporting CI %s", gi_id, gpu.index, len(cis), cis[0].id)  # fmt: skip
                    ci_id = int(cis[0].id)
                    mig_uuid = self._mig_uuid(cis[0])
                yield MigInstance(
                    gpu_index=gpu.index,
                    gpu_uuid=gpu.uuid,
                    profile=profile.name,
                    placement=Placement(
                        start=int(info.placement.start), size=int(info.placement.size)
                    ),
                    gi_id=gi_id,
                    ci_id=ci_id,
                    mig_uuid=mig_uuid,
                    gi_cap_minor=self._cap_minor(gpu, gi_id, None),
                    ci_cap_minor=None if ci_id is None else self._cap_minor(gpu, gi_id, ci_id),
                )

    def _compute_instances(self, gi: Any) -> list[Any]:
        """Every compute instance of ``gi``, whatever its compute-instance profile."""
        found: list[Any] = []
        for selector in range(api.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                info = self._ci_profile_info(gi, selector)
            except NvmlCallError as exc:
                if exc.code in (api.NVML_ERROR_NOT_SUPPORTED, api.NVML_ERROR_INVALID_ARGUMENT):
                    continue
                raise
            count = ctypes.c_uint(0)
            buffer = (self._nvml.c_nvmlComputeInstance_t * max(int(info.instanceCount), 1))()
            self._call(
                "nvmlGpuInstanceGetComputeInstances",
                self._nvml.nvmlGpuInstanceGetComputeInstances,
                gi,
                int(info.id),
                buffer,
                ctypes.pointer(count),
            )
            found.extend(buffer[: count.value])
        return found

    def _ci_profile_info(self, gi: Any, selector: int) -> Any:
        get = self._nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo
        what = "nvmlGpuInstanceGetComputeInstanceProfileInfo"
        shared = api.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        try:
            return self._call(what, get, gi, selector, shared)
        except NvmlCallError as exc:
            if exc.code != api.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
        return self._call(what, get, gi, selector, shared, 1)

    def _ci_info(self, ci: Any) -> Any:
        return self._call("nvmlComputeInstanceGetInfo", self._nvml.nvmlComputeInstanceGetInfo, ci)

    def _mig_uuid(self, ci_info: Any) -> MigUuid:
        get = self._nvml.nvmlDeviceGetUUID
        return MigUuid(_text(self._call("nvmlDeviceGetUUID", get, ci_info.device)))

    # -- create / destroy -------------------------------------------------------------------

    def _create_gi(
        self, gpu: GpuInfo, handle: Any, profile: MigProfile, placement: Placement
    ) -> Any:
        wanted = self._nvml.c_nvmlGpuInstancePlacement_t()
        wanted.start = placement.start
        wanted.size = placement.size
        try:
            return self._call(
                "nvmlDeviceCreateGpuInstanceWithPlacement",
                self._nvml.nvmlDeviceCreateGpuInstanceWithPlacement,
                handle,
                profile.gi_profile_id,
                ctypes.pointer(wanted),
            )
        except NvmlCallError as exc:
            if exc.code == api.NVML_ERROR_INSUFFICIENT_RESOURCES:
                raise PlacementOccupiedError(
                    f"placement occupied: {profile.name} at placement start {placement.start} "
                    f"on GPU {gpu.index} (NVML: insufficient resources; memory slices "
                    f"{slice_range(placement)} are taken, the GPU's +me instance exists, or "
                    f"{profile.max_count} {profile.name} instances exist)"
                ) from exc.__cause__
            raise

    def _create_default_ci(self, gi: Any, profile: MigProfile) -> tuple[int, MigUuid]:
        info = self._ci_profile_info(gi, profile.ci_profile_id)
        ci = self._call(
            "nvmlGpuInstanceCreateComputeInstance",
            self._nvml.nvmlGpuInstanceCreateComputeInstance,
            gi,
            int(info.id),
        )
        try:
            ci_info = self._ci_info(ci)
            return int(ci_info.id), self._mig_uuid(ci_info)
        except Exception:
            self._call("nvmlComputeInstanceDestroy", self._nvml.nvmlComputeInstanceDestroy, ci)
            raise

    def _rollback_gi(self, gi: Any, *, gpu_index: int) -> str:
        """Destroy a GPU instance whose slice failed; say what happened, never raise."""
        try:
            for ci in self._compute_instances(gi):
                self._call("nvmlComputeInstanceDestroy", self._nvml.nvmlComputeInstanceDestroy, ci)
            self._call("nvmlGpuInstanceDestroy", self._nvml.nvmlGpuInstanceDestroy, gi)
        except DriverError as exc:
            log.error("GPU instance on GPU %s left without compute instance: %s", gpu_index, exc)
            return f"destroying the GPU instance failed too ({exc}); recovery must destroy it"
        return "the GPU instance was destroyed"

    # -- helpers ----------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        return call_nvml(self._nvml, what, fn, *args, **kwargs)

    def _optional(self, fn: Callable[[Any], R], handle: Any) -> R | None:
        """``fn(handle)``, or ``None`` when the GPU does not support the query."""
        try:
            return self._call(getattr(fn, "__name__", "query"), fn, handle)
        except NvmlCallError as exc:
            if exc.code == api.NVML_ERROR_NOT_SUPPORTED:
                return None
            raise

    def _check_open(self) -> None:
        if self._closed:
            raise BackendError("the NVML GPU backend is closed")

    def _gpu_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount", self._nvml.nvmlDeviceGetCount))

    def _known(self, index: int) -> int:
        count = self._gpu_count()
        if not 0 <= index < count:
            known = ", ".join(map(str, range(count))) or "none"
            raise NotFoundError(
                f"GPU index {index} does not exist on this node (GPU indexes: {known})"
            )
        return index

    def _handle(self, index: int) -> Any:
        get = self._nvml.nvmlDeviceGetHandleByIndex
        return self._call("nvmlDeviceGetHandleByIndex", get, index)

    def _lock(self, index: int) -> threading.Lock:
        with self._state_lock:
            return self._gpu_locks.setdefault(index, threading.Lock())

    @staticmethod
    def _require_mig(gpu: GpuInfo) -> GpuModel:
        if gpu.model is None:
            pending = " (enabled, pending a GPU reset)" if gpu.mig_pending else ""
            raise ConfigError(
                f"MIG mode is not enabled on GPU {gpu.index} ({gpu.product_name}, {gpu.uuid})"
                f"{pending}; InstaSlice changes MIG mode only with --mig-mode when-idle — "
                f"enable it with 'nvidia-smi -i {gpu.index} -mig 1' and reset the GPU"
            )
        return gpu.model

    def _cap_minor(self, gpu: GpuInfo, gi_id: int, ci_id: int | None) -> int | None:
        if gpu.minor is None:
            return None
        from_access_file = caps.read_access_minor(
            self._capabilities_root, gpu_minor=gpu.minor, gi_id=gi_id, ci_id=ci_id
        )
        if from_access_file is not None:
            return from_access_file
        with self._state_lock:
            if self._mig_minors is None:
                self._mig_minors = caps.read_mig_minors(self._mig_minors_path)
            table = self._mig_minors
        if ci_id is None:
            return table.get(caps.gi_key(gpu_minor=gpu.minor, gi_id=gi_id))
        return table.get(caps.ci_key(gpu_minor=gpu.minor, gi_id=gi_id, ci_id=ci_id))


def nvidia_smi_reset(gpu_index: int) -> None:
    """NVML has no GPU-reset call; the driver's ``nvidia-smi --gpu-reset`` is how a GPU is reset.

    ``BackendError`` with nvidia-smi's own words when it is missing or refuses (not root, processes
    or other clients on the GPU, a platform without reset such as some VMs).
    """
    argv = ["nvidia-smi", "--gpu-reset", "-i", str(gpu_index)]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(f"{' '.join(argv)} could not run: {exc}") from exc
    if done.returncode != 0:
        output = (done.stdout + done.stderr).decode(errors="replace").strip().splitlines()
        why = output[-1] if output else f"exit status {done.returncode}"
        raise BackendError(f"{' '.join(argv)} failed: {why}")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _profile_name(info: Any, *, selector: int, gpu_memory: int) -> str:
    """NVML's own name (``MIG 1g.5gb`` → ``1g.5gb``); derived like go-nvlib when there is none."""
    raw = getattr(info, "name", b"")
    name = _text(raw).strip() if raw else ""
    if name.startswith(_NAME_PREFIX):
        name = name[len(_NAME_PREFIX) :].strip()
    if name:
        return name
    # go-nvlib: the memory as a fraction of the GPU's, rounded up to eighths, times the GPU's
    # memory in whole GiB (rounded up), rounded half away from zero. Integer arithmetic: exact.
    eighths = -(-int(info.memorySizeMB) * MIB * 8 // gpu_memory)
    gpu_gib = -(-gpu_memory // _GIB)
    gib = (eighths * gpu_gib * 2 + 8) // 16
    derived = f"{int(info.sliceCount)}g.{gib}gb{api.GI_PROFILE_NAME_SUFFIX.get(selector, '')}"
    log.info("GPU-instance profile id %s has no NVML name; calling it %s", info.id, derived)
    return derived
