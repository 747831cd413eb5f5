"""Victims of preemption: the smallest key of all minimal sets, as a brute force over every subset
on every GPU finds them with the placement engine itself."""

from __future__ import annotations

import itertools
import random

import pytest

from driver.placement import DeviceRequest, Engine, NoFit, Placed, PodRequest, same_gpu
from instaslice.planning.fleet import parse_fleet
from instaslice.planning.preemption import (
    GpuKey,
    Holder,
    RunningByGpu,
    VictimKey,
    choose_victims,
    victim_key,
)

PROFILES = ("1g.5gb", "1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "1g.5gb+me")
WANTED = (("7g.40gb", 1), ("4g.20gb", 1), ("3g.20gb", 1), ("2g.10gb", 2), ("1g.5gb+me", 1))


def _on(gpu: GpuKey, profile: str, count: int) -> PodRequest:
    return PodRequest(
        requests=(
            DeviceRequest(
                name="mig",
                profiles=frozenset({profile}),
                count=count,
                predicate=lambda ref: (ref.node, ref.gpu_index) == gpu,
            ),
        ),
        constraints=(same_gpu("mig"),) if count > 1 else (),
    )


def _filled(seed: int) -> tuple[Engine, RunningByGpu, list[Holder], list[GpuKey]]:
    """Two A100s on two nodes, filled with random slices of random priorities and starts."""
    fleet = parse_fleet("2x1xA100-40GB")
    engine = fleet.engine("firstfit")
    rng = random.Random(seed)
    running = RunningByGpu()
    holders = []
    gpus = [(node.name, gpu.index) for node in fleet.nodes for gpu in node.gpus]
    for sequence in range(40):
        gpu = rng.choice(gpus)
        placed = engine.place(_on(gpu, rng.choice(PROFILES), 1))
        if not isinstance(placed, Placed):
            continue
        engine.commit(placed)
        holder = Holder(
            sequence=sequence,
            priority=rng.choice((-(2**31), -3, 0, 0, 2, 5)),
            started=float(rng.randrange(4)),  # ties on purpose
            assignments=placed.assignments,
        )
        running.add(holder)
        holders.append(holder)
    return engine, running, holders, gpus


def _brute_force(
    engine: Engine, holders: list[Holder], gpus: list[GpuKey], key: tuple[str, int], priority: int
) -> list[tuple[VictimKey, int, frozenset[int]]]:
    """Every inclusion-minimal set of lower-priority requests on one GPU whose eviction lets the
    request fit there (asked of the engine: released, placed, committed back), with its key and
    the GPU's place in the fleet."""
    found = []
    for order, gpu in enumerate(gpus):
        lower = [h for h in holders if h.gpu == gpu and h.priority < priority]
        fitting: list[frozenset[int]] = []
        for size in range(1, len(lower) + 1):
            for victims in itertools.combinations(lower, size):
                sequences = frozenset(h.sequence for h in victims)
                if any(smaller <= sequences for smaller in fitting):
                    continue  # not minimal
                for h in victims:
                    engine.release_placed(Placed(node=gpu[0], assignments=h.assignments))
                fits = not isinstance(engine.place(_on(gpu, *key)), NoFit)
                for h in victims:
                    engine.commit(Placed(node=gpu[0], assignments=h.assignments))
                if fits:
                    fitting.append(sequences)
                    found.append((victim_key(victims), order, sequences))
    return sorted(found, key=lambda f: (f[0], f[1]))


@pytest.mark.parametrize("seed", range(12), ids=lambda s: f"seed-{s}")
def test_the_victims_are_the_best_minimal_set_a_brute_force_finds(seed: int) -> None:
    engine, running, holders, gpus = _filled(seed)
    for key in WANTED:
        for priority in (1, 3, 6):
            chosen = choose_victims(
                engine, running, profile=key[0], count=key[1], priority=priority, gpus=gpus
            )
            everything = _brute_force(engine, holders, gpus, key, priority)
            if not everything:
                assert chosen is None
                continue
            assert chosen is not None
            best_key, best_order, _ = everything[0]
            assert (chosen.key, gpus.index(chosen.gpu)) == (best_key, best_order)
            tied = [f[2] for f in everything if f[:2] == (best_key, best_order)]
            assert frozenset(chosen.sequences) in tied
            assert all(h.priority < priority for h in holders if h.sequence in chosen.sequences)


def test_a_set_always_ranks_after_the_sets_it_contains() -> None:
    # Priorities count 2**31 more each in the sum: two victims at the lowest priority rank after
    # one, so the first set that fits is minimal.
    low = Holder(sequence=1, priority=-(2**31), started=0.0, assignments=())
    other = Holder(sequence=2, priority=-(2**31), started=5.0, assignments=())
    assert victim_key([low]) < victim_key([low, other])
    assert victim_key([other]) < victim_key([low])  # later start: less work lost


def test_no_running_request_of_lower_priority_means_no_victims() -> None:
    engine, running, _, gpus = _filled(0)
    lowest = -(2**31)
    chosen = choose_victims(engine, running, profile="7g.40gb", count=1, priority=lowest, gpus=gpus)
    assert chosen is None
