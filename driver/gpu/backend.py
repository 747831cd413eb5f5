"""The ``GpuBackend`` seam: what the kubelet plugin needs from a GPU, whatever drives it.

Two implementations stand behind it: ``driver.gpu.nvml`` (real GPUs through NVML) and
``driver.gpu.emulated`` (the catalog's MIG rules, no hardware). Both pass the same contract suite in
``tests/contract/test_gpu_backend.py``. Only a daemon's ``main`` chooses one.

Errors every implementation raises (``driver.errors``):

- ``NotFoundError``: a GPU index, profile, placement start or GPU-instance id that does not exist;
- ``PlacementOccupiedError``: the placement overlaps an existing GPU instance, the GPU already has
  its one ``+me`` instance, or the profile's maximum count is reached (NVML answers all three with
  ``INSUFFICIENT_RESOURCES``);
- ``ConfigError``: MIG mode is off on the GPU asked for (never toggled silently), or bad settings;
- ``BackendError``: any other failure of the backend.

Health: ``gpus()`` reports every GPU it can count, also one that stopped answering or is otherwise
unfit for new slices (``GpuInfo.healthy`` False, ``health_reason`` saying why), rather than failing
for the whole node. ``instances``, ``create_slice`` and ``destroy_slice`` on such a GPU still raise
what the GPU answers.

Usage: ``slice_usage`` reads what one MIG device uses now — its memory, and its utilization where
the GPU reports one per MIG device (NVML answers ``NOT_SUPPORTED`` for MIG devices on most GPUs:
then ``None``). Read-only and cheap (a handful of NVML queries), for metrics at scrape time.

XID events: ``next_xid_event`` waits for the next XID critical-error event any GPU reports (NVML's
event API: ``nvmlEventSetCreate``, ``nvmlDeviceRegisterEvents``, ``nvmlEventSetWait_v2``). Which
XIDs make a GPU unhealthy is the caller's policy, not the backend's.
"""

from dataclasses import dataclass
from typing import Protocol

from driver.errors import NotFoundError
from driver.ids import GpuUuid, MigUuid
from driver.mig.model import GpuModel, Placement


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One physical GPU as the backend sees it now."""

    index: int
    uuid: GpuUuid
    product_name: str
    memory_bytes: int
    multiprocessors: int
    """Multiprocessors usable by MIG instances (the largest GPU-instance profile's); 0 if unknown."""
    mig_enabled: bool
    mig_pending: bool | None
    """MIG mode after the next GPU reset; ``None`` when the GPU cannot tell (no MIG support)."""
    minor: int | None
    """The ``/dev/nvidia<minor>`` device node's minor number, when known."""
    model: GpuModel | None
    """Profiles and placements as this GPU reports them; ``None`` while MIG mode is off."""
    healthy: bool = True
    """False when the GPU should get no new slices: it stopped answering (NVML: GPU lost),
    has memory errors pending a reset, or was marked unhealthy (emulated). The kubelet plugin
    withdraws its devices; slices that exist on it are left alone."""
    health_reason: str | None = None
    """Why the GPU is unhealthy, in words for a person (``None`` while healthy)."""
    health_code: str | None = None
    """Why the GPU is unhealthy as a short token usable as a taint value (a Kubernetes label
    value: ``GpuLost``, ``RetiredPagesPending``, ``Xid79``, …); ``None`` while healthy."""


@dataclass(frozen=True, slots=True)
class XidEvent:
    """An XID critical-error event a GPU reported (``nvmlEventTypeXidCriticalError``)."""

    gpu_index: int
    gpu_uuid: GpuUuid
    xid: int
    gi_id: int | None = None
    """The GPU instance the error hit, when the driver says (MIG mode); ``None`` for the GPU."""
    ci_id: int | None = None


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A GPU instance that exists on a GPU, with its default compute instance if it has one."""

    gpu_index: int
    gpu_uuid: GpuUuid
    profile: str
    placement: Placement
    gi_id: int
    ci_id: int | None
    """``None``: a GPU instance without a compute instance (half-created; recovery destroys it)."""
    mig_uuid: MigUuid | None
    gi_cap_minor: int | None = None
    """Minor of ``/dev/nvidia-caps/nvidia-cap<N>`` granting access to the GPU instance."""
    ci_cap_minor: int | None = None
    """Minor of ``/dev/nvidia-caps/nvidia-cap<N>`` granting access to the compute instance."""

    @property
    def complete(self) -> bool:
        """True when the instance is usable: it has its compute instance and a MIG UUID."""
        return self.ci_id is not None and self.mig_uuid is not None


@dataclass(frozen=True, slots=True)
class SliceUsage:
    """What one MIG device uses now (NVML's ``nvmlDeviceGetMemoryInfo`` and
    ``nvmlDeviceGetUtilizationRates`` on the MIG device's handle)."""

    memory_used_bytes: int
    memory_total_bytes: int
    gpu_utilization_percent: int | None = None
    """Percent of the last sample period a kernel ran; ``None`` where the GPU does not report it
    for MIG devices."""
    memory_utilization_percent: int | None = None
    """Percent of the last sample period device memory was read or written; ``None`` likewise."""


class GpuBackend(Protocol):
    """Discover GPUs and their MIG instances; create and destroy one slice at a time.

    Implementations are safe to call from several threads; calls on one GPU are serialised.
    """

    def gpus(self) -> tuple[GpuInfo, ...]:
        """Every GPU on the node, in index order."""
        ...

    def instances(self, *, gpu_index: int | None = None) -> tuple[MigInstance, ...]:
        """Existing GPU instances (of one GPU, or all), ordered by GPU index then GI id."""
        ...

    def create_slice(self, *, gpu_index: int, profile: str, start: int) -> MigInstance:
        """Create a GPU instance of ``profile`` at placement ``start`` and its default compute instance.

        If the compute instance cannot be created, the GPU instance is destroyed before raising:
        nothing is left half-created by an error (only a crash can leave that).
        """
        ...

    def destroy_slice(self, *, gpu_index: int, gi_id: int) -> None:
        """Destroy the compute instances of GPU instance ``gi_id``, then the GPU instance."""
        ...

    def slice_usage(self, *, mig_uuid: MigUuid) -> SliceUsage:
        """What the MIG device ``mig_uuid`` uses now. ``NotFoundError`` when no MIG device has
        that UUID, ``BackendError`` when the GPU cannot be asked."""
        ...

    def next_xid_event(self, *, timeout_seconds: float) -> XidEvent | None:
        """Wait up to ``timeout_seconds`` for the next XID critical-error event of any GPU.

        ``None`` when none came (or the backend cannot watch events, after waiting). Raises
        ``BackendError`` if watching failed; events that happened before the first call may be
        missed (NVML delivers only events registered for).
        """
        ...

    def close(self) -> None:
        """Release the backend's resources; later calls raise ``BackendError``."""
        ...


class MigModeBackend(GpuBackend, Protocol):
    """A ``GpuBackend`` that can also turn MIG mode on (``--mig-mode when-idle``); both backends are.

    Kept apart from ``GpuBackend`` because only the kubelet plugin's start-up MIG-mode step and the
    node self-check need it: everything else must work with MIG mode as it finds it.
    """

    def running_processes(self, *, gpu_index: int) -> int:
        """How many compute and graphics processes run on the GPU now (0: idle)."""
        ...

    def set_mig_mode(self, *, gpu_index: int, enabled: bool) -> None:
        """Ask for MIG mode on or off. It applies at once, or becomes pending until a GPU reset
        (``GpuInfo.mig_pending``); ``BackendError`` if the GPU refuses (no permission, busy)."""
        ...

    def reset_gpu(self, *, gpu_index: int) -> None:
        """Reset the GPU, applying a pending MIG mode (every process and MIG instance on it ends).
        ``BackendError`` when the reset is refused or impossible (not permitted, GPU in use)."""
        ...


def gpu_by_index(gpus: tuple[GpuInfo, ...], index: int) -> GpuInfo:
    """The GPU with ``index``; ``NotFoundError`` naming it and the indexes there are otherwise."""
    for gpu in gpus:
        if gpu.index == index:
            return gpu
    known = ", ".join(str(g.index) for g in gpus) or "none"
    raise NotFoundError(f"GPU index {index} does not exist on this node (GPU indexes: {known})")
