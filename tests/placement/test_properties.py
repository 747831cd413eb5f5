"""Property tests: random inventories, occupancy and pods, checked against a brute-force model."""

from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from driver.mig.catalog import gpu_model
from driver.placement import (
    POLICIES,
    DeviceRef,
    DeviceRequest,
    DistinctAttribute,
    Engine,
    GpuSpec,
    Inventory,
    MatchAttribute,
    NodeSpec,
    NoFit,
    Occupant,
    Placed,
    PodRequest,
)
from tests.placement import reference

MODELS = (gpu_model("A100-40GB"), gpu_model("H100-80GB"), gpu_model("A30-24GB"))
PROFILE_NAMES = sorted({p.name for m in MODELS for p in m.profiles} | {"9g.99gb"})
NODE_NAMES = ("alpha", "bravo", "charlie", "delta")

SETTINGS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def even_start(ref: DeviceRef) -> bool:
    return ref.start % 2 == 0


def not_gpu_zero(ref: DeviceRef) -> bool:
    return ref.gpu_index != 0


def product(ref: DeviceRef) -> str:
    return ref.model.product_name


def start_key(ref: DeviceRef) -> int:
    return ref.start


@st.composite
def gpu_specs(draw: st.DrawFn, index: int) -> GpuSpec:
    model = draw(st.sampled_from(MODELS))
    published = None
    if draw(st.integers(0, 3)) == 0:
        devices = sorted((p.name, pl.start) for p in model.profiles for pl in p.placements)
        published = frozenset(draw(st.sets(st.sampled_from(devices), min_size=1)))
    return GpuSpec(index=index, model=model, uuid=f"GPU-{index}", published=published)


@st.composite
def occupants_for(draw: st.DrawFn, gpu: GpuSpec) -> list[Occupant]:
    """Instances made by anyone: real placements of the model, or arbitrary slice ranges."""
    model = gpu.model
    result = []
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            profile = draw(st.sampled_from(model.profiles))
            start = draw(st.sampled_from(profile.placements)).start
            named = draw(st.booleans())
            result.append(
                Occupant(
                    start=start,
                    size=profile.memory_slices,
                    media=profile.media_extensions,
                    profile=profile.name if named else None,
                )
            )
        else:
            start = draw(st.integers(0, model.memory_slices - 1))
            size = draw(st.integers(1, model.memory_slices - start))
            result.append(Occupant(start=start, size=size, media=draw(st.booleans())))
    return result


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[NodeSpec], dict[tuple[str, int], list[Occupant]]]:
    names = draw(st.lists(st.sampled_from(NODE_NAMES), min_size=1, max_size=3, unique=True))
    nodes = []
    occupancy: dict[tuple[str, int], list[Occupant]] = {}
    for name in names:
        indexes = draw(st.lists(st.integers(0, 3), min_size=1, max_size=2, unique=True))
        gpus = tuple(draw(gpu_specs(i)) for i in indexes)
        nodes.append(NodeSpec(name=name, gpus=gpus))
        for gpu in gpus:
            occupancy[(name, gpu.index)] = draw(occupants_for(gpu))
    return nodes, occupancy


@st.composite
def pods(draw: st.DrawFn) -> PodRequest:
    count = draw(st.integers(1, 3))
    budget = 3
    requests = []
    for i in range(count):
        devices = draw(st.integers(1, max(1, budget - (count - i - 1))))
        budget -= devices
        profiles = frozenset(draw(st.sets(st.sampled_from(PROFILE_NAMES), min_size=1, max_size=2)))
        predicate = draw(st.sampled_from([None, None, None, even_start, not_gpu_zero]))
        requests.append(
            DeviceRequest(name=f"r{i}", profiles=profiles, count=devices, predicate=predicate)
        )
    names = [r.name for r in requests]
    constraints: list[MatchAttribute | DistinctAttribute] = []
    for _ in range(draw(st.integers(0, 2))):
        members = frozenset(draw(st.sets(st.sampled_from(names), max_size=len(names))))
        kind = draw(st.sampled_from(["same", "distinct", "product", "start"]))
        if kind == "same":
            constraints.append(MatchAttribute(requests=members))
        elif kind == "distinct":
            constraints.append(DistinctAttribute(requests=members))
        elif kind == "product":
            constraints.append(MatchAttribute(requests=members, key=product))
        else:
            constraints.append(DistinctAttribute(requests=members, key=start_key))
    return PodRequest(requests=tuple(requests), constraints=tuple(constraints))


def build(
    policy: str,
    nodes: Sequence[NodeSpec],
    occupancy: dict[tuple[str, int], list[Occupant]],
) -> Engine:
    engine = Engine(policy=policy)
    # Occupancy first for some GPUs, inventory first for others: the order must not matter.
    for (node, gpu), occupants in occupancy.items():
        if gpu % 2:
            for o in occupants:
                engine.occupy(
                    node, gpu, start=o.start, size=o.size, media=o.media, profile=o.profile
                )
    for spec in nodes:
        engine.set_node(spec)
    for (node, gpu), occupants in occupancy.items():
        if not gpu % 2:
            for o in occupants:
                engine.occupy(
                    node, gpu, start=o.start, size=o.size, media=o.media, profile=o.profile
                )
    return engine


def node_occupants(
    occupancy: dict[tuple[str, int], list[Occupant]], node: str
) -> dict[int, Sequence[Occupant]]:
    return {gpu: occ for (name, gpu), occ in occupancy.items() if name == node}


def state_of(engine: Engine) -> tuple[object, ...]:
    inventory = engine.inventory
    gpus = tuple(
        (g.node.name, g.index, g.occupants[:], g.mask, g.media_taken, g.counts, g.caps, g.levels)
        for n in inventory.nodes()
        for g in n.gpus
    )
    free = tuple(inventory.free_instances(p) for p in PROFILE_NAMES)
    return gpus, free, inventory.index_snapshot()


@pytest.mark.parametrize("policy", sorted(POLICIES))
@SETTINGS
@given(cluster=clusters(), pod=pods(), filtered=st.sets(st.sampled_from(NODE_NAMES), max_size=1))
def test_placements_are_valid_and_no_fit_is_true(
    policy: str,
    cluster: tuple[list[NodeSpec], dict[tuple[str, int], list[Occupant]]],
    pod: PodRequest,
    filtered: set[str],
) -> None:
    nodes, occupancy = cluster
    engine = build(policy, nodes, occupancy)
    result = engine.place(pod, node_filter=lambda name: name not in filtered)
    by_name = {n.name: n for n in nodes}
    allowed = [n for n in sorted(by_name) if n not in filtered]
    if isinstance(result, Placed):
        assert result.node in allowed
        node = by_name[result.node]
        problems = reference.valid_placement(
            node, node_occupants(occupancy, node.name), pod, result.assignments
        )
        assert problems == []
        assert [a.request for a in result.assignments] == [
            r.name for r in pod.requests for _ in range(r.count)
        ]
    else:
        assert isinstance(result, NoFit)
        assert result.reason
        for name in allowed:
            assert not reference.fits(by_name[name], node_occupants(occupancy, name), pod), name
        if result.permanent:
            empty: dict[int, Sequence[Occupant]] = {}
            assert not any(reference.fits(n, empty, strip_predicates(pod)) for n in nodes), (
                result.reason
            )


def strip_predicates(pod: PodRequest) -> PodRequest:
    requests = tuple(
        DeviceRequest(name=r.name, profiles=r.profiles, count=r.count) for r in pod.requests
    )
    return PodRequest(requests=requests, constraints=pod.constraints)


@SETTINGS
@given(cluster=clusters(), pod=pods())
def test_firstfit_returns_the_first_fit_in_documented_order(
    cluster: tuple[list[NodeSpec], dict[tuple[str, int], list[Occupant]]], pod: PodRequest
) -> None:
    """Nodes by name, GPUs by index, profiles in model order, starts in NVML order: first wins."""
    nodes, occupancy = cluster
    engine = build("firstfit", nodes, occupancy)
    result = engine.place(pod)
    expected = None
    for node in sorted(nodes, key=lambda n: n.name):
        first = next(reference.all_fits(node, node_occupants(occupancy, node.name), pod), None)
        if first is not None:
            expected = (
                node.name,
                [(c.request, c.gpu.index, c.profile.name, c.start) for c in first],
            )
            break
    if expected is None:
        assert isinstance(result, NoFit)
    else:
        assert isinstance(result, Placed)
        got = [(a.request, a.gpu_index, a.profile, a.start) for a in result.assignments]
        assert (result.node, got) == expected


@pytest.mark.parametrize("policy", sorted(POLICIES))
@SETTINGS
@given(cluster=clusters(), pod=pods())
def test_commit_then_release_restores_the_state_exactly(
    policy: str,
    cluster: tuple[list[NodeSpec], dict[tuple[str, int], list[Occupant]]],
    pod: PodRequest,
) -> None:
    nodes, occupancy = cluster
    engine = build(policy, nodes, occupancy)
    engine.place(pod)  # indexes the pod's signatures, so the snapshot covers them
    before = state_of(engine)
    result = engine.place(pod)
    if isinstance(result, Placed):
        engine.commit(result)
        assert state_of(engine) != before
        engine.release_placed(result)
    assert state_of(engine) == before


@pytest.mark.parametrize("policy", sorted(POLICIES))
@SETTINGS
@given(cluster=clusters(), pods_=st.lists(pods(), min_size=1, max_size=5), data=st.data())
def test_incremental_indexes_equal_a_fresh_build(
    policy: str,
    cluster: tuple[list[NodeSpec], dict[tuple[str, int], list[Occupant]]],
    pods_: list[PodRequest],
    data: st.DataObject,
) -> None:
    """After any history of places, commits, releases and node changes, the rank-set indexes are
    exactly what building the same final state from scratch gives."""
    nodes, occupancy = cluster
    engine = build(policy, nodes, occupancy)
    committed: list[Placed] = []
    for pod in pods_:
        result = engine.place(pod)
        if isinstance(result, Placed):
            engine.commit(result)
            committed.append(result)
        release = data.draw(st.booleans())
        if committed and release:
            engine.release_placed(committed.pop(data.draw(st.integers(0, len(committed) - 1))))
        if data.draw(st.integers(0, 3)) == 0:
            spec = data.draw(st.sampled_from(nodes))
            engine.remove_node(spec.name)
            engine.place(pod)
            engine.set_node(spec)
    fresh = Inventory(track_levels=engine.inventory.track_levels)
    for spec in nodes:
        fresh.set_node(spec)
    for spec in nodes:
        for gpu in spec.gpus:
            for o in engine.inventory.occupants(spec.name, gpu.index):
                fresh.occupy(
                    spec.name,
                    gpu.index,
                    start=o.start,
                    size=o.size,
                    media=o.media,
                    profile=o.profile,
                )
    incremental = engine.inventory.index_snapshot()
    for signature in incremental:
        fresh.index(signature)
    assert fresh.index_snapshot() == incremental
