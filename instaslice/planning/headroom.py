"""How much more fits in a cluster now: per profile, and for a mixed batch of requests.

``free_by_profile`` is exact: GPUs are independent for one profile, and the placement engine keeps,
per GPU, how many more instances of each profile alone could be created. ``fit_batch`` places a
batch of single-slice pods with the engine itself — largest profiles first, each committed before
the next — and undoes everything afterwards; "fits" means the engine found a placement for every
one of them (a witness), "does not fit" that its policy did not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from driver.errors import ConfigError
from driver.placement import Engine, Placed, PodRequest


@dataclass(frozen=True, slots=True)
class ProfileHeadroom:
    profile: str
    free: int
    """Instances of this profile alone that could still be created."""
    gpus: int
    """GPUs that publish it."""


@dataclass(frozen=True, slots=True)
class BatchResult:
    wanted: tuple[tuple[str, int], ...]
    placed: tuple[tuple[str, int], ...]
    """Per profile, how many of the batch the engine placed (in ``wanted``'s order)."""
    placements: tuple[Placed, ...]

    @property
    def fits(self) -> bool:
        return self.wanted == self.placed


def free_by_profile(engine: Engine) -> tuple[ProfileHeadroom, ...]:
    inventory = engine.inventory
    return tuple(
        ProfileHeadroom(
            profile=name, free=inventory.free_instances(name), gpus=inventory.published_gpus(name)
        )
        for name in inventory.profile_names()
    )


def parse_batch(text: str) -> tuple[tuple[str, int], ...]:
    """``3g.20gb=4,1g.5gb=10`` → ((profile, count), …); ``ConfigError`` naming a bad entry."""
    wanted: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, count_text = part.partition("=")
        name = name.strip()
        if not sep:
            name, count_text = part, "1"
        try:
            count = int(count_text)
        except ValueError:
            count = 0
        if not name or count < 1:
            raise ConfigError(f"batch entry {part!r} is not PROFILE=COUNT with COUNT >= 1")
        wanted[name] = wanted.get(name, 0) + count
    if not wanted:
        raise ConfigError("the batch is empty; give PROFILE=COUNT pairs (e.g. 3g.20gb=4)")
    return tuple(wanted.items())


def fit_batch(engine: Engine, wanted: Sequence[tuple[str, int]]) -> BatchResult:
    """Place ``wanted`` single-slice pods, largest first; the engine is left as it was."""
    inventory = engine.inventory
    unknown = [name for name, _ in wanted if not inventory.published_gpus(name)]
    if unknown:
        raise ConfigError(
            f"no node publishes MIG profile(s) {', '.join(unknown)} "
            f"(published: {', '.join(inventory.profile_names()) or 'none'})"
        )
    order = sorted(wanted, key=lambda item: -inventory.profile_slices(item[0])[1])
    placed_count: dict[str, int] = {}
    committed: list[Placed] = []
    try:
        for name, count in order:
            request = PodRequest.single(name)
            for _ in range(count):
                result = engine.place(request)
                if not isinstance(result, Placed):
                    break
                engine.commit(result)
                committed.append(result)
                placed_count[name] = placed_count.get(name, 0) + 1
    finally:
        for placed in reversed(committed):
            engine.release_placed(placed)
    return BatchResult(
        wanted=tuple(wanted),
        placed=tuple((name, placed_count.get(name, 0)) for name, _ in wanted),
        placements=tuple(committed),
    )
