"""What the placement engine knows of one node and its GPUs: specs in, derived state out.

``GpuSpec``/``NodeSpec`` are what the controller builds from ResourceSlices; ``Occupant`` is one
taken slice, whoever made it. ``GpuState``/``NodeState`` are the engine's mutable view, derived from
the occupants and shared with the indexes in ``driver.placement.inventory``.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from driver.mig.model import GpuModel
from driver.placement.request import DeviceAssignment
from driver.placement.tables import GpuTable, Signature, table_for

if TYPE_CHECKING:
    from driver.placement.inventory import StateGroup

StateKey = tuple[GpuTable, int, bool, tuple[int, ...]]
"""Everything placement rules can see of one GPU: table, occupied mask, ``+me`` taken, counts."""

FREE_BITS = 6
"""A level is ``loss << FREE_BITS | free memory slices``: fewer destroyed placements first, then
the fuller GPU."""


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One MIG GPU as its node publishes it.

    ``published`` lists the (profile, start) devices the node publishes for this GPU; ``None`` means
    every placement of every profile of ``model``. The engine only ever returns published devices.
    """

    index: int
    model: GpuModel
    uuid: str = ""
    published: frozenset[tuple[str, int]] | None = None


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    gpus: tuple[GpuSpec, ...]


@dataclass(frozen=True, slots=True)
class Occupant:
    """One GPU instance that exists or is allocated, whoever made it.

    ``profile`` is optional: instances of unknown profile still block their memory slices (and the
    ``+me`` engine when ``media``), but count towards no profile's ``max_count``.
    """

    start: int
    size: int
    media: bool = False
    profile: str | None = None
    mask: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Placement.mask, inlined: an occupant is built on every occupy and release.
        object.__setattr__(self, "mask", ((1 << self.size) - 1) << self.start)


class GpuState:
    """One GPU's current state, derived from its occupants."""

    __slots__ = (
        "caps",
        "counts",
        "disjoint",
        "group",
        "index",
        "key",
        "levels",
        "mask",
        "media_taken",
        "node",
        "occupants",
        "spec",
        "table",
        "used",
    )

    def __init__(self, node: "NodeState", spec: GpuSpec, occupants: list[Occupant]) -> None:
        self.node = node
        self.spec = spec
        self.index = spec.index
        self.table: GpuTable = table_for(spec.model, spec.published)
        self.occupants = occupants
        self.mask = 0
        self.media_taken = False
        self.counts: tuple[int, ...] = (0,) * len(self.table.profiles)
        self.used = 0
        self.caps: tuple[int, ...] = (0,) * len(self.table.profiles)
        self.key: StateKey = (self.table, 0, False, self.counts)
        self.group: StateGroup | None = None
        """The inventory's group of GPUs in this GPU's state (``track_states`` only)."""
        # levels[sig id]: this GPU's level for the signature (lower is better), -1 if it cannot fit.
        self.levels: tuple[int, ...] = ()
        self.derive()
        self.disjoint = self.occupants_disjoint()
        """Whether the occupants' slices are pairwise disjoint and at most one holds the ``+me``
        engine (always, unless overlapping records were fed): then the state a release leads to
        follows from the current state and the occupant released alone (kept by the inventory)."""

    def derive(self) -> None:
        """Recompute mask, media and per-profile counts from the occupants."""
        _, mask, media, counts = self.derived_key()
        self._set(mask, media, counts)

    def derived_key(self) -> StateKey:
        """The state key :meth:`derive` would give, without changing anything."""
        table = self.table
        model_media = table.media_names
        by_name = table.profile_by_name
        mask = 0
        media = False
        counts = [0] * len(table.profiles)
        for occupant in self.occupants:
            mask |= occupant.mask
            name = occupant.profile
            if occupant.media or name in model_media:
                media = True
            if name is not None:
                profile = by_name.get(name)
                if profile is not None:
                    counts[profile.index] += 1
        return (table, mask & table.full_mask, media, tuple(counts))

    def occupants_disjoint(self) -> bool:
        """:attr:`disjoint` worked out from the occupants."""
        table = self.table
        full_mask, media_names = table.full_mask, table.media_names
        mask = 0
        media = False
        for occupant in self.occupants:
            taken = occupant.mask & full_mask
            if mask & taken:
                return False
            mask |= taken
            if occupant.media or occupant.profile in media_names:
                if media:
                    return False
                media = True
        return True

    def add(self, occupant: Occupant) -> None:
        """What :meth:`derive` gives after ``occupant`` was appended to the occupants, without
        going over them all (a release, which may uncover slices, needs :meth:`derive`)."""
        table = self.table
        name = occupant.profile
        counts = self.counts
        if name is not None:
            profile = table.profile_by_name.get(name)
            if profile is not None:
                index = profile.index
                counts = (*counts[:index], counts[index] + 1, *counts[index + 1 :])
        self._set(
            (self.mask | occupant.mask) & table.full_mask,
            self.media_taken or occupant.media or name in table.media_names,
            counts,
        )

    def _set(self, mask: int, media: bool, counts: tuple[int, ...]) -> None:
        table = self.table
        self.mask = mask
        self.media_taken = media
        self.counts = counts
        self.used = mask.bit_count()
        self.caps = table.capacities(mask=mask, media_taken=media, counts=counts)
        self.key = (table, mask, media, counts)

    @property
    def state_key(self) -> StateKey:
        """Everything placement rules can see of this GPU: equal keys, equal answers."""
        return self.key

    def level(self, signature: Signature, *, graded: bool) -> int:
        """-1 if ``signature`` cannot fit; else 0, or with ``graded`` its (loss, fullness) code."""
        loss = self.table.loss(
            signature, mask=self.mask, media_taken=self.media_taken, counts=self.counts
        )
        if loss < 0 or not graded:
            return loss if loss < 0 else 0
        return (loss << FREE_BITS) | (self.table.slices - self.used)


class NodeState:
    __slots__ = ("assigned", "best", "fitting", "gpus", "name", "rank", "shape", "spec")

    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.rank = -1
        self.gpus: tuple[GpuState, ...] = ()
        self.shape: tuple[GpuTable, ...] = ()
        # sig id -> the best (lowest) level among this node's GPUs; absent if none can fit.
        self.best: dict[int, int] = {}
        self.fitting: dict[int, int] = {}
        """sig id -> how many of this node's GPUs can take it now (kept up to date without
        ``track_levels``, where it decides ``best``; set when a node or signature is added)."""
        self.assigned: dict[tuple[str, int, int, int], tuple[DeviceAssignment]] = {}
        """(request name, GPU position, table profile, placement index) -> that one device as a
        search's answer: assignments are immutable, so equal answers are one object."""
