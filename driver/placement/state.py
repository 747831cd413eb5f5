"""What the placement engine knows of one node and its GPUs: specs in, derived state out.

``GpuSpec``/``NodeSpec`` are what the controller builds from ResourceSlices; ``Occupant`` is one
taken slice, whoever made it. ``GpuState``/``NodeState`` are the engine's mutable view, derived from
the occupants. The records the inventory's parts keep them in live here too, since a GPU and its
records refer to each other: ``SignatureIndex`` (the nodes able to take a signature, see
``driver.placement.signatures``), ``StateGroup`` (the GPUs in one state, see
``driver.placement.groups``) and ``Step`` (what one change does to a GPU in one state, see
``driver.placement.steps``).
"""

from collections.abc import Hashable
from dataclasses import dataclass, field

from driver.mig.model import GpuModel
from driver.placement.rankset import RankSet
from driver.placement.request import DeviceAssignment
from driver.placement.tables import GpuTable, Signature, table_for

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
        """The group of GPUs in this GPU's state (``track_states`` only)."""
        # levels[sig id]: this GPU's level for the signature (lower is better), -1 if it cannot fit.
        self.levels: tuple[int, ...] = ()
        self.derive()
        self.disjoint = self.occupants_disjoint()
        """Whether the occupants' slices are pairwise disjoint and at most one holds the ``+me``
        engine (always, unless overlapping records were fed): then the state a release leads to
        follows from the current state and the occupant released alone (a kept step)."""

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


class SignatureIndex:
    """Nodes that have a GPU able to take ``signature`` now, overall and by their best level."""

    __slots__ = ("any", "id", "level_set", "signature", "tiers")

    def __init__(self, signature: Signature, sig_id: int) -> None:
        self.signature = signature
        self.id = sig_id
        self.any = RankSet()
        self.tiers: dict[int, RankSet] = {}
        self.level_set = RankSet()
        """Levels whose tier is non-empty."""

    def add(self, rank: int, level: int, *, graded: bool) -> None:
        self.any.add(rank)
        if graded:
            tier = self.tiers.get(level)
            if tier is None:
                tier = self.tiers[level] = RankSet()
            if not tier:
                self.level_set.add(level)
            tier.add(rank)

    def discard(self, rank: int, level: int, *, graded: bool) -> None:
        self.any.discard(rank)
        if graded:
            tier = self.tiers[level]
            tier.discard(rank)
            if not tier:
                self.level_set.discard(level)

    def move(self, rank: int, old: int, new: int) -> None:
        """A member's level changed (``any`` is untouched)."""
        leaving = self.tiers[old]
        leaving.discard(rank)
        if not leaving:
            self.level_set.discard(old)
        entering = self.tiers.get(new)
        if entering is None:
            entering = self.tiers[new] = RankSet()
        if not entering:
            self.level_set.add(new)
        entering.add(rank)

    def clear(self) -> None:
        self.any = RankSet()
        self.tiers = {}
        self.level_set = RankSet()


Buckets = dict[int, dict["StateGroup", None]]
"""State groups by a policy's bucket of them (see :meth:`StateGroups.buckets`)."""


class StateGroup:
    """The GPUs that are in one state (``track_states``), and what policies derived from it.

    ``memo`` is scratch space for policies: values that depend on the state alone (e.g. the
    placements a profile has there and what each would cost), computed once per state. A group
    outlives its last GPU (GPUs come back to the same states all the time, and would otherwise
    recompute its memo), up to ``groups.MAX_KNOWN_STATES`` groups.
    """

    __slots__ = ("adds", "free", "gpus", "joined", "joins", "key", "memo", "releases")

    def __init__(self, key: StateKey) -> None:
        self.key = key
        table, mask, _, _ = key
        self.free = table.slices - mask.bit_count()
        """Free memory slices of each GPU in the state."""
        self.gpus: dict[GpuState, None] = {}
        self.memo: dict[Hashable, int] = {}
        self.joins: list[tuple[Buckets, int]] = []
        """The buckets this group belongs in while it has GPUs, and its bucket in each
        (worked out once per bucketing, not on every first GPU)."""
        self.joined = 0
        """How many of the bucketings ``joins`` covers (all of them while live)."""
        self.adds: dict[int, Step] = {}
        """Id of an occupant added -> the step it takes a GPU in this state (the step
        table for ``track_states``: a GPU change looks its step up without hashing the
        state key)."""
        self.releases: dict[int, Step] = {}
        """Id of an occupant released -> its step, for :attr:`GpuState.disjoint` GPUs."""


class Step:
    """What one change (an occupant added, or a release leading to a given state) does to a GPU in
    one state: its new state, what that state derives, and what moves in the indexes. Worked out
    once per (state, change), so a GPU change is one dict lookup."""

    __slots__ = (
        "caps",
        "changed",
        "counts",
        "group",
        "key",
        "levels",
        "mask",
        "media",
        "moved",
        "moves_group",
        "occupant",
        "overlaps",
        "used",
    )

    def __init__(
        self,
        gpu: GpuState,
        old_key: StateKey,
        moved: tuple[tuple[str, int], ...],
        levels: tuple[int, ...],
        changed: tuple[tuple[SignatureIndex, int, int], ...],
        group: StateGroup | None,
        occupant: Occupant | None,
        *,
        overlaps: bool,
    ) -> None:
        self.mask = gpu.mask
        self.media = gpu.media_taken
        self.counts = gpu.counts
        self.used = gpu.used
        self.caps = gpu.caps
        self.key = gpu.key
        self.moves_group = group is not None and gpu.key != old_key
        self.group = group
        self.moved = moved
        self.levels = levels
        self.changed = changed
        self.occupant = occupant
        """The occupant added or released (held so that its id, the step's key, stays its own)."""
        self.overlaps = overlaps
        """Whether the occupant added overlaps the state's slices or ``+me`` engine (the GPU's
        occupants are no longer :attr:`GpuState.disjoint`)."""
