"""The slice map derived from ResourceSlices, allocated claims and pods."""

from __future__ import annotations

import pytest

from driver.mig.model import Placement
from instaslice.status import ClusterView, GpuView, build_view
from tests.cli.objects import claim, pod, pool


def _gpu(view: ClusterView, node: str, index: int) -> GpuView:
    return next(g for g in view.gpus if (g.node, g.index) == (node, index))


def test_every_published_gpu_is_listed_in_node_and_index_order() -> None:
    view = build_view(resource_slices=pool("node-1") + pool("node-0"), claims=[], pods=[])
    assert [(g.node, g.index) for g in view.gpus] == [
        ("node-0", 0),
        ("node-0", 1),
        ("node-1", 0),
        ("node-1", 1),
    ]
    gpu = view.gpus[0]
    assert gpu.uuid == "GPU-node-0-0"
    assert gpu.product_name == "NVIDIA A100-SXM4-40GB"
    assert gpu.memory_slices == 8
    assert gpu.taken == ()
    assert gpu.memory_map() == "____ ____"


def test_taken_slices_are_labelled_in_placement_order_with_their_claim_and_pod() -> None:
    view = build_view(
        resource_slices=pool("node-0"),
        claims=[
            claim("c-3g", "gpu-0-3g-20gb-4", reserved_for=[("p-3g", "u-3g")]),
            claim("c-2g", "gpu-0-2g-10gb-0", reserved_for=[("p-2g", "u-2g")]),
            claim("c-1g", "gpu-0-1g-5gb-2", reserved_for=[("p-1g", "u-1g")]),
        ],
        pods=[
            pod("p-2g", uid="u-2g"),
            pod("p-1g", uid="u-1g", phase="Pending", node="node-0"),
            pod("p-3g", uid="u-3g"),
        ],
    )
    gpu = _gpu(view, "node-0", 0)
    assert [(t.label, t.profile, t.placement, t.claim_key) for t in gpu.taken] == [
        ("A", "2g.10gb", Placement(0, 2), "demo/c-2g"),
        ("B", "1g.5gb", Placement(2, 1), "demo/c-1g"),
        ("C", "3g.20gb", Placement(4, 4), "demo/c-3g"),
    ]
    assert [[(p.key, p.phase) for p in t.pods] for t in gpu.taken] == [
        [("demo/p-2g", "Running")],
        [("demo/p-1g", "Pending")],
        [("demo/p-3g", "Running")],
    ]
    assert gpu.memory_map() == "AAB_ CCCC"
    assert gpu.memory_slices_taken == 7
    assert view.slices_taken() == 3
    assert view.overlapping() == ()
    assert _gpu(view, "node-0", 1).taken == ()


def test_owner_pod_is_shown_before_the_claim_is_reserved_and_shadow_claims_are_marked() -> None:
    view = build_view(
        resource_slices=pool("node-0"),
        claims=[
            claim("tmpl-claim", "gpu-1-1g-5gb-0", owner_pod=("dra", "u-dra")),
            claim("shadow", "gpu-1-1g-5gb-1", shadow_for="u-classic"),
        ],
        pods=[
            pod("dra", uid="u-dra", phase="Pending", gates=("instaslice.dev/placement",)),
            pod("classic", uid="u-classic", phase="Pending"),
        ],
    )
    first, second = _gpu(view, "node-0", 1).taken
    assert (first.shadow, [(p.key, p.gated) for p in first.pods]) == (False, [("demo/dra", True)])
    assert (second.shadow, [p.key for p in second.pods]) == (True, ["demo/classic"])


def test_a_pod_that_no_longer_exists_is_shown_as_gone() -> None:
    view = build_view(
        resource_slices=pool("node-0"),
        claims=[claim("c", "gpu-0-1g-5gb-0", reserved_for=[("old", "u-old")])],
        pods=[pod("old", uid="u-new")],  # same name, new pod: not the one the claim is for
    )
    assert [(p.key, p.phase) for p in view.gpus[0].taken[0].pods] == [("demo/old", "Gone")]


@pytest.mark.parametrize(
    ("mig_uuids", "device_data", "expected"),
    [
        ({}, None, None),
        ({("uid-c", "gpu-0-1g-5gb-0"): "MIG-from-checkpoint"}, None, "MIG-from-checkpoint"),
        ({}, {"gpu-0-1g-5gb-0": {"migUUID": "MIG-from-status"}}, "MIG-from-status"),
        ({}, {"gpu-0-1g-5gb-1": {"migUUID": "MIG-other-device"}}, None),
        (
            {("uid-c", "gpu-0-1g-5gb-0"): "MIG-from-checkpoint"},
            {"gpu-0-1g-5gb-0": {"migUUID": "MIG-from-status"}},
            "MIG-from-checkpoint",
        ),
    ],
    ids=["unknown", "checkpoint", "claim-status", "status-of-other-device", "checkpoint-wins"],
)
def test_mig_uuid_comes_from_the_checkpoint_or_the_claim_device_status(
    mig_uuids: dict[tuple[str, str], str],
    device_data: dict[str, dict[str, str]] | None,
    expected: str | None,
) -> None:
    view = build_view(
        resource_slices=pool("node-0"),
        claims=[claim("c", "gpu-0-1g-5gb-0", device_data=device_data)],
        pods=[],
        mig_uuids=mig_uuids,
    )
    assert view.gpus[0].taken[0].mig_uuid == expected


@pytest.mark.parametrize(
    ("first", "second", "memory_map"),
    [
        ("gpu-0-2g-10gb-0", "gpu-0-1g-5gb-1", "A!__ ____"),
        ("gpu-0-1g-5gb-me-0", "gpu-0-1g-5gb-me-3", "A__B ____"),
        ("gpu-0-7g-40gb-0", "gpu-0-7g-40gb-0", "!!!! !!!!"),
    ],
    ids=["overlapping-memory", "two-media-extensions", "same-device-twice"],
)
def test_allocations_that_could_not_coexist_on_a_gpu_are_flagged(
    first: str, second: str, memory_map: str
) -> None:
    view = build_view(
        resource_slices=pool("node-0"),
        claims=[claim("one", first), claim("two", second)],
        pods=[],
    )
    gpu = view.gpus[0]
    assert all(t.overlaps for t in gpu.taken)
    assert len(view.overlapping()) == 2
    assert gpu.memory_map() == memory_map


def test_free_starts_leave_out_overlaps_and_a_second_media_extension_slice() -> None:
    view = build_view(
        resource_slices=pool("node-0"),
        claims=[claim("a", "gpu-0-1g-5gb-me-0"), claim("b", "gpu-0-3g-20gb-4")],
        pods=[],
    )
    free = {f.profile: f.starts for f in view.gpus[0].free}
    assert free == {
        "1g.5gb": (1, 2, 3),
        "1g.5gb+me": (),
        "1g.10gb": (2,),
        "2g.10gb": (2,),
        "3g.20gb": (),
        "4g.20gb": (),
        "7g.40gb": (),
    }


def test_allocations_of_other_drivers_and_unpublished_devices() -> None:
    view = build_view(
        resource_slices=pool("node-0"),
        claims=[
            claim("gpu-operator", "gpu-0", driver="gpu.nvidia.com"),
            claim("lost", "gpu-0-1g-5gb-0", node="node-9"),
        ],
        pods=[],
    )
    assert view.slices_taken() == 0
    assert [(s.claim_name, s.pool, s.device) for s in view.strays] == [
        ("lost", "node-9", "gpu-0-1g-5gb-0")
    ]


def test_only_the_newest_generation_of_a_pool_counts_and_other_drivers_slices_are_ignored() -> None:
    old = pool("node-0", gpus=1, generation=1)
    new = pool("node-0", gpus=2, generation=2)
    foreign = pool("node-0", gpus=3, generation=5)
    for obj in foreign:
        obj["spec"]["driver"] = "gpu.nvidia.com"
    view = build_view(resource_slices=old + new + foreign, claims=[], pods=[])
    assert [(g.node, g.index) for g in view.gpus] == [("node-0", 0), ("node-0", 1)]
