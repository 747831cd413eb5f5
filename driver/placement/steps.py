"""What one change to a GPU does, worked out once per (state, change) and looked up after that.

A change is an occupant added to a GPU, or one released. Its :class:`Step` holds the state the GPU
goes to, what that state derives (capacities, levels, group), the free instances it moves and the
signatures whose level it moves; GPUs keep returning to the same states, so a change is one dict
lookup instead of a derivation. Steps are kept on the state groups where GPUs are grouped (found
without hashing the state key), else in tables here; past a bound they are all dropped.
"""

from driver.placement.groups import StateGroups
from driver.placement.signatures import LevelChanges, SignatureIndexes
from driver.placement.state import GpuState, Occupant, StateKey, Step

MAX_STEPS = 1 << 17
"""GPU state transitions kept (see :class:`Step`); past it they are all dropped and rebuilt."""


class Steps:
    """The steps met so far, by (state, change).

    ``groups``: the state groups GPUs are kept in, if they are grouped (each step then names the
    group it leads into, and steps are kept on the groups)."""

    def __init__(self, signatures: SignatureIndexes, groups: StateGroups | None) -> None:
        self._signatures = signatures
        self._groups = groups
        self._steps: dict[tuple[StateKey, object], Step] = {}
        """(state, id of the occupant added or the state a release leads to) -> its step."""
        self._release_steps: dict[tuple[StateKey, int], Step] = {}
        """(state, id of the occupant released) -> its step, for :attr:`GpuState.disjoint` GPUs."""
        self._group_steps = 0
        """Steps kept on state groups instead (``StateGroup.adds`` and ``releases``)."""
        self._caps_diffs: dict[tuple[int, int], tuple[tuple[str, int], ...]] = {}

    def step_for(self, gpu: GpuState, added: Occupant | None, removed: Occupant | None) -> Step:
        """The step a GPU's change takes from its current state (``added``: the one occupant
        appended since its state was last set, if that is all; ``removed``: the one occupant taken
        out since, if that is all; neither: its occupants changed some other way)."""
        old_key = gpu.key
        group = gpu.group
        # With grouped GPUs the GPU's group is its state: steps are kept there, found without
        # hashing the state key.
        if group is not None and added is not None:
            step = group.adds.get(id(added))
            if step is None:
                step = self._step(gpu, added)
                group.adds[id(added)] = step
                self._group_steps += 1
            if step.overlaps:
                gpu.disjoint = False
            return step
        if group is not None and removed is not None and gpu.disjoint:
            step = group.releases.get(id(removed))
            if step is None:
                step = self._step(gpu, None, removed)
                group.releases[id(removed)] = step
                self._group_steps += 1
            return step
        if added is not None:
            step_key: tuple[StateKey, object] = (old_key, id(added))
            step = self._steps.get(step_key)
            if step is None:
                step = self._step(gpu, added)
                self._steps[step_key] = step
            if step.overlaps:
                gpu.disjoint = False
        elif removed is not None and gpu.disjoint:
            # The new state is the old one less the occupant's slices, ``+me`` and count.
            release_key = (old_key, id(removed))
            step = self._release_steps.get(release_key)
            if step is None:
                step = self._step(gpu, None, removed)
                self._release_steps[release_key] = step
        else:
            new_key = gpu.derived_key()
            step_key = (old_key, new_key)
            step = self._steps.get(step_key)
            if step is None:
                step = self._step(gpu, None)
                self._steps[step_key] = step
            gpu.disjoint = gpu.occupants_disjoint()
        return step

    def _step(self, gpu: GpuState, added: Occupant | None, removed: Occupant | None = None) -> Step:
        """Work out a step the long way, from the GPU as it is now (still in its old state, its
        occupants already changed); the GPU's derived fields are left in the new state."""
        if len(self._steps) + len(self._release_steps) + self._group_steps >= MAX_STEPS:
            self.drop()
        old_caps, old_levels, old_key = gpu.caps, gpu.levels, gpu.key
        overlaps = False
        if added is not None:
            table = gpu.table
            overlaps = bool(added.mask & gpu.mask) or (
                gpu.media_taken and (added.media or added.profile in table.media_names)
            )
            gpu.add(added)
        else:
            gpu.derive()
        moved: tuple[tuple[str, int], ...] = ()
        if gpu.caps is not old_caps:
            # Capacity tuples are shared per state (``GpuTable.capacities``), so what changes
            # between two of them is worked out once per pair.
            pair = (id(old_caps), id(gpu.caps))
            cached = self._caps_diffs.get(pair)
            if cached is None:
                cached = self._caps_diffs[pair] = tuple(
                    (profile.name, new - old)
                    for profile, old, new in zip(
                        gpu.table.profiles, old_caps, gpu.caps, strict=True
                    )
                    if new != old
                )
            moved = cached
        levels = self._signatures.levels_for(gpu)
        changed: LevelChanges = ()
        if levels is not old_levels:
            changed = self._signatures.changes(gpu.table, old_levels, levels)
        group = self._groups.group_for(gpu.key) if self._groups is not None else None
        occupant = added if added is not None else removed
        return Step(gpu, old_key, moved, levels, changed, group, occupant, overlaps=overlaps)

    def drop(self) -> None:
        """Forget every step (what they lead into changed, or there are too many)."""
        self._steps = {}
        self._release_steps = {}
        if self._group_steps and self._groups is not None:
            for group in self._groups.known():
                group.adds = {}
                group.releases = {}
            self._group_steps = 0
