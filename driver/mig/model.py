"""Frozen value types describing MIG geometry.

A GPU has ``memory_slices`` memory slices (8 on A100/H100/H200/B200, 4 on A30). A GPU instance of a
profile occupies ``size`` consecutive memory slices from a ``start`` the hardware allows. Two instances
on one GPU may not share a memory slice, and at most one instance with media extensions (``+me``)
exists per GPU. These types are pure data: the rules that use them live in the placement engine and
the GPU backends.
"""

from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from driver.errors import NotFoundError

MIB = 1024 * 1024

# NVML compute-instance profile constants (nvml.h NVML_COMPUTE_INSTANCE_PROFILE_*), keyed by the
# number of compute slices of the one compute instance that covers a whole GPU instance.
CI_PROFILE_BY_COMPUTE_SLICES: Final = MappingProxyType({1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6})


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a GPU instance sits: memory slices ``start`` … ``start + size - 1``."""

    start: int
    size: int

    @property
    def end(self) -> int:
        """One past the last memory slice covered."""
        return self.start + self.size

    @property
    def mask(self) -> int:
        """Bit ``i`` set for every memory slice ``i`` this placement covers."""
        return ((1 << self.size) - 1) << self.start

    def overlaps(self, other: "Placement") -> bool:
        return self.start < other.end and other.start < self.end


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile as NVML describes it, with the default compute instance over it.

    ``gi_profile_id`` is the NVML GPU-instance profile id (``nvidia-smi mig -lgip`` ID column, e.g. 19
    for 1g.5gb on an A100); ``ci_profile_id`` the NVML compute-instance profile constant of the one
    compute instance that covers the whole GPU instance. ``placements`` are listed in NVML order.
    """

    name: str
    gi_profile_id: int
    ci_profile_id: int
    memory_slices: int
    compute_slices: int
    memory_bytes: int
    multiprocessors: int
    media_extensions: bool
    max_count: int
    placements: tuple[Placement, ...]
    captured: bool = True
    """False where the reference had no hardware capture and the memory/SM figures are estimates."""

    def placement_at(self, start: int) -> Placement:
        """The allowed placement beginning at ``start``; ``NotFoundError`` naming it if not allowed."""
        for placement in self.placements:
            if placement.start == start:
                return placement
        allowed = ", ".join(str(p.start) for p in self.placements)
        raise NotFoundError(
            f"placement start {start} is not allowed for MIG profile {self.name} "
            f"(allowed starts: {allowed})"
        )


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A MIG-capable GPU product and every profile it supports."""

    name: str
    """Catalog key, e.g. ``A100-40GB``."""
    product_name: str
    """What NVML reports as the device name, e.g. ``NVIDIA A100-SXM4-40GB``."""
    memory_bytes: int
    memory_slices: int
    compute_slices: int
    multiprocessors: int
    profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile:
        """The profile called ``name``; ``NotFoundError`` naming it and the choices if unknown."""
        for profile in self.profiles:
            if profile.name == name:
                return profile
        known = ", ".join(p.name for p in self.profiles)
        raise NotFoundError(f"unknown MIG profile {name!r} for {self.name} (known: {known})")

    @property
    def profile_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.profiles)
