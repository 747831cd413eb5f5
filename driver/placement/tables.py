"""Precomputed MIG geometry per GPU table, shared by every GPU that publishes the same devices.

A GPU's state is small — an occupied memory-slice mask, whether its one ``+me`` instance is taken, and
how many instances of each profile it holds — so everything a decision asks of one GPU ("which starts
of 2g.10gb are free?", "can this GPU still take 2 x 1g.5gb and a 2g.10gb?", "how many future
placements would a 1g at start 6 destroy?") is looked up, not computed. A *table* is a GPU model
restricted to the (profile, start) devices its node publishes; GPUs with identical tables share one.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from driver.mig.model import GpuModel, MigProfile, Placement

Signature = tuple[tuple[str, int], ...]
"""A multiset of profiles that must fit on one GPU together: sorted ``(profile name, count)`` pairs."""


def signature_of(counts: Iterable[tuple[str, int]]) -> Signature:
    merged: dict[str, int] = {}
    for name, count in counts:
        merged[name] = merged.get(name, 0) + count
    return tuple(sorted(merged.items()))


@dataclass(frozen=True, slots=True)
class TableProfile:
    """One profile as this table publishes it: only the allowed placements, in NVML order."""

    index: int
    profile: MigProfile
    placements: tuple[Placement, ...]
    masks: tuple[int, ...]
    name: str
    media: bool


class GpuTable:
    """The placement rules of one GPU model restricted to a set of published devices."""

    __slots__ = (
        "_capacity_loss",
        "_caps",
        "_free_starts",
        "_loss_cache",
        "_open",
        "_ranked",
        "full_mask",
        "media_names",
        "model",
        "profile_by_name",
        "profiles",
        "slices",
    )

    def __init__(self, model: GpuModel, published: frozenset[tuple[str, int]] | None) -> None:
        self.model = model
        self.slices = model.memory_slices
        self.full_mask = (1 << self.slices) - 1
        self.media_names = frozenset(p.name for p in model.profiles if p.media_extensions)
        profiles: list[TableProfile] = []
        for profile in model.profiles:
            placements = tuple(
                p
                for p in profile.placements
                if published is None or (profile.name, p.start) in published
            )
            if placements and profile.max_count > 0:
                profiles.append(
                    TableProfile(
                        index=len(profiles),
                        profile=profile,
                        placements=placements,
                        masks=tuple(p.mask for p in placements),
                        name=profile.name,
                        media=profile.media_extensions,
                    )
                )
        self.profiles: tuple[TableProfile, ...] = tuple(profiles)
        self.profile_by_name: dict[str, TableProfile] = {p.name: p for p in profiles}
        # _free_starts[(mask << 1) | media_taken][profile index]: indexes into that profile's
        # placements that are geometrically free, in NVML order (max_count is checked by callers).
        states = 1 << (self.slices + 1)
        free: list[tuple[tuple[int, ...], ...]] = []
        for state in range(states):
            mask, media_taken = state >> 1, bool(state & 1)
            free.append(
                tuple(
                    ()
                    if p.media and media_taken
                    else tuple(i for i, m in enumerate(p.masks) if not m & mask)
                    for p in profiles
                )
            )
        self._free_starts = free
        # _open[mask]: the placements (of non-+me profiles) still free when ``mask`` is occupied,
        # each weighted by its memory slices — losing the one 7g start costs 8, a 1g start 1.
        self._open = [
            sum(
                p.profile.memory_slices
                for p in profiles
                if not p.media
                for m in p.masks
                if not m & mask
            )
            for mask in range(1 << self.slices)
        ]
        self._caps: dict[tuple[int, bool, tuple[int, ...]], tuple[int, ...]] = {}
        self._ranked: dict[int, tuple[tuple[int, int], ...]] = {}
        self._capacity_loss: dict[
            tuple[int, bool, tuple[int, ...], int],
            tuple[tuple[int, tuple[tuple[int, int], ...]], ...],
        ] = {}
        self._loss_cache: dict[tuple[Signature, int, bool, tuple[int, ...]], int] = {}

    def free_starts(self, profile: int, *, mask: int, media_taken: bool) -> tuple[int, ...]:
        """Indexes of ``profile``'s placements that do not overlap ``mask`` (and obey ``+me``)."""
        return self._free_starts[(mask << 1) | media_taken][profile]

    def destroyed(self, profile: int, placement: int, *, mask: int) -> int:
        """The free placements a new instance here would overlap, weighted by their memory slices.

        The measure the fragmentation-aware policy minimises. On an empty A100 a 1g at start 0 kills
        the 7g, 4g, 3g, 2g, 1g.10gb and 1g starts at 0 (8+4+4+2+2+1 = 21); at start 6 only the 7g,
        the 3g at 4, the 1g.10gb at 6 and the 1g at 6 (8+4+2+1 = 15). Weighting by size makes a
        start that keeps a big slice possible worth more than several small ones, and makes a
        profile name that is smaller on one GPU model (``1g.10gb``: 1 slice on an A100-80GB, 2 on an
        A100-40GB) compete fairly for both. ``+me`` profiles are left out: they duplicate their base
        profile's starts.
        """
        new = self.profiles[profile].masks[placement]
        return self._open[mask] - self._open[mask | new]

    def ranked_starts(
        self, profile: int, *, mask: int, media_taken: bool
    ) -> tuple[tuple[int, int], ...]:
        """``(destroyed, placement index)`` of the profile's free placements, fewest destroyed first
        (then NVML order): what the fragmentation-aware policy tries, computed once per state."""
        key = ((((mask << 1) | media_taken) << 6) | profile) if profile < 64 else -1
        ranked = self._ranked.get(key) if key >= 0 else None
        if ranked is None:
            new_masks = self.profiles[profile].masks
            open_now = self._open[mask]
            ranked = tuple(
                sorted(
                    (open_now - self._open[mask | new_masks[i]], i)
                    for i in self._free_starts[(mask << 1) | media_taken][profile]
                )
            )
            if key >= 0:
                self._ranked[key] = ranked
        return ranked

    def capacity_losses(
        self, profile: int, *, mask: int, media_taken: bool, counts: tuple[int, ...]
    ) -> tuple[tuple[int, tuple[tuple[int, int], ...]], ...]:
        """Per free placement of ``profile`` (under ``max_count``): its index and, for each table
        profile whose :meth:`capacities` a new instance there lowers, ``(profile index, by how
        many)``. What the scarcity-aware policy weighs; computed once per state."""
        key = (mask, media_taken, counts, profile)
        losses = self._capacity_loss.get(key)
        if losses is None:
            placed = self.profiles[profile]
            if counts[profile] >= placed.profile.max_count:
                losses = ()
            else:
                before = self.capacities(mask=mask, media_taken=media_taken, counts=counts)
                after_counts = (*counts[:profile], counts[profile] + 1, *counts[profile + 1 :])
                found = []
                for i in self._free_starts[(mask << 1) | media_taken][profile]:
                    after = self.capacities(
                        mask=mask | placed.masks[i],
                        media_taken=media_taken or placed.media,
                        counts=after_counts,
                    )
                    found.append(
                        (
                            i,
                            tuple(
                                (q, b - a)
                                for q, (b, a) in enumerate(zip(before, after, strict=True))
                                if b != a
                            ),
                        )
                    )
                losses = tuple(found)
            self._capacity_loss[key] = losses
        return losses

    def loss(
        self, signature: Signature, *, mask: int, media_taken: bool, counts: tuple[int, ...]
    ) -> int:
        """Least :meth:`destroyed` total for fitting all of ``signature`` here; ``-1``: no fit.

        ``counts`` are the instances of each table profile already on the GPU (for ``max_count``).
        """
        key = (signature, mask, media_taken, counts)
        cached = self._loss_cache.get(key)
        if cached is None:
            best = self._best_mask(signature, mask=mask, media_taken=media_taken, counts=counts)
            cached = -1 if best < 0 else self._open[mask] - self._open[best]
            self._loss_cache[key] = cached
        return cached

    def fits(
        self, signature: Signature, *, mask: int, media_taken: bool, counts: tuple[int, ...]
    ) -> bool:
        """Whether every profile of ``signature`` fits together on a GPU in this state."""
        return self.loss(signature, mask=mask, media_taken=media_taken, counts=counts) >= 0

    def _best_mask(
        self, signature: Signature, *, mask: int, media_taken: bool, counts: tuple[int, ...]
    ) -> int:
        """The occupied mask after fitting ``signature`` that keeps most placements open; -1: none."""
        needs: list[int] = []
        for name, count in signature:
            profile = self.profile_by_name.get(name)
            if profile is None:
                return -1
            if counts[profile.index] + count > profile.profile.max_count:
                return -1
            needs.extend([profile.index] * count)
        # Largest first: big instances have the fewest starts, so failures show early.
        needs.sort(key=lambda i: -self.profiles[i].profile.memory_slices)
        return self._place_all(needs, 0, mask, media_taken, -1)

    def _place_all(
        self, needs: list[int], depth: int, mask: int, media_taken: bool, last: int
    ) -> int:
        if depth == len(needs):
            return mask
        index = needs[depth]
        profile = self.profiles[index]
        same_as_previous = depth > 0 and needs[depth - 1] == index
        best = -1
        for i in self._free_starts[(mask << 1) | media_taken][index]:
            # Instances of one profile are interchangeable: take their starts in increasing order.
            if same_as_previous and i <= last:
                continue
            found = self._place_all(
                needs, depth + 1, mask | profile.masks[i], media_taken or profile.media, i
            )
            if found >= 0 and (best < 0 or self._open[found] > self._open[best]):
                best = found
        return best

    def capacities(
        self, *, mask: int, media_taken: bool, counts: tuple[int, ...]
    ) -> tuple[int, ...]:
        """Per profile, how many more instances of it alone could still be created on the GPU."""
        key = (mask, media_taken, counts)
        caps = self._caps.get(key)
        if caps is None:
            state = (mask << 1) | media_taken
            caps = tuple(
                max(
                    0,
                    min(
                        (1 if self._free_starts[state][p.index] else 0)
                        if p.media
                        else _max_disjoint(p.masks, mask),
                        p.profile.max_count - counts[p.index],
                    ),
                )
                for p in self.profiles
            )
            self._caps[key] = caps
        return caps


def _max_disjoint(masks: tuple[int, ...], occupied: int) -> int:
    best = 0
    for i, m in enumerate(masks):
        if not m & occupied:
            best = max(best, 1 + _max_disjoint(masks[i + 1 :], occupied | m))
    return best


_TABLES: dict[tuple[GpuModel, frozenset[tuple[str, int]] | None], GpuTable] = {}


def table_for(model: GpuModel, published: frozenset[tuple[str, int]] | None) -> GpuTable:
    """The shared table of ``model`` restricted to ``published`` devices (``None``: all of them)."""
    key = (model, published)
    table = _TABLES.get(key)
    if table is None:
        table = GpuTable(model, published)
        _TABLES[key] = table
    return table
