"""The engine's API as the controller uses it: inventory and occupancy feeds, constraints,
predicates, node filters, commit/release, reasons, metrics."""

import random
from collections.abc import Sequence

import pytest

from driver.errors import ConfigError, NotFoundError, PlacementError
from driver.mig.catalog import gpu_model
from driver.placement import (
    DeviceRef,
    DeviceRequest,
    DistinctAttribute,
    Engine,
    GpuSpec,
    MatchAttribute,
    NodeSpec,
    NoFit,
    Occupant,
    Placed,
    PodRequest,
    distinct_gpu,
    policy_named,
    same_gpu,
)
from driver.placement import groups as groups_module
from tests.placement import reference

A100 = gpu_model("A100-40GB")


def node(name: str, *models: str, published: frozenset[tuple[str, int]] | None = None) -> NodeSpec:
    return NodeSpec(
        name=name,
        gpus=tuple(
            GpuSpec(index=i, model=gpu_model(m), uuid=f"GPU-{name}-{i}", published=published)
            for i, m in enumerate(models)
        ),
    )


def engine_with(*nodes: NodeSpec, policy: str = "firstfit") -> Engine:
    engine = Engine(policy=policy)
    for spec in nodes:
        engine.set_node(spec)
    return engine


def fill(engine: Engine, node_name: str, gpu: int, *placements: tuple[int, int]) -> None:
    for start, size in placements:
        engine.occupy(node_name, gpu, start=start, size=size)


def placed(result: object) -> Placed:
    assert isinstance(result, Placed), result
    return result


def where(result: object) -> list[tuple[str, str, int, int]]:
    return [(a.node, a.request, a.gpu_index, a.start) for a in placed(result).assignments]


# ------------------------------------------------------------------------------ reasons


def _no_nodes() -> Engine:
    return Engine()


def _full_a100_cluster() -> Engine:
    engine = engine_with(node("a", "A100-40GB"), node("b", "A100-40GB"))
    fill(engine, "a", 0, (0, 1), (4, 4))
    fill(engine, "b", 0, (0, 1), (4, 4))
    return engine


def _one_free_1g_per_gpu() -> Engine:
    engine = engine_with(node("a", "A100-40GB", "A100-40GB"))
    for gpu in (0, 1):
        fill(engine, "a", gpu, (0, 6))
    return engine


def _four_nodes() -> Engine:
    return engine_with(*(node(n, "A100-40GB") for n in "abcd"))


def _one_free_1g_per_node() -> Engine:
    engine = engine_with(node("a", "A100-40GB"), node("b", "A100-40GB"))
    for n in "ab":
        fill(engine, n, 0, (0, 6))
    return engine


def _each_node_lacks_one_request() -> Engine:
    """Both nodes could hold 3g@4 + 1g@0 when empty; now a has only the 3g, b only the 1g."""
    published = frozenset({("3g.20gb", 4), ("1g.5gb", 0)})
    engine = engine_with(
        node("a", "A100-40GB", published=published), node("b", "A100-40GB", published=published)
    )
    fill(engine, "a", 0, (0, 1))
    fill(engine, "b", 0, (4, 4))
    return engine


def _never(ref: DeviceRef) -> bool:
    return False


REASONS = [
    ("no-nodes", _no_nodes, PodRequest.single("1g.5gb"), True,
     "the placement inventory has no nodes with MIG GPUs"),
    ("unpublished-profile", _four_nodes, PodRequest.single("3g.40gb"), True,
     "no node publishes MIG profile 3g.40gb"),
    ("unpublished-profiles", _four_nodes,
     PodRequest(requests=(DeviceRequest(name="mig", profiles=frozenset({"9g.99gb", "3g.40gb"})),)),
     True, "no node publishes any of the MIG profiles 3g.40gb, 9g.99gb"),
    ("no-acceptable-profile", _four_nodes,
     PodRequest(requests=(DeviceRequest(name="mig", profiles=frozenset()),)), True,
     "request 'mig' accepts no MIG profile"),
    ("more-slices-than-any-gpu", _four_nodes, PodRequest.single("7g.40gb", count=2, one_gpu=True),
     True, "request 'mig' needs 16 memory slices on one GPU; the largest GPU in the cluster has 8"),
    ("more-than-max-count", _four_nodes, PodRequest.single("1g.5gb", count=8, one_gpu=True), True,
     "no GPU model in the cluster can hold 8 x 1g.5gb on one GPU"),
    ("two-me-on-one-gpu", _four_nodes, PodRequest.single("1g.5gb+me", count=2, one_gpu=True), True,
     "no GPU model in the cluster can hold 2 x 1g.5gb+me on one GPU"),
    ("more-distinct-gpus-than-a-node-has", _four_nodes,
     PodRequest(requests=(DeviceRequest(name="mig", profiles=frozenset({"1g.5gb"}), count=2),),
                constraints=(distinct_gpu(),)),
     True, "the pod needs 2 devices on distinct GPUs of one node; the largest node has 1 GPUs"),
    ("never-together-on-one-node", _four_nodes,
     PodRequest(requests=(DeviceRequest(name="big", profiles=frozenset({"7g.40gb"})),
                          DeviceRequest(name="small", profiles=frozenset({"1g.5gb"})))),
     True, "no node can hold all devices of this pod even with all its GPUs free"),
    ("no-free-placement", _full_a100_cluster, PodRequest.single("3g.20gb"), False,
     "no node has a free 3g.20gb placement"),
    ("no-free-placement-of-any", _full_a100_cluster,
     PodRequest(requests=(DeviceRequest(name="mig", profiles=frozenset({"3g.20gb", "4g.20gb"})),)),
     False, "no node has a free placement of any of 3g.20gb, 4g.20gb"),
    ("no-gpu-with-room-for-both", _one_free_1g_per_gpu,
     PodRequest.single("1g.5gb", count=2, one_gpu=True), False,
     "no GPU has room for 2 x 1g.5gb"),
    ("no-gpu-with-room-for-the-mix", _one_free_1g_per_gpu,
     PodRequest(requests=(DeviceRequest(name="a", profiles=frozenset({"1g.5gb"})),
                          DeviceRequest(name="b", profiles=frozenset({"2g.10gb"}))),
                constraints=(same_gpu(),)),
     False, "no GPU has room for 1g.5gb + 2g.10gb"),
    ("all-excluded-by-the-node-filter", _four_nodes, PodRequest.single("1g.5gb"), False,
     "no node fits the pod: 4 nodes excluded by the node filter"),
    ("filter-and-no-room", _one_free_1g_per_node,
     PodRequest.single("1g.5gb", count=2), False,
     "no node fits the pod: 1 node excluded by the node filter; "
     "1 node with free slices had no room for all 2 devices together"),
    ("requests-on-different-nodes", _each_node_lacks_one_request,
     PodRequest(requests=(DeviceRequest(name="r0", profiles=frozenset({"3g.20gb"})),
                          DeviceRequest(name="r1", profiles=frozenset({"1g.5gb"})))),
     False, "no node has free placements for all of the pod's requests (r0, r1) at the same time"),
    ("selectors-reject-everything", _four_nodes,
     PodRequest(requests=(DeviceRequest(name="mig", profiles=frozenset({"1g.5gb"}), predicate=_never),)),
     False, "no node fits the pod: 4 nodes with free slices had no room for the device "
     "that the request's selectors accept (28 free devices rejected)"),
]  # fmt: skip

FILTERS = {
    "all-excluded-by-the-node-filter": lambda name: False,
    "filter-and-no-room": lambda name: name != "a",
}


@pytest.mark.parametrize(
    ("case", "make", "pod", "permanent", "reason"), REASONS, ids=[r[0] for r in REASONS]
)
@pytest.mark.parametrize("policy", ["firstfit", "bestfit", "scarcity"])
def test_no_fit_reasons(
    case: str, make: object, pod: PodRequest, permanent: bool, reason: str, policy: str
) -> None:
    assert callable(make)
    engine: Engine = make()
    engine.policy = policy_named(policy)
    result = engine.place(pod, node_filter=FILTERS.get(case))
    assert result == NoFit(reason=reason, permanent=permanent)


@pytest.mark.parametrize(
    ("budget", "reason"),
    [
        (3, "no node fits the pod: the search gave up on 1 node after 3 steps each"),
        (
            1000,
            "no node fits the pod: 1 node with free slices had no room for all 4 devices "
            "together under the pod's constraints",
        ),
    ],
    ids=["gives-up", "exhausts"],
)
def test_search_budget(budget: int, reason: str) -> None:
    engine = Engine(search_budget=budget)
    engine.set_node(node("a", "A100-40GB", "A100-40GB"))
    fill(engine, "a", 0, (0, 4))
    fill(engine, "a", 1, (0, 4))
    # Four 1g-sized slices on one GPU, which has three free: only a search can tell.
    pod = PodRequest(
        requests=(
            DeviceRequest(name="r0", profiles=frozenset({"1g.5gb"}), count=2),
            DeviceRequest(name="r1", profiles=frozenset({"1g.5gb", "1g.5gb+me"}), count=2),
        ),
        constraints=(same_gpu(),),
    )
    assert engine.place(pod) == NoFit(reason=reason, permanent=False)


# ------------------------------------------------------------------------------ inventory feeds


def test_occupancy_recorded_before_the_node_is_known_applies_when_it_appears() -> None:
    engine = Engine()
    engine.occupy("a", 0, start=0, size=8)
    engine.set_node(node("a", "A100-40GB"))
    assert isinstance(engine.place(PodRequest.single("1g.5gb")), NoFit)
    engine.release("a", 0, start=0, size=8)
    assert where(engine.place(PodRequest.single("1g.5gb"))) == [("a", "mig", 0, 0)]


def test_firstfit_follows_name_order_whatever_the_order_nodes_arrive_in() -> None:
    engine = Engine()
    for name in ("node-c", "node-a", "node-d", "node-b"):
        engine.set_node(node(name, "A100-40GB"))
    order = []
    for _ in range(4):
        result = placed(engine.place(PodRequest.single("7g.40gb")))
        engine.commit(result)
        order.append(result.node)
    assert order == ["node-a", "node-b", "node-c", "node-d"]


def test_replacing_a_node_keeps_its_occupancy_and_removing_it_stops_placements() -> None:
    engine = engine_with(node("a", "A100-40GB"), node("b", "A100-40GB"))
    fill(engine, "a", 0, (0, 4))
    engine.set_node(node("a", "A100-40GB"))
    assert where(engine.place(PodRequest.single("4g.20gb"))) == [("b", "mig", 0, 0)]
    engine.remove_node("b")
    assert isinstance(engine.place(PodRequest.single("4g.20gb")), NoFit)
    engine.set_node(node("b", "A100-40GB"))
    assert where(engine.place(PodRequest.single("4g.20gb"))) == [("b", "mig", 0, 0)]


def test_only_published_devices_are_returned() -> None:
    published = frozenset({("1g.5gb", 5), ("1g.5gb", 3)})
    engine = engine_with(node("a", "A100-40GB", published=published))
    first = placed(engine.place(PodRequest.single("1g.5gb")))
    engine.commit(first)
    second = placed(engine.place(PodRequest.single("1g.5gb")))
    engine.commit(second)
    assert [first.assignments[0].start, second.assignments[0].start] == [3, 5]
    assert engine.place(PodRequest.single("1g.5gb")) == NoFit(
        reason="no node has a free 1g.5gb placement", permanent=False
    )
    assert engine.place(PodRequest.single("2g.10gb")).permanent is True  # type: ignore[union-attr]


def test_overlapping_external_occupants_are_kept_until_each_is_released() -> None:
    engine = engine_with(node("a", "A100-40GB"))
    engine.occupy("a", 0, start=0, size=4)
    engine.occupy("a", 0, start=2, size=2)
    engine.release("a", 0, start=0, size=4)
    assert where(engine.place(PodRequest.single("1g.5gb"))) == [("a", "mig", 0, 0)]
    assert engine.inventory.occupants("a", 0) == (Occupant(start=2, size=2),)


def test_releasing_what_is_not_occupied_is_an_error() -> None:
    engine = engine_with(node("a", "A100-40GB"))
    with pytest.raises(NotFoundError, match="no occupied slice"):
        engine.release("a", 0, start=0, size=1)


# ------------------------------------------------------------------------------ commit / release


def test_commit_of_a_stale_result_raises_and_reserves_nothing() -> None:
    engine = engine_with(node("a", "A100-40GB"))
    result = placed(engine.place(PodRequest.single("1g.5gb", count=2)))
    engine.occupy("a", 0, start=1, size=1)
    with pytest.raises(PlacementError, match="no longer free; place the pod again"):
        engine.commit(result)
    assert engine.inventory.occupants("a", 0) == (Occupant(start=1, size=1),)


def test_commit_refuses_a_second_me_on_a_gpu() -> None:
    engine = engine_with(node("a", "A100-40GB"))
    result = placed(engine.place(PodRequest.single("1g.5gb+me")))
    engine.occupy("a", 0, start=5, size=1, media=True)
    with pytest.raises(PlacementError):
        engine.commit(result)


def test_place_changes_nothing_until_commit() -> None:
    engine = engine_with(node("a", "A100-40GB"))
    first = engine.place(PodRequest.single("7g.40gb"))
    assert engine.place(PodRequest.single("7g.40gb")) == first
    engine.commit(placed(first))
    assert isinstance(engine.place(PodRequest.single("7g.40gb")), NoFit)
    engine.release_placed(placed(first))
    assert engine.place(PodRequest.single("7g.40gb")) == first


# ------------------------------------------------------------------------------ constraints


def test_same_gpu_across_two_requests() -> None:
    engine = engine_with(node("a", "A100-40GB", "A100-40GB"))
    fill(engine, "a", 0, (0, 4), (4, 2))  # GPU 0 keeps two 1g slots, no 2g
    pod = PodRequest(
        requests=(
            DeviceRequest(name="small", profiles=frozenset({"1g.5gb"})),
            DeviceRequest(name="pair", profiles=frozenset({"2g.10gb"})),
        ),
        constraints=(same_gpu("small", "pair"),),
    )
    assert where(engine.place(pod)) == [("a", "small", 1, 0), ("a", "pair", 1, 2)]


def test_distinct_gpu_spreads_the_devices_of_one_request() -> None:
    engine = engine_with(node("a", "A100-40GB", "A100-40GB", "A100-40GB"))
    pod = PodRequest(
        requests=(DeviceRequest(name="mig", profiles=frozenset({"1g.5gb"}), count=3),),
        constraints=(distinct_gpu("mig"),),
    )
    assert [a.gpu_index for a in placed(engine.place(pod)).assignments] == [0, 1, 2]


def test_everything_lands_on_one_node_or_nowhere() -> None:
    engine = engine_with(node("a", "A100-40GB"), node("b", "A100-40GB"))
    fill(engine, "a", 0, (0, 4), (4, 2))
    fill(engine, "b", 0, (0, 4), (4, 2))
    pod = PodRequest.single("1g.5gb", count=3)
    assert engine.place(pod) == NoFit(
        reason="no node fits the pod: 2 nodes with free slices had no room for all 3 devices "
        "together",
        permanent=False,
    )


def product(ref: DeviceRef) -> str:
    return ref.model.product_name


def test_match_attribute_on_another_key_backtracks() -> None:
    engine = engine_with(node("a", "A100-40GB", "H100-80GB", "H100-80GB"))
    pod = PodRequest(
        requests=(
            DeviceRequest(name="x", profiles=frozenset({"1g.10gb"})),
            DeviceRequest(name="y", profiles=frozenset({"1g.10gb"})),
        ),
        constraints=(MatchAttribute(key=product), DistinctAttribute()),
    )
    # x fits GPU 0 (an A100, where 1g.10gb is 2 slices) first, but then y has no other A100.
    assert [(a.gpu_index, a.size) for a in placed(engine.place(pod)).assignments] == [
        (1, 1),
        (2, 1),
    ]


def test_predicate_sees_the_device_and_narrows_the_choice() -> None:
    seen: list[DeviceRef] = []

    def upper_half(ref: DeviceRef) -> bool:
        seen.append(ref)
        return ref.start >= 4

    engine = engine_with(node("a", "A100-40GB"))
    pod = PodRequest(
        requests=(DeviceRequest(name="mig", profiles=frozenset({"1g.5gb"}), predicate=upper_half),)
    )
    assert where(engine.place(pod)) == [("a", "mig", 0, 4)]
    assert seen[0].gpu_uuid == "GPU-a-0"
    assert seen[0].model is A100
    assert seen[0].profile.name == "1g.5gb"


def test_request_validation() -> None:
    with pytest.raises(PlacementError, match="unique"):
        PodRequest(
            requests=(
                DeviceRequest(name="x", profiles=frozenset({"1g.5gb"})),
                DeviceRequest(name="x", profiles=frozenset({"1g.5gb"})),
            )
        )
    with pytest.raises(PlacementError, match="at least 1"):
        PodRequest.single("1g.5gb", count=0)
    with pytest.raises(PlacementError, match="unknown requests"):
        PodRequest(
            requests=(DeviceRequest(name="x", profiles=frozenset({"1g.5gb"})),),
            constraints=(same_gpu("y"),),
        )


# ------------------------------------------------------------------------------ policies


def test_unknown_policy_names_the_choices() -> None:
    with pytest.raises(
        ConfigError,
        match=r"unknown placement policy 'worstfit' \(known: firstfit, bestfit, scarcity\)",
    ):
        Engine(policy="worstfit")


def test_bestfit_prefers_the_node_whose_gpu_loses_least() -> None:
    nodes = (node("a", "A100-40GB"), node("b", "A100-40GB"))
    for policy, expected in (("firstfit", "a"), ("bestfit", "b")):
        engine = engine_with(*nodes, policy=policy)
        fill(engine, "b", 0, (0, 1))
        assert placed(engine.place(PodRequest.single("1g.5gb"))).node == expected, policy


def test_bestfit_places_larger_requests_first() -> None:
    engine = engine_with(node("a", "A100-40GB"), policy="bestfit")
    pod = PodRequest(
        requests=(
            DeviceRequest(name="small", profiles=frozenset({"1g.5gb"})),
            DeviceRequest(name="big", profiles=frozenset({"4g.20gb"})),
        )
    )
    assert where(engine.place(pod)) == [("a", "small", 0, 6), ("a", "big", 0, 0)]
    firstfit = engine_with(node("a", "A100-40GB"))
    assert where(firstfit.place(pod)) == [("a", "small", 0, 4), ("a", "big", 0, 0)]


def test_scarcity_keeps_the_instances_the_cluster_is_short_of() -> None:
    """A 3g.20gb fills an upper half on a or on b. bestfit ignores ``+me`` starts and takes the
    fuller GPU, a; there the 3g would take a's last ``+me`` start (one of the cluster's two), on b
    it takes none, so scarcity puts it on b."""
    nodes = (node("a", "A100-40GB"), node("b", "A100-40GB"))
    for policy, expected in (("bestfit", ("a", "3g", 0, 4)), ("scarcity", ("b", "3g", 0, 4))):
        engine = engine_with(*nodes, policy=policy)
        engine.occupy("a", 0, start=0, size=4, profile="3g.20gb")
        engine.occupy("b", 0, start=2, size=2, profile="1g.10gb")
        pod = PodRequest(requests=(DeviceRequest(name="3g", profiles=frozenset({"3g.20gb"})),))
        assert where(engine.place(pod)) == [expected], policy


def test_scarcity_spends_a_plentiful_profile_before_the_last_of_a_scarce_one() -> None:
    """Two empty GPUs and one with a free upper half: a 2g.10gb at 4 on the half-used GPU costs
    upper-half instances the cluster has plenty of; on an empty GPU it would cost one of the two
    7g.40gb instances left."""
    engine = engine_with(node("a", "A100-40GB", "A100-40GB", "A100-40GB"), policy="scarcity")
    engine.occupy("a", 1, start=0, size=4, profile="4g.20gb")
    pod = PodRequest(requests=(DeviceRequest(name="2g", profiles=frozenset({"2g.10gb"})),))
    assert where(engine.place(pod)) == [("a", "2g", 1, 4)]


# ------------------------------------------------------------------------------ metrics


def test_free_instances_is_maintained_incrementally() -> None:
    engine = engine_with(node("a", "A100-40GB"), node("b", "A100-40GB"))
    assert [engine.free_instances(p) for p in ("1g.5gb", "2g.10gb", "7g.40gb", "1g.5gb+me")] == [
        14,
        6,
        2,
        2,
    ]
    engine.occupy("a", 0, start=0, size=1, profile="1g.5gb+me")
    assert [engine.free_instances(p) for p in ("1g.5gb", "2g.10gb", "7g.40gb", "1g.5gb+me")] == [
        13,
        5,
        1,
        1,
    ]
    engine.remove_node("b")
    assert engine.free_instances("7g.40gb") == 0
    assert engine.free_instances("3g.40gb") == 0


# ------------------------------------------------------------------------------ many nodes


@pytest.mark.parametrize("policy", ["firstfit", "bestfit", "scarcity"])
def test_churn_over_many_nodes_matches_a_linear_scan(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """150 nodes (three rank-set words), random single-slice churn: firstfit's answer is the
    first node in name order that fits; both policies' answers are valid; no fit means none fits."""
    # Few known GPU states, so the empty ones are forgotten (and met again) during the churn.
    monkeypatch.setattr(groups_module, "MAX_KNOWN_STATES", 40)
    rng = random.Random(7)
    names = [f"n{i:03d}" for i in range(150)]
    rng.shuffle(names)
    specs = {n: node(n, rng.choice(["A100-40GB", "H100-80GB"])) for n in names}
    engine = engine_with(*specs.values(), policy=policy)
    occupancy: dict[str, dict[int, list[Occupant]]] = {n: {0: []} for n in names}
    live: list[Placed] = []
    profiles = ["1g.5gb", "1g.10gb", "2g.20gb", "3g.20gb", "4g.40gb", "7g.40gb", "7g.80gb"]
    for _ in range(400):
        if live and rng.random() < 0.4:
            gone = live.pop(rng.randrange(len(live)))
            engine.release_placed(gone)
            (a,) = gone.assignments
            occupancy[a.node][0].remove(Occupant(a.start, a.size, a.media, a.profile))
            continue
        pod = PodRequest.single(rng.choice(profiles))
        result = engine.place(pod)
        fitting = [n for n in sorted(names) if reference.fits(specs[n], _view(occupancy[n]), pod)]
        if isinstance(result, NoFit):
            assert fitting == []
            continue
        assert (
            reference.valid_placement(
                specs[result.node], _view(occupancy[result.node]), pod, result.assignments
            )
            == []
        )
        if policy == "firstfit":
            assert result.node == fitting[0]
        engine.commit(result)
        live.append(result)
        (a,) = result.assignments
        occupancy[a.node][0].append(Occupant(a.start, a.size, a.media, a.profile))
    if policy == "scarcity":
        # The incrementally kept GPU-state groups equal a grouping made from scratch.
        groups = {key: {g.node.name for g in gpus} for key, gpus in engine.inventory.gpu_states()}
        fresh: dict[object, set[str]] = {}
        for n in engine.inventory.nodes():
            for gpu in n.gpus:
                fresh.setdefault(gpu.state_key, set()).add(n.name)
                # Each GPU points at the group of its current state (policies read memos there).
                assert gpu.group is not None
                assert gpu.group.key == gpu.state_key
                assert gpu in gpu.group.gpus
        assert groups == fresh
        assert {g.key for g in engine.inventory.state_groups()} == set(fresh)
        # The incrementally kept buckets of each requested profile set equal a fresh bucketing.
        for name, bucket_of, buckets in engine.inventory.groups._buckets:
            regrouped: dict[int, set[object]] = {}
            for group in engine.inventory.state_groups():
                bucket = bucket_of(group)
                if bucket >= 0:
                    regrouped.setdefault(bucket, set()).add(group.key)
            kept = {b: {g.key for g in members} for b, members in buckets.items()}
            assert kept == regrouped, name


def _view(occupants: dict[int, list[Occupant]]) -> dict[int, Sequence[Occupant]]:
    return dict(occupants)


def test_occupy_and_release_keep_each_gpu_state_equal_to_one_derived_from_scratch() -> None:
    """An occupy updates a GPU from the new occupant alone and a release re-derives it; with
    overlapping records, unknown profiles and ``+me`` records both must equal a fresh derivation."""
    rng = random.Random(11)
    engine = engine_with(node("a", "A100-40GB", "H100-80GB"), policy="scarcity")
    held: list[tuple[int, int, int, bool, str | None]] = []
    profiles = [None, "1g.5gb", "1g.5gb+me", "2g.10gb", "1g.10gb", "3g.40gb", "unknown"]
    for _ in range(300):
        if held and rng.random() < 0.45:
            gpu, start, size, media, profile = held.pop(rng.randrange(len(held)))
            engine.release("a", gpu, start=start, size=size, media=media, profile=profile)
        else:
            record = (
                rng.randrange(2),
                rng.randrange(8),
                rng.choice([1, 1, 2, 4]),
                rng.random() < 0.1,
                rng.choice(profiles),
            )
            gpu, start, size, media, profile = record
            engine.occupy("a", gpu, start=start, size=size, media=media, profile=profile)
            held.append(record)
        for state in engine.inventory.node("a").gpus:
            kept = (state.mask, state.media_taken, state.counts, state.used, state.caps, state.key)
            state.derive()
            assert (
                state.mask,
                state.media_taken,
                state.counts,
                state.used,
                state.caps,
                state.key,
            ) == kept
