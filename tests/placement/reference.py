"""An independent, deliberately naive model of the MIG rules, for checking the engine.

Written straight from the rules (docs/design.md F18), sharing nothing with the
engine but the catalog's geometry: brute-force enumeration of every assignment on a node, and a
validator for any returned placement.
"""

from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass

from driver.mig.model import MigProfile
from driver.placement import (
    DeviceAssignment,
    DeviceRef,
    DistinctAttribute,
    GpuSpec,
    MatchAttribute,
    NodeSpec,
    Occupant,
    PodRequest,
)


@dataclass(frozen=True)
class Choice:
    request: str
    gpu: GpuSpec
    profile: MigProfile
    start: int

    @property
    def mask(self) -> int:
        return ((1 << self.profile.memory_slices) - 1) << self.start


def occupied_mask(occupants: Sequence[Occupant]) -> int:
    mask = 0
    for o in occupants:
        mask |= ((1 << o.size) - 1) << o.start
    return mask


def media_taken(gpu: GpuSpec, occupants: Sequence[Occupant]) -> bool:
    media_names = {p.name for p in gpu.model.profiles if p.media_extensions}
    return any(o.media or o.profile in media_names for o in occupants)


def _published(gpu: GpuSpec, profile: MigProfile, start: int) -> bool:
    return gpu.published is None or (profile.name, start) in gpu.published


def _ref(node: str, choice: Choice) -> DeviceRef:
    return DeviceRef(
        node=node,
        gpu_index=choice.gpu.index,
        gpu_uuid=choice.gpu.uuid,
        model=choice.gpu.model,
        profile=choice.profile,
        start=choice.start,
    )


def _members(pod: PodRequest, names: frozenset[str]) -> set[str]:
    return set(names) if names else {r.name for r in pod.requests}


def constraints_hold(pod: PodRequest, node: str, choices: Sequence[Choice]) -> bool:
    for constraint in pod.constraints:
        members = _members(pod, constraint.requests)
        chosen = [c for c in choices if c.request in members]
        values: list[Hashable]
        if constraint.key is None:
            values = [c.gpu.index for c in chosen]
        else:
            values = [constraint.key(_ref(node, c)) for c in chosen]
        if isinstance(constraint, MatchAttribute) and len(set(values)) > 1:
            return False
        if isinstance(constraint, DistinctAttribute) and len(set(values)) != len(values):
            return False
    return True


def rules_hold(
    node: NodeSpec,
    occupants: dict[int, Sequence[Occupant]],
    choices: Sequence[Choice],
) -> bool:
    """Overlap, one ``+me`` per GPU, max_count, allowed and published starts."""
    for gpu in node.gpus:
        mine = [c for c in choices if c.gpu.index == gpu.index]
        existing = occupants.get(gpu.index, ())
        mask = occupied_mask(existing)
        media = media_taken(gpu, existing)
        counts: dict[str, int] = {}
        for o in existing:
            if o.profile is not None:
                counts[o.profile] = counts.get(o.profile, 0) + 1
        for c in mine:
            if c.start not in {p.start for p in c.profile.placements}:
                return False
            if not _published(gpu, c.profile, c.start):
                return False
            if mask & c.mask:
                return False
            mask |= c.mask
            if c.profile.media_extensions:
                if media:
                    return False
                media = True
            counts[c.profile.name] = counts.get(c.profile.name, 0) + 1
            if counts[c.profile.name] > c.profile.max_count:
                return False
    return True


def _device_names(pod: PodRequest) -> list[str]:
    return [r.name for r in pod.requests for _ in range(r.count)]


def _options(node: NodeSpec, pod: PodRequest, request_name: str) -> list[Choice]:
    request = next(r for r in pod.requests if r.name == request_name)
    options = []
    for gpu in sorted(node.gpus, key=lambda g: g.index):
        for profile in gpu.model.profiles:
            if profile.name not in request.profiles:
                continue
            for placement in profile.placements:
                choice = Choice(request_name, gpu, profile, placement.start)
                if not _published(gpu, profile, placement.start):
                    continue
                if request.predicate is not None and not request.predicate(_ref(node.name, choice)):
                    continue
                options.append(choice)
    return options


def all_fits(
    node: NodeSpec, occupants: dict[int, Sequence[Occupant]], pod: PodRequest
) -> Iterator[list[Choice]]:
    """Every valid assignment of the pod's devices on ``node`` (lexicographic over options)."""
    devices = _device_names(pod)
    options = {name: _options(node, pod, name) for name in set(devices)}

    def extend(prefix: list[Choice]) -> Iterator[list[Choice]]:
        if not rules_hold(node, occupants, prefix):
            return
        if len(prefix) == len(devices):
            if constraints_hold(pod, node.name, prefix):
                yield list(prefix)
            return
        for choice in options[devices[len(prefix)]]:
            prefix.append(choice)
            yield from extend(prefix)
            prefix.pop()

    return extend([])


def fits(node: NodeSpec, occupants: dict[int, Sequence[Occupant]], pod: PodRequest) -> bool:
    return next(all_fits(node, occupants, pod), None) is not None


def to_choices(node: NodeSpec, assignments: Sequence[DeviceAssignment]) -> list[Choice]:
    gpus = {g.index: g for g in node.gpus}
    choices = []
    for a in assignments:
        gpu = gpus[a.gpu_index]
        profile = gpu.model.profile(a.profile)
        assert profile.memory_slices == a.size
        assert profile.media_extensions == a.media
        choices.append(Choice(a.request, gpu, profile, a.start))
    return choices


def valid_placement(
    node: NodeSpec,
    occupants: dict[int, Sequence[Occupant]],
    pod: PodRequest,
    assignments: Sequence[DeviceAssignment],
) -> list[str]:
    """Everything wrong with ``assignments`` (empty when valid)."""
    problems = []
    if any(a.node != node.name for a in assignments):
        problems.append("not all on one node")
    if sorted(a.request for a in assignments) != sorted(_device_names(pod)):
        problems.append("wrong device counts")
    choices = to_choices(node, assignments)
    for c in choices:
        request = next(r for r in pod.requests if r.name == c.request)
        if c.profile.name not in request.profiles:
            problems.append(f"{c.profile.name} not acceptable for {c.request}")
        if request.predicate is not None and not request.predicate(_ref(node.name, c)):
            problems.append("predicate violated")
    if not rules_hold(node, occupants, choices):
        problems.append("MIG rules violated")
    if not constraints_hold(pod, node.name, choices):
        problems.append("constraints violated")
    return problems
