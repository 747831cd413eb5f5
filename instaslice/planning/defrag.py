"""Defragmentation advice: the fewest running pods to move so that a profile fits.

The input is the placement engine holding the cluster's inventory and occupancy, plus the *units*
that can move: each the slices of one pod (or of pods sharing a claim, which can only move together).
Slices of no unit (a claim no running pod holds, another driver's instance) stay put.

A plan is valid when, after the plan's units leave their slices, ``count`` instances of the profile
fit at the plan's target placements *and* every unit that left can be placed again elsewhere by the
engine (largest first, with the engine's policy), never on a target placement. The search enumerates
target placements by the units they displace — the blockers of a placement are exactly the units with
a slice overlapping it (or holding the GPU's one ``+me`` engine for a ``+me`` profile) — cheapest
first, and adds further units only when the blockers cannot all be re-placed. Plans are tried in
increasing size, so the first valid plan is a smallest one (``proven_minimal``) unless the step budget
ran out first. ``max_units`` bounds the plans tried (a caller that can afford only so many moves, such
as the simulator's defragmentation on rejection), and ``one_gpu`` asks for every target on one GPU (a
pod whose slices must share a GPU).

A search reports the *search steps* it spent (``search_steps``): ``GPU_READ_STEPS`` per GPU read for
target placements, one per step of the target-set enumeration and ``WALK_STEPS_PER_PLAN`` per plan
checked (weights that make a step take about the same time whatever the search spends it on).
``max_search_steps`` caps them: a caller that runs many searches (the simulator, once per rejected
request) gives each search what is left of its own total, so the total is exact, and a search stopped
by it says so (``NoPlan.allowance_spent``). Counting steps instead of seconds keeps every result
reproducible from run to run.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from driver.errors import ConfigError, PlacementError
from driver.placement import (
    DeviceRequest,
    Engine,
    NoFit,
    Occupant,
    Placed,
    PodRequest,
    same_gpu,
)
from driver.placement.request import DeviceAssignment

DEFAULT_BUDGET = 2_000
"""Plans checked (each one release/commit/place round on the engine) before settling for the best
plan found without proof that it is the smallest."""

WALK_STEPS_PER_PLAN = 50
"""Candidate steps of the target-set enumeration allowed per plan of the budget; also what one
checked plan counts in search steps (it costs about as much time as that many steps)."""


GPU_READ_STEPS = 50
"""What reading one GPU for the target placements counts in search steps (about the time of one
checked plan)."""


class _OutOfBudgetError(Exception):
    pass


class _OutOfAllowanceError(Exception):
    """The caller's ``max_search_steps`` cannot pay for the next step: the search ends (no second
    pass as after ``_OutOfBudgetError``)."""


@dataclass(frozen=True, slots=True)
class UnitSlice:
    """One slice a unit holds now."""

    node: str
    gpu_index: int
    profile: str
    start: int
    size: int
    media: bool


@dataclass(frozen=True, slots=True)
class Unit:
    """What moves together: one pod's slices (or several pods sharing a claim)."""

    key: str
    """How people name it, e.g. ``ns/pod`` or ``ns/pod-a + ns/pod-b``."""
    slices: tuple[UnitSlice, ...]

    @property
    def memory_slices(self) -> int:
        return sum(s.size for s in self.slices)

    def request(self) -> PodRequest:
        """The unit as a pod request: its profiles, on one GPU when they share one now."""
        requests = tuple(
            DeviceRequest(name=f"slice-{i}", profiles=frozenset({s.profile}))
            for i, s in enumerate(self.slices)
        )
        on_one_gpu = len({(s.node, s.gpu_index) for s in self.slices}) == 1
        constraints = (same_gpu(),) if on_one_gpu and len(self.slices) > 1 else ()
        return PodRequest(requests=requests, constraints=constraints)


@dataclass(frozen=True, slots=True)
class Target:
    node: str
    gpu_index: int
    profile: str
    start: int
    size: int
    media: bool

    def assignment(self, request: str) -> DeviceAssignment:
        """The target as the engine's device assignment for ``request``."""
        return DeviceAssignment(
            request=request,
            node=self.node,
            gpu_index=self.gpu_index,
            profile=self.profile,
            start=self.start,
            size=self.size,
            media=self.media,
        )


@dataclass(frozen=True, slots=True)
class Move:
    unit: Unit
    to: tuple[DeviceAssignment, ...]
    """Where the unit's slices could go, in the order of ``unit.slices``."""


@dataclass(frozen=True, slots=True)
class DefragPlan:
    profile: str
    count: int
    targets: tuple[Target, ...]
    moves: tuple[Move, ...]
    proven_minimal: bool
    checked: int
    """Candidate plans checked."""
    search_steps: int = 0
    """Search steps spent finding it (see the module doc)."""


@dataclass(frozen=True, slots=True)
class NoPlan:
    reason: str
    budget_exhausted: bool = False
    """The search stopped at its budget: a plan may exist all the same."""
    search_steps: int = 0
    """Search steps spent (see the module doc)."""
    allowance_spent: bool = False
    """The search stopped because ``max_search_steps`` could not pay for its next step (then
    ``budget_exhausted`` too)."""


def _overlaps(a_start: int, a_size: int, b: UnitSlice) -> bool:
    return a_start < b.start + b.size and b.start < a_start + a_size


class _Search:
    def __init__(
        self,
        engine: Engine,
        units: Sequence[Unit],
        profile: str,
        count: int,
        *,
        budget: int,
        one_gpu: bool,
        max_search_steps: int | None,
    ) -> None:
        self.engine = engine
        self.budget = budget
        self.steps = 0
        self.max_search_steps = max_search_steps
        self.search_steps = 0
        """Search steps spent, both passes together (``steps`` and ``checked`` restart)."""
        self.units = tuple(units)
        self.profile = profile
        self.count = count
        self.one_gpu = one_gpu
        self.by_gpu: dict[tuple[str, int], list[int]] = {}
        for i, unit in enumerate(self.units):
            for s in unit.slices:
                gpu = self.by_gpu.setdefault((s.node, s.gpu_index), [])
                if i not in gpu:
                    gpu.append(i)
        self.checked = 0
        self._fitting: dict[tuple[str, ...], list[tuple[str, int]]] = {}

    def charge(self, steps: int) -> None:
        """Count ``steps`` search steps about to be spent; ``_OutOfAllowanceError`` (nothing
        counted) if ``max_search_steps`` cannot pay for them."""
        spent = self.search_steps + steps
        if self.max_search_steps is not None and spent > self.max_search_steps:
            raise _OutOfAllowanceError
        self.search_steps = spent

    def candidates(self) -> list[tuple[Target, frozenset[int]]]:
        """Every placement of the profile that moving units could free, with its blockers."""
        found: list[tuple[Target, frozenset[int]]] = []
        inventory = self.engine.inventory
        for node in inventory.nodes():
            for gpu in node.gpus:
                profile = gpu.table.profile_by_name.get(self.profile)
                if profile is None:
                    continue
                held = self.by_gpu.get((node.name, gpu.index), [])
                unit_slices = [
                    (i, s)
                    for i in held
                    for s in self.units[i].slices
                    if (s.node, s.gpu_index) == (node.name, gpu.index)
                ]
                fixed_mask = 0
                fixed_media = False
                for occupant in _fixed_occupants(
                    inventory.occupants(node.name, gpu.index), [s for _, s in unit_slices]
                ):
                    fixed_mask |= occupant.mask
                    fixed_media |= occupant.media or occupant.profile in gpu.table.media_names
                for placement in profile.placements:
                    if placement.mask & fixed_mask or (profile.media and fixed_media):
                        continue
                    blockers = frozenset(
                        i
                        for i, s in unit_slices
                        if _overlaps(placement.start, placement.size, s)
                        or (profile.media and (s.media or s.profile in gpu.table.media_names))
                    )
                    found.append(
                        (
                            Target(
                                node=node.name,
                                gpu_index=gpu.index,
                                profile=self.profile,
                                start=placement.start,
                                size=placement.size,
                                media=profile.media,
                            ),
                            blockers,
                        )
                    )
        found.sort(key=lambda c: (len(c[1]), self._moved_slices(c[1])))
        return found

    def _moved_slices(self, units: frozenset[int]) -> int:
        return sum(self.units[i].memory_slices for i in units)

    def target_sets(
        self, candidates: list[tuple[Target, frozenset[int]]], limit: int
    ) -> Iterator[tuple[tuple[Target, ...], frozenset[int]]]:
        """Sets of ``count`` distinct, non-overlapping targets whose blockers number ``<= limit``
        (all on one GPU when ``one_gpu``)."""
        one_gpu = self.one_gpu

        def walk(
            start: int, chosen: list[Target], blockers: frozenset[int]
        ) -> Iterator[tuple[tuple[Target, ...], frozenset[int]]]:
            if len(chosen) == self.count:
                yield tuple(chosen), blockers
                return
            for j in range(start, len(candidates)):
                self.steps += 1
                if self.steps > self.budget * WALK_STEPS_PER_PLAN:
                    raise _OutOfBudgetError
                self.charge(1)
                target, more = candidates[j]
                union = blockers | more
                if len(union) > limit:
                    continue
                if any(_clash(target, other) for other in chosen):
                    continue
                if one_gpu and chosen and not _same_gpu(target, chosen[0]):
                    continue
                chosen.append(target)
                yield from walk(j + 1, chosen, union)
                chosen.pop()

        yield from walk(0, [], frozenset())

    def reseat(self, moving: frozenset[int], targets: Sequence[Target]) -> tuple[Move, ...] | None:
        self.checked += 1
        if self.checked > self.budget:
            raise _OutOfBudgetError
        self.charge(WALK_STEPS_PER_PLAN)
        if self._left_without_room(moving, targets):
            return None
        return reseat(self.engine, [self.units[i] for i in sorted(moving)], targets)

    def _left_without_room(self, moving: frozenset[int], targets: Sequence[Target]) -> bool:
        """Whether some moving unit has no free placement at all once the ``moving`` units leave
        and the ``targets`` are taken: then ``reseat`` fails (placing the other units only takes
        more). Read from the GPUs' masks without changing the engine; plans that add a unit far
        from where the blockers could go (most of them, on a full fleet) end here, not in a
        release/commit/place round. It counts as a checked plan all the same, so the budget and
        the plan found are those of ``reseat`` alone."""
        inventory = self.engine.inventory
        changed: dict[tuple[str, int], tuple[int, bool]] = {}
        for i in moving:
            for s in self.units[i].slices:
                gpu = inventory.gpu(s.node, s.gpu_index)
                mask, media = changed.get((s.node, s.gpu_index), (gpu.mask, gpu.media_taken))
                if s.media or s.profile in gpu.table.media_names:
                    media = False  # a GPU's one +me engine: this slice held it
                changed[(s.node, s.gpu_index)] = (mask & ~(((1 << s.size) - 1) << s.start), media)
        for t in targets:
            gpu = inventory.gpu(t.node, t.gpu_index)
            mask, media = changed.get((t.node, t.gpu_index), (gpu.mask, gpu.media_taken))
            changed[(t.node, t.gpu_index)] = (
                mask | (((1 << t.size) - 1) << t.start),
                media or t.media,
            )
        for i in moving:
            profiles = tuple(s.profile for s in self.units[i].slices)
            if any(key not in changed for key in self._fitting_gpus(profiles)):
                continue
            if any(self._free_on(key, profiles, state) for key, state in changed.items()):
                continue
            return True
        return False

    def _fitting_gpus(self, profiles: tuple[str, ...]) -> list[tuple[str, int]]:
        """The GPUs where each of ``profiles`` has room now (the engine's capacities)."""
        found = self._fitting.get(profiles)
        if found is None:
            found = self._fitting[profiles] = []
            for node in self.engine.inventory.nodes():
                for gpu in node.gpus:
                    by_name = gpu.table.profile_by_name
                    if all(p in by_name and gpu.caps[by_name[p].index] > 0 for p in profiles):
                        found.append((node.name, gpu.index))
        return found

    def _free_on(
        self, key: tuple[str, int], profiles: tuple[str, ...], state: tuple[int, bool]
    ) -> bool:
        """Each of ``profiles`` has a free placement on the GPU with this (mask, +me taken)."""
        table = self.engine.inventory.gpu(*key).table
        for name in profiles:
            profile = table.profile_by_name.get(name)
            if profile is None or not table.free_starts(
                profile.index, mask=state[0], media_taken=state[1]
            ):
                return False
        return True


def reseat(
    engine: Engine, moving: Sequence[Unit], targets: Sequence[Target]
) -> tuple[Move, ...] | None:
    """Whether ``targets`` fit once the ``moving`` units leave, and those units then fit elsewhere
    (placed by the engine, largest first); their new places, or ``None``. This is what makes a plan
    valid. Leaves the engine as it found it."""
    for unit in moving:
        for s in unit.slices:
            engine.release(
                s.node, s.gpu_index, start=s.start, size=s.size, media=s.media, profile=s.profile
            )
    committed: list[Placed] = []
    try:
        target_placed = Placed(
            node="",
            assignments=tuple(t.assignment("target") for t in targets),
        )
        try:
            engine.commit(target_placed)
        except PlacementError:  # a target is still occupied: this plan is not valid
            return None
        committed.append(target_placed)
        moves: list[Move] = []
        for unit in sorted(moving, key=lambda u: (-u.memory_slices, u.key)):
            result = engine.place(unit.request())
            if isinstance(result, NoFit):
                return None
            engine.commit(result)
            committed.append(result)
            moves.append(Move(unit=unit, to=result.assignments))
        return tuple(sorted(moves, key=lambda m: m.unit.key))
    finally:
        for placed in reversed(committed):
            engine.release_placed(placed)
        for unit in moving:
            for s in unit.slices:
                engine.occupy(
                    s.node,
                    s.gpu_index,
                    start=s.start,
                    size=s.size,
                    media=s.media,
                    profile=s.profile,
                )


def _same_gpu(a: Target, b: Target) -> bool:
    return a.gpu_index == b.gpu_index and a.node == b.node


def _clash(a: Target, b: Target) -> bool:
    if not _same_gpu(a, b):
        return False
    return (a.start < b.start + b.size and b.start < a.start + a.size) or (a.media and b.media)


def _fixed_occupants(
    occupants: Sequence[Occupant], unit_slices: Sequence[UnitSlice]
) -> list[Occupant]:
    """The occupants of one GPU that no unit holds (one occupant per unit slice is taken off)."""
    remaining = list(occupants)
    for s in unit_slices:
        occupant = Occupant(start=s.start, size=s.size, media=s.media, profile=s.profile)
        if occupant in remaining:
            remaining.remove(occupant)
    return remaining


def plan_defrag(
    engine: Engine,
    units: Sequence[Unit],
    *,
    profile: str,
    count: int = 1,
    budget: int = DEFAULT_BUDGET,
    max_units: int | None = None,
    one_gpu: bool = False,
    max_search_steps: int | None = None,
) -> DefragPlan | NoPlan:
    """The fewest units to move so that ``count`` more ``profile`` slices fit; see the module doc.

    With ``max_units``, plans that move more units are never tried (nor returned); with
    ``one_gpu``, the ``count`` targets are all on one GPU; with ``max_search_steps``, the search
    spends at most that many search steps and ends where the next would pass it. The answer
    carries the search steps spent."""
    if count < 1:
        raise ConfigError(f"count must be at least 1, got {count}")
    if max_units is not None and max_units < 0:
        raise ConfigError(f"max_units must be at least 0, got {max_units}")
    if max_search_steps is not None and max_search_steps < 0:
        raise ConfigError(f"max_search_steps must be at least 0, got {max_search_steps}")
    if not engine.inventory.published_gpus(profile):
        known = ", ".join(engine.inventory.profile_names()) or "none"
        return NoPlan(reason=f"no node publishes MIG profile {profile} (published: {known})")
    search = _Search(
        engine,
        units,
        profile,
        count,
        budget=budget,
        one_gpu=one_gpu,
        max_search_steps=max_search_steps,
    )
    try:
        found = _search(search, max_units=max_units)
    except _OutOfAllowanceError:
        return NoPlan(
            reason=f"the search stopped at its allowance of {max_search_steps} search steps",
            budget_exhausted=True,
            search_steps=search.search_steps,
            allowance_spent=True,
        )
    return dataclasses.replace(found, search_steps=search.search_steps)


def _search(search: _Search, *, max_units: int | None) -> DefragPlan | NoPlan:
    """``plan_defrag``'s search (``_OutOfAllowanceError`` past ``max_search_steps``)."""
    profile, count, budget = search.profile, search.count, search.budget
    limit = len(search.units) if max_units is None else min(max_units, len(search.units))
    search.charge(GPU_READ_STEPS * search.engine.inventory.published_gpus(profile))
    candidates = search.candidates()
    if len(candidates) < count:
        return NoPlan(
            reason=f"only {len(candidates)} placements of {profile} can be freed by moving pods; "
            f"{count} asked"
        )
    try:
        return _smallest(search, candidates, limit=limit)
    except _OutOfBudgetError:
        pass
    # Out of budget: the first valid plan among target sets that move only their blockers.
    search.steps = search.checked = 0
    try:
        for targets, blockers in search.target_sets(candidates, limit):
            moves = search.reseat(blockers, targets)
            if moves is not None:
                return DefragPlan(
                    profile=profile,
                    count=count,
                    targets=targets,
                    moves=moves,
                    proven_minimal=False,
                    checked=search.checked,
                )
    except _OutOfBudgetError:
        pass
    return NoPlan(reason=f"no plan found within {budget} checked plans", budget_exhausted=True)


def _smallest(
    search: _Search, candidates: list[tuple[Target, frozenset[int]]], *, limit: int
) -> DefragPlan | NoPlan:
    """Plans in increasing size up to ``limit`` units; the first valid one (``_OutOfBudgetError``
    past the budget)."""
    for size in range(limit + 1):
        # Plans of one size: those that move only their targets' blockers first, then those that
        # also move other units (to make room for the blockers).
        for only_blockers in (True, False):
            for targets, blockers in search.target_sets(candidates, size):
                extra = size - len(blockers)
                if (extra == 0) != only_blockers:
                    continue
                if extra == 0:
                    additions: Iterable[tuple[int, ...]] = ((),)
                else:  # the other units, read only when some are added (O(units) each time)
                    rest = [i for i in range(len(search.units)) if i not in blockers]
                    additions = itertools.combinations(rest, extra)
                for added in additions:
                    moves = search.reseat(blockers | frozenset(added), targets)
                    if moves is not None:
                        return DefragPlan(
                            profile=search.profile,
                            count=search.count,
                            targets=targets,
                            moves=moves,
                            proven_minimal=True,
                            checked=search.checked,
                        )
    if limit < len(search.units):
        return NoPlan(
            reason=f"no set of at most {limit} pods can be moved so that {search.count} x "
            f"{search.profile} fit"
        )
    return NoPlan(
        reason=f"no set of pods can be moved so that {search.count} x {search.profile} fit "
        "(the pods that would have to leave cannot be placed anywhere else)"
    )
