"""Defragmentation plans: valid, and never larger than a brute-force search finds."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from driver.errors import ConfigError
from driver.mig.catalog import gpu_model
from driver.placement import Engine, NodeSpec, Placed, PodRequest
from instaslice.planning.defrag import (
    DefragPlan,
    NoPlan,
    Target,
    Unit,
    UnitSlice,
    plan_defrag,
    reseat,
)
from instaslice.planning.fleet import parse_fleet

A100 = gpu_model("A100-40GB")
SMALL = ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "1g.5gb+me")


def _engine(nodes: tuple[NodeSpec, ...]) -> Engine:
    engine = Engine(policy="firstfit")
    for node in nodes:
        engine.set_node(node)
    return engine


def _hold(engine: Engine, key: str, node: str, gpu: int, profile: str, start: int) -> Unit:
    placement = A100.profile(profile).placement_at(start)
    media = profile.endswith("+me")
    engine.occupy(node, gpu, start=start, size=placement.size, media=media, profile=profile)
    return Unit(
        key=key,
        slices=(UnitSlice(node=node, gpu_index=gpu, profile=profile, start=start,
                          size=placement.size, media=media),),
    )  # fmt: skip


def _all_targets(engine: Engine, profile: str) -> list[Target]:
    targets = []
    for node in engine.inventory.nodes():
        for gpu in node.gpus:
            table_profile = gpu.table.profile_by_name.get(profile)
            if table_profile is None:
                continue
            for p in table_profile.placements:
                targets.append(
                    Target(node=node.name, gpu_index=gpu.index, profile=profile, start=p.start,
                           size=p.size, media=table_profile.media)
                )  # fmt: skip
    return targets


def _brute_force(engine: Engine, units: list[Unit], profile: str, count: int) -> int | None:
    """The size of the smallest valid plan, trying every set of units and every set of targets."""
    targets = _all_targets(engine, profile)
    for size in range(len(units) + 1):
        for moving in itertools.combinations(units, size):
            for chosen in itertools.combinations(targets, count):
                if reseat(engine, moving, chosen) is not None:
                    return size
    return None


def _occupancy(engine: Engine) -> list[tuple[str, int, tuple[object, ...]]]:
    return [
        (
            node.name,
            gpu.index,
            tuple(sorted(map(repr, engine.inventory.occupants(node.name, gpu.index)))),
        )
        for node in engine.inventory.nodes()
        for gpu in node.gpus
    ]


def test_moving_two_small_slices_frees_a_whole_gpu() -> None:
    engine = _engine(parse_fleet("2x1xA100-40GB").nodes)
    units = [
        _hold(engine, "ns/a", "node-0000", 0, "1g.5gb", 0),
        _hold(engine, "ns/b", "node-0000", 0, "1g.5gb", 6),
        _hold(engine, "ns/c", "node-0001", 0, "3g.20gb", 0),
        _hold(engine, "ns/d", "node-0001", 0, "1g.5gb", 4),
    ]
    before = _occupancy(engine)
    plan = plan_defrag(engine, units, profile="7g.40gb")
    assert isinstance(plan, DefragPlan)
    assert plan.proven_minimal
    assert [m.unit.key for m in plan.moves] == ["ns/a", "ns/b"]
    assert plan.targets == (Target("node-0000", 0, "7g.40gb", 0, 8, False),)
    assert {(a.node, a.gpu_index) for m in plan.moves for a in m.to} == {("node-0001", 0)}
    assert _occupancy(engine) == before


def test_fixed_slices_are_never_counted_as_movable() -> None:
    engine = _engine(parse_fleet("2x1xA100-40GB").nodes)
    engine.occupy("node-0000", 0, start=6, size=1, profile="1g.5gb")  # nobody's pod: stays
    units = [_hold(engine, "ns/a", "node-0001", 0, "1g.5gb", 0)]
    plan = plan_defrag(engine, units, profile="7g.40gb")
    assert isinstance(plan, DefragPlan)
    assert plan.targets[0].node == "node-0001"
    assert [a.node for a in plan.moves[0].to] == ["node-0000"]


def test_no_plan_when_the_moved_pods_have_nowhere_to_go() -> None:
    engine = _engine(parse_fleet("1x1xA100-40GB").nodes)
    units = [_hold(engine, "ns/a", "node-0000", 0, "1g.5gb", 0)]
    assert isinstance(plan_defrag(engine, units, profile="7g.40gb"), NoPlan)
    unpublished = plan_defrag(engine, units, profile="7g.80gb")
    assert isinstance(unpublished, NoPlan)
    assert "no node publishes MIG profile 7g.80gb" in unpublished.reason
    with pytest.raises(ConfigError):
        plan_defrag(engine, units, profile="1g.5gb", count=0)


def test_a_unit_on_one_gpu_moves_to_one_gpu() -> None:
    engine = _engine(parse_fleet("2x1xA100-40GB").nodes)
    pair = PodRequest.single("1g.5gb", count=2, one_gpu=True)
    placed = engine.place(pair)
    assert isinstance(placed, Placed)
    engine.commit(placed)
    engine.occupy("node-0001", 0, start=0, size=4, profile="3g.20gb")  # stays
    unit = Unit(
        key="ns/pair",
        slices=tuple(UnitSlice(node=a.node, gpu_index=a.gpu_index, profile=a.profile,
                               start=a.start, size=a.size, media=a.media)
                     for a in placed.assignments),
    )  # fmt: skip
    plan = plan_defrag(engine, [unit], profile="7g.40gb")
    assert isinstance(plan, DefragPlan)
    assert {(a.node, a.gpu_index) for a in plan.moves[0].to} == {("node-0001", 0)}


@st.composite
def _clusters(draw: st.DrawFn) -> tuple[Engine, list[Unit], str, int]:
    nodes = draw(st.integers(1, 2))
    gpus = draw(st.integers(1, 2))
    engine = _engine(parse_fleet(f"{nodes}x{gpus}xA100-40GB").nodes)
    units: list[Unit] = []
    for i in range(draw(st.integers(0, 5))):
        profile = draw(st.sampled_from(SMALL))
        result = engine.place(PodRequest.single(profile))
        if not isinstance(result, Placed):
            continue
        a = result.assignments[0]
        engine.commit(result)
        slot = UnitSlice(node=a.node, gpu_index=a.gpu_index, profile=a.profile, start=a.start,
                         size=a.size, media=a.media)  # fmt: skip
        if draw(st.booleans()) or i == 0:
            units.append(Unit(key=f"ns/pod-{i}", slices=(slot,)))
        # else: a slice no pod holds, which must stay where it is
    target = draw(st.sampled_from(("7g.40gb", "4g.20gb", "3g.20gb", "2g.10gb", "1g.5gb+me")))
    count = draw(st.integers(1, 2))
    return engine, units, target, count


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_clusters())
def test_the_plan_is_valid_and_never_larger_than_brute_force(
    cluster: tuple[Engine, list[Unit], str, int],
) -> None:
    engine, units, profile, count = cluster
    before = _occupancy(engine)
    plan = plan_defrag(engine, units, profile=profile, count=count)
    assert _occupancy(engine) == before
    best = _brute_force(engine, units, profile, count)
    if best is None:
        assert isinstance(plan, NoPlan)
        return
    assert isinstance(plan, DefragPlan)
    assert plan.proven_minimal
    assert len(plan.moves) <= best
    moving = [m.unit for m in plan.moves]
    assert reseat(engine, moving, plan.targets) is not None
    assert _occupancy(engine) == before
