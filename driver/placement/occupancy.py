"""What is taken: the occupants of each (node, GPU index), by us or by anyone else.

Occupancy is kept apart from the registry of nodes: it is recorded per (node, GPU index) even before
the node is known, so the controller may feed allocated claims and ResourceSlices in any order. A
registered GPU shares its list of occupants with the occupancy (``GpuState.occupants`` is the list
:meth:`Occupancy.held` hands out), so what is recorded here is what the GPU derives its state from.
"""

from driver.errors import NotFoundError
from driver.placement.state import Occupant

OCCUPANT_CACHE_LIMIT = 4096
"""Distinct occupants kept interned; past it they are all dropped (and built again on use)."""


class Occupancy:
    """The occupants of every (node, GPU index) ever occupied, known node or not."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], list[Occupant]] = {}
        self._interned: dict[tuple[int, int, bool, str | None], Occupant] = {}
        """Occupants are immutable, so equal ones are one object (built once, not per occupy)."""

    def held(self, node: str, gpu_index: int) -> list[Occupant]:
        """The live list of the GPU's occupants (created empty on first use), for its state."""
        return self._held.setdefault((node, gpu_index), [])

    def occupants(self, node: str, gpu_index: int) -> tuple[Occupant, ...]:
        return tuple(self._held.get((node, gpu_index), ()))

    def occupant(self, *, start: int, size: int, media: bool, profile: str | None) -> Occupant:
        """The one occupant object of these fields (built once, not per occupy)."""
        if start < 0 or size < 1:
            raise ValueError(f"bad placement start={start} size={size}")
        described = (start, size, media, profile)
        occupant = self._interned.get(described)
        if occupant is None:
            if len(self._interned) >= OCCUPANT_CACHE_LIMIT:
                self._interned.clear()
            occupant = Occupant(start=start, size=size, media=media, profile=profile)
            self._interned[described] = occupant
        return occupant

    def occupy(self, node: str, gpu_index: int, occupant: Occupant) -> None:
        """Record ``occupant`` on the GPU; never refuses (overlapping records all block)."""
        key = (node, gpu_index)
        occupants = self._held.get(key)
        if occupants is None:
            occupants = self._held[key] = []
        occupants.append(occupant)

    def release(
        self, node: str, gpu_index: int, *, start: int, size: int, media: bool, profile: str | None
    ) -> Occupant:
        """Take out the first occupant of the GPU equal to these fields and answer it;
        ``NotFoundError`` if there is none."""
        occupants = self._held.get((node, gpu_index), [])
        # The first equal occupant goes (what ``list.remove`` of an equal Occupant would do).
        for at, held in enumerate(occupants):
            if (
                held.start == start
                and held.size == size
                and held.media == media
                and held.profile == profile
            ):
                del occupants[at]
                return held
        occupant = Occupant(start=start, size=size, media=media, profile=profile)
        raise NotFoundError(
            f"no occupied slice {occupant} on GPU {gpu_index} of node {node} to release"
        )
