"""NVIDIA's rules for placing a new GPU instance, as pure functions.

Shared by the emulated backend and the fake NVML, so that both refuse exactly what a real GPU
refuses (docs/design.md F18):

- a GPU instance may only start at one of its profile's allowed placement starts;
- two GPU instances may not share a memory slice;
- at most one instance with media extensions (``+me``) exists per GPU;
- at most ``max_count`` instances of one profile exist per GPU.

A real GPU answers the last three with ``NVML_ERROR_INSUFFICIENT_RESOURCES``; a start that is not
allowed is a bad argument.
"""

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from driver.errors import PlacementOccupiedError
from driver.mig.model import MigProfile, Placement


@dataclass(frozen=True, slots=True)
class Occupant:
    """An existing GPU instance, as far as the placement rules care."""

    profile: MigProfile
    placement: Placement


class Refusal(enum.Enum):
    """Why a new GPU instance cannot be created where asked."""

    START_NOT_ALLOWED = "start-not-allowed"
    OVERLAP = "overlap"
    MAX_COUNT_REACHED = "max-count-reached"
    MEDIA_EXTENSIONS_IN_USE = "media-extensions-in-use"

    @property
    def occupied(self) -> bool:
        """True for every refusal NVML reports as ``INSUFFICIENT_RESOURCES``."""
        return self is not Refusal.START_NOT_ALLOWED


def refusal(
    *, profile: MigProfile, start: int, occupants: Iterable[Occupant]
) -> tuple[Refusal, Occupant | None] | None:
    """``None`` if ``profile`` fits at ``start`` beside ``occupants``; else why not, and with whom."""
    placement = next((p for p in profile.placements if p.start == start), None)
    if placement is None:
        return Refusal.START_NOT_ALLOWED, None
    existing = tuple(occupants)
    for occupant in existing:
        if occupant.placement.overlaps(placement):
            return Refusal.OVERLAP, occupant
    if profile.media_extensions:
        for occupant in existing:
            if occupant.profile.media_extensions:
                return Refusal.MEDIA_EXTENSIONS_IN_USE, occupant
    same_profile = [o for o in existing if o.profile.gi_profile_id == profile.gi_profile_id]
    if len(same_profile) >= profile.max_count:
        return Refusal.MAX_COUNT_REACHED, same_profile[0]
    return None


def checked_placement(
    *, gpu_index: int, profile: MigProfile, start: int, occupants: Iterable[Occupant]
) -> Placement:
    """The placement for ``profile`` at ``start``, or the typed error a caller should see.

    ``NotFoundError`` (from ``MigProfile.placement_at``) for a start that is not allowed,
    ``PlacementOccupiedError`` naming the placement and what is in the way otherwise.
    """
    placement = profile.placement_at(start)
    verdict = refusal(profile=profile, start=start, occupants=occupants)
    if verdict is None:
        return placement
    reason, other = verdict
    asked = f"{profile.name} at placement start {start} on GPU {gpu_index}"
    if reason is Refusal.MAX_COUNT_REACHED:
        detail = f"the GPU already has the maximum of {profile.max_count} {profile.name} instances"
    elif other is None:  # pragma: no cover - every other refusal names the instance in the way
        detail = reason.value
    elif reason is Refusal.OVERLAP:
        detail = (
            f"its memory slices {slice_range(placement)} overlap {other.profile.name} "
            f"at start {other.placement.start} (memory slices {slice_range(other.placement)})"
        )
    else:
        detail = (
            f"the GPU's one media-extensions (+me) instance is already taken by "
            f"{other.profile.name} at start {other.placement.start}"
        )
    raise PlacementOccupiedError(f"placement occupied: {asked}: {detail}")


def slice_range(placement: Placement) -> str:
    """``2-3`` for memory slices 2 and 3, ``5`` for slice 5 alone."""
    last = placement.end - 1
    return str(placement.start) if last == placement.start else f"{placement.start}-{last}"


def lowest_free_id(used: Iterable[int], *, first: int) -> int:
    """The smallest id ``>= first`` not in ``used`` (how the emulators number GPU instances)."""
    taken = set(used)
    candidate = first
    while candidate in taken:
        candidate += 1
    return candidate
