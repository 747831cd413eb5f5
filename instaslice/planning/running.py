"""The requests a replay has running, and moving them to admit a rejected one.

``replay`` keeps each accepted request's *current* placement here, by the sequence number it was
placed with: with defragmentation on rejection a running request may move (in a cluster: its pod is
evicted and restarts on other slices), and what is released at its departure must be where it is
then, not where it started. The same records give ``plan_defrag`` its units (one per running
request) and the occupancy check the tests run after every step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from driver.placement import Engine, Placed
from instaslice.planning.defrag import DefragPlan, Unit, UnitSlice

Slot = tuple[str, int, int, int, bool, str | None]
"""One slice as (node, GPU index, start, size, +me, profile)."""


class RunningRequests:
    """Accepted requests not yet departed: sequence number → (current placement, memory slices)."""

    def __init__(self) -> None:
        self.placed: dict[int, tuple[Placed, int]] = {}
        self._units: dict[int, Unit] = {}

    def add(self, sequence: int, placed: Placed, slices: int) -> None:
        self.placed[sequence] = (placed, slices)

    def pop(self, sequence: int) -> tuple[Placed, int]:
        """The request's placement now and its memory slices, forgotten (it departs)."""
        self._units.pop(sequence, None)
        return self.placed.pop(sequence)

    def units(self) -> list[Unit]:
        """Every running request as a unit ``plan_defrag`` may move, keyed by its sequence number.

        Units are kept between rejections (a request's unit changes only when it moves)."""
        units = self._units
        found = []
        for sequence, (placed, _) in self.placed.items():
            unit = units.get(sequence)
            if unit is None:
                unit = units[sequence] = Unit(
                    key=str(sequence),
                    slices=tuple(
                        UnitSlice(
                            node=a.node,
                            gpu_index=a.gpu_index,
                            profile=a.profile,
                            start=a.start,
                            size=a.size,
                            media=a.media,
                        )
                        for a in placed.assignments
                    ),
                )
            found.append(unit)
        return found

    def apply(self, engine: Engine, plan: DefragPlan) -> tuple[Placed, int]:
        """Carry ``plan`` out on ``engine``: the moved requests leave their slices, the plan's
        targets are committed, then each moved request is committed where the plan put it (the
        order ``reseat`` validated the plan in). Returns the targets as one placement (not yet a
        running request: the caller admits it) and the change in memory slices of the moved
        requests (a request can move to a GPU model where its profile takes fewer slices)."""
        moved = [(int(move.unit.key), move.to) for move in plan.moves]
        for sequence, _ in moved:
            engine.release_placed(self.placed[sequence][0])
        targets = Placed(
            node=plan.targets[0].node,
            assignments=tuple(t.assignment("mig") for t in plan.targets),
        )
        engine.commit(targets)
        delta = 0
        for sequence, to in moved:
            placed = Placed(node=to[0].node, assignments=to)
            engine.commit(placed)
            slices = sum(a.size for a in to)
            delta += slices - self.placed[sequence][1]
            self.placed[sequence] = (placed, slices)
            self._units.pop(sequence, None)
        return targets, delta

    def could_make_room(
        self, engine: Engine, need: Sequence[tuple[str, int]], mobile: frozenset[str]
    ) -> bool:
        """Whether moving running requests could possibly make room for ``need`` (per GPU model
        offering the profile: the memory slices it takes there).

        A plan keeps every moved request on the fleet, so on the model that receives the request,
        the free memory slices plus those of requests that could leave for another model (their
        profile is in ``mobile``: offered by several models) must cover it. Placement rules aside;
        when this fails no plan exists, and ``plan_defrag`` is not asked (on a full fleet it would
        exhaust its budget to find out)."""
        inventory = engine.inventory
        free: dict[str, int] = {}
        for node in inventory.nodes():
            for gpu in node.gpus:
                model = gpu.spec.model.name
                free[model] = free.get(model, 0) + gpu.table.slices - gpu.used
        if mobile:
            for placed, slices in self.placed.values():
                first = placed.assignments[0]
                if first.profile in mobile:
                    model = inventory.gpu(first.node, first.gpu_index).spec.model.name
                    free[model] = free.get(model, 0) + slices
        return any(free.get(model, 0) >= slices for model, slices in need)


def check_running(engine: Engine, running: RunningRequests, *, when: str) -> None:
    """``AssertionError`` naming the differences unless the engine holds exactly the running
    requests' slices, each request's on one GPU (for tests: it reads every GPU)."""
    problems = occupancy_problems(engine, (placed for placed, _ in running.placed.values()))
    # Every request is one pod whose slices share a GPU, wherever it was placed or moved.
    problems += [
        f"request {sequence} is spread over GPUs: {placed.assignments}"
        for sequence, (placed, _) in running.placed.items()
        if len({(a.node, a.gpu_index) for a in placed.assignments}) > 1
    ]
    if problems:
        raise AssertionError(f"replay occupancy {when}: " + "; ".join(problems[:10]))


def occupancy_problems(engine: Engine, placements: Iterable[Placed]) -> list[str]:
    """How the engine's occupancy differs from ``placements``; empty when they agree.

    Every slice of every placement must be occupied exactly once, no two may overlap (nor two
    ``+me`` slices share a GPU), and the engine must hold nothing else. Meant for tests: it reads
    every GPU of the fleet."""
    problems: list[str] = []
    expected: Counter[Slot] = Counter()
    masks: dict[tuple[str, int], tuple[int, bool]] = {}
    for placed in placements:
        for a in placed.assignments:
            expected[(a.node, a.gpu_index, a.start, a.size, a.media, a.profile)] += 1
            mask, media = masks.get((a.node, a.gpu_index), (0, False))
            new = ((1 << a.size) - 1) << a.start
            if mask & new or (media and a.media):
                problems.append(
                    f"{a.profile} at {a.node} GPU {a.gpu_index} start {a.start} overlaps"
                )
            masks[(a.node, a.gpu_index)] = (mask | new, media or a.media)
    actual: Counter[Slot] = Counter()
    inventory = engine.inventory
    for node in inventory.nodes():
        for gpu in node.gpus:
            for o in inventory.occupants(node.name, gpu.index):
                actual[(node.name, gpu.index, o.start, o.size, o.media, o.profile)] += 1
            mask, _ = masks.pop((node.name, gpu.index), (0, False))
            if gpu.mask != mask:
                problems.append(
                    f"{node.name} GPU {gpu.index}: engine mask {gpu.mask:#b}, placements {mask:#b}"
                )
    problems += [f"placed on a GPU the engine lacks: {key}" for key in masks]
    problems += [f"not in the engine: {slot}" for slot in (expected - actual).elements()]
    problems += [f"in the engine, no request's: {slot}" for slot in (actual - expected).elements()]
    return problems
