"""The ``GpuBackend`` contract, run against every implementation (see ``conftest.py``).

The A100-40GB cases follow NVIDIA's MIG user guide (valid combinations and placement rules,
docs/design.md F18); max counts come from the literal reference tables in
``tests/unit/test_catalog.py``.
"""

import contextlib
import re
import threading
from collections.abc import Sequence

import pytest

from driver.errors import BackendError, NotFoundError, PlacementOccupiedError
from driver.gpu.backend import GpuBackend, MigInstance
from driver.ids import MigUuid
from driver.mig.catalog import CATALOG
from tests.contract.conftest import Factory, Harness
from tests.unit.test_catalog import REFERENCE

OK, OCCUPIED, NOT_ALLOWED = "ok", "occupied", "not-allowed"
Step = tuple[str, int, str]  # (profile, placement start, expected outcome)


def _steps(outcome: str, *creates: tuple[str, int]) -> list[Step]:
    return [(profile, start, outcome) for profile, start in creates]


A100_CASES: dict[str, list[Step]] = {
    "7g-alone": _steps(OK, ("7g.40gb", 0)),
    "4g+3g-fills-the-gpu": _steps(OK, ("4g.20gb", 0), ("3g.20gb", 4)),
    "3g-first-then-4g": _steps(OK, ("3g.20gb", 4), ("4g.20gb", 0)),
    "3g+3g": _steps(OK, ("3g.20gb", 0), ("3g.20gb", 4)),
    "7x1g": _steps(OK, *[("1g.5gb", s) for s in range(7)]),
    "8th-1g-refused": [
        *_steps(OK, *[("1g.5gb", s) for s in range(7)]),
        ("1g.5gb", 3, OCCUPIED),
        ("1g.5gb", 7, NOT_ALLOWED),
    ],
    "two-me-refused": [("1g.5gb+me", 0, OK), ("1g.5gb+me", 3, OCCUPIED)],
    "me-plus-six-1g": _steps(OK, ("1g.5gb+me", 0), *[("1g.5gb", s) for s in range(1, 7)]),
    "me-on-a-taken-slice": [("1g.5gb", 2, OK), ("1g.5gb+me", 2, OCCUPIED)],
    "3x2g+1g-at-6": _steps(OK, ("2g.10gb", 0), ("2g.10gb", 2), ("2g.10gb", 4), ("1g.5gb", 6)),
    "4x1g.10gb": _steps(OK, *[("1g.10gb", s) for s in (0, 2, 4, 6)]),
    "4g+2g+1g": _steps(OK, ("4g.20gb", 0), ("2g.10gb", 4), ("1g.5gb", 6)),
    "4g+3x1g": _steps(OK, ("4g.20gb", 0), ("1g.5gb", 4), ("1g.5gb", 5), ("1g.5gb", 6)),
    "3g+2g+1g": _steps(OK, ("3g.20gb", 0), ("2g.10gb", 4), ("1g.5gb", 6)),
    "2x2g+3g": _steps(OK, ("2g.10gb", 0), ("2g.10gb", 2), ("3g.20gb", 4)),
    "3g+1g.10gb+2x1g": _steps(OK, ("3g.20gb", 0), ("1g.10gb", 4), ("1g.5gb", 6)),
    "overlap-2g-inside-3g": [("3g.20gb", 0, OK), ("2g.10gb", 2, OCCUPIED)],
    "overlap-3g-over-1g": [("1g.5gb", 5, OK), ("3g.20gb", 4, OCCUPIED), ("3g.20gb", 0, OK)],
    "7g-then-anything": [("7g.40gb", 0, OK), ("1g.5gb", 6, OCCUPIED), ("7g.40gb", 0, OCCUPIED)],
    "1g.10gb-at-odd-start": [("1g.10gb", 1, NOT_ALLOWED)],
    "2g-at-6": [("2g.10gb", 6, NOT_ALLOWED)],
    "3g-at-2": [("3g.20gb", 2, NOT_ALLOWED)],
    "4g-at-4": [("4g.20gb", 0, OK), ("4g.20gb", 4, NOT_ALLOWED)],
    "7g-at-1": [("7g.40gb", 1, NOT_ALLOWED)],
    "1g-at-slot-7": [("1g.5gb", 7, NOT_ALLOWED)],
}


def _overlapping(instances: Sequence[MigInstance]) -> list[tuple[MigInstance, MigInstance]]:
    return [
        (a, b)
        for i, a in enumerate(instances)
        for b in instances[i + 1 :]
        if a.gpu_index == b.gpu_index and a.placement.overlaps(b.placement)
    ]


def _where(instances: Sequence[MigInstance]) -> set[tuple[int, str, int]]:
    return {(i.gpu_index, i.profile, i.placement.start) for i in instances}


# -- discovery (also read-only on a real GPU) -------------------------------------------------


def test_gpus_are_listed_in_index_order_with_their_mig_profiles(
    discovery_backend: GpuBackend,
) -> None:
    gpus = discovery_backend.gpus()
    assert [g.index for g in gpus] == list(range(len(gpus)))
    assert len({g.uuid for g in gpus}) == len(gpus)
    for gpu in gpus:
        assert gpu.uuid.startswith("GPU-")
        assert gpu.product_name
        assert gpu.memory_bytes > 0
        assert (gpu.model is not None) == gpu.mig_enabled
        if gpu.model is None:
            continue
        ids = [p.gi_profile_id for p in gpu.model.profiles]
        assert len(set(ids)) == len(ids)
        assert len(set(gpu.model.profile_names)) == len(ids)
        assert gpu.multiprocessors == max(p.multiprocessors for p in gpu.model.profiles)
        for profile in gpu.model.profiles:
            assert profile.max_count >= 1
            assert profile.placements
            for placement in profile.placements:
                assert placement.size == profile.memory_slices
                assert placement.start >= 0
                assert placement.end <= gpu.model.memory_slices


def test_existing_instances_are_consistent_with_the_gpus(discovery_backend: GpuBackend) -> None:
    gpus = {g.index: g for g in discovery_backend.gpus()}
    instances = discovery_backend.instances()
    assert not _overlapping(instances)
    for instance in instances:
        gpu = gpus[instance.gpu_index]
        assert gpu.model is not None
        assert instance.gpu_uuid == gpu.uuid
        assert instance.placement in gpu.model.profile(instance.profile).placements
        if instance.complete:
            assert instance.mig_uuid is not None
            assert instance.mig_uuid.startswith("MIG-")
            usage = discovery_backend.slice_usage(mig_uuid=instance.mig_uuid)
            assert 0 <= usage.memory_used_bytes <= usage.memory_total_bytes
    for index in gpus:
        assert discovery_backend.instances(gpu_index=index) == tuple(
            i for i in instances if i.gpu_index == index
        )


def test_instances_of_an_unknown_gpu_index_is_not_found(discovery_backend: GpuBackend) -> None:
    missing = len(discovery_backend.gpus()) + 3
    with pytest.raises(NotFoundError, match=f"GPU index {missing}"):
        discovery_backend.instances(gpu_index=missing)


def test_emulated_and_fake_gpus_report_the_catalog_profiles(harness: Harness) -> None:
    gpus = harness.backend.gpus()
    assert [g.product_name for g in gpus] == [
        CATALOG["A100-40GB"].product_name,
        CATALOG["H100-80GB"].product_name,
    ]
    for gpu, name in zip(gpus, ("A100-40GB", "H100-80GB"), strict=True):
        assert gpu.model is not None
        reported = {p.name: p for p in gpu.model.profiles}
        assert sorted(reported) == sorted(CATALOG[name].profile_names)
        for expected in CATALOG[name].profiles:
            got = reported[expected.name]
            assert (got.gi_profile_id, got.ci_profile_id, got.placements, got.max_count) == (
                expected.gi_profile_id,
                expected.ci_profile_id,
                expected.placements,
                expected.max_count,
            )
            assert (got.memory_bytes, got.multiprocessors, got.media_extensions) == (
                expected.memory_bytes,
                expected.multiprocessors,
                expected.media_extensions,
            )


# -- creating slices ---------------------------------------------------------------------------


@pytest.mark.parametrize("steps", list(A100_CASES.values()), ids=list(A100_CASES))
def test_a100_40gb_combinations(harness: Harness, steps: list[Step]) -> None:
    backend = harness.backend
    created: list[MigInstance] = []
    for profile, start, expected in steps:
        if expected == OK:
            created.append(backend.create_slice(gpu_index=0, profile=profile, start=start))
        elif expected == OCCUPIED:
            with pytest.raises(
                PlacementOccupiedError, match=re.escape(f"{profile} at placement start {start}")
            ):
                backend.create_slice(gpu_index=0, profile=profile, start=start)
        else:
            with pytest.raises(NotFoundError, match=f"start {start} is not allowed"):
                backend.create_slice(gpu_index=0, profile=profile, start=start)
    instances = backend.instances()
    assert _where(instances) == _where(created)  # refusals left nothing behind
    assert all(i.complete for i in instances)
    assert not _overlapping(instances)


MAX_COUNT_GPUS = list(REFERENCE)


@pytest.mark.parametrize("gpu", MAX_COUNT_GPUS)
def test_each_profile_fits_exactly_its_reference_max_count(make_harness: Factory, gpu: str) -> None:
    backend = make_harness(gpu).backend
    for row in REFERENCE[gpu].rows:
        made = []
        for start in row.starts:
            with contextlib.suppress(PlacementOccupiedError):
                made.append(backend.create_slice(gpu_index=0, profile=row.profile, start=start))
        assert len(made) == row.max_count, row.profile
        for start in row.starts:
            with pytest.raises(PlacementOccupiedError):
                backend.create_slice(gpu_index=0, profile=row.profile, start=start)
        for instance in made:
            backend.destroy_slice(gpu_index=0, gi_id=instance.gi_id)
        assert backend.instances() == ()


def test_slices_on_different_gpus_are_independent(harness: Harness) -> None:
    a = harness.backend.create_slice(gpu_index=0, profile="7g.40gb", start=0)
    b = harness.backend.create_slice(gpu_index=1, profile="7g.80gb", start=0)
    assert harness.backend.instances(gpu_index=0) == (a,)
    assert harness.backend.instances(gpu_index=1) == (b,)


def test_instances_report_ids_placements_and_mig_uuids(harness: Harness) -> None:
    backend = harness.backend
    gpus = backend.gpus()
    created = [
        backend.create_slice(gpu_index=0, profile="3g.20gb", start=4),
        backend.create_slice(gpu_index=0, profile="1g.5gb+me", start=0),
        backend.create_slice(gpu_index=1, profile="2g.20gb", start=2),
    ]
    assert [(c.profile, c.placement.start, c.placement.size) for c in created] == [
        ("3g.20gb", 4, 4),
        ("1g.5gb+me", 0, 1),
        ("2g.20gb", 2, 2),
    ]
    for instance in created:
        assert instance.complete
        assert instance.gpu_uuid == gpus[instance.gpu_index].uuid
        assert instance.mig_uuid is not None
        assert instance.mig_uuid.startswith("MIG-")
    assert len({c.mig_uuid for c in created}) == 3
    assert len({c.gi_id for c in created if c.gpu_index == 0}) == 2
    assert set(backend.instances()) == set(created)
    assert list(backend.instances()) == sorted(created, key=lambda i: (i.gpu_index, i.gi_id))


def test_destroy_then_recreate_the_same_placement(harness: Harness) -> None:
    backend = harness.backend
    first = backend.create_slice(gpu_index=0, profile="4g.20gb", start=0)
    with pytest.raises(PlacementOccupiedError):
        backend.create_slice(gpu_index=0, profile="4g.20gb", start=0)
    backend.destroy_slice(gpu_index=0, gi_id=first.gi_id)
    assert backend.instances() == ()
    again = backend.create_slice(gpu_index=0, profile="4g.20gb", start=0)
    assert backend.instances() == (again,)
    backend.destroy_slice(gpu_index=0, gi_id=again.gi_id)
    with pytest.raises(NotFoundError, match=f"GPU instance {again.gi_id}"):
        backend.destroy_slice(gpu_index=0, gi_id=again.gi_id)


def test_compute_instance_failure_destroys_the_gpu_instance(harness: Harness) -> None:
    harness.fail_next_ci()
    with pytest.raises(BackendError, match="compute instance") as caught:
        harness.backend.create_slice(gpu_index=0, profile="2g.10gb", start=2)
    assert not isinstance(caught.value, PlacementOccupiedError)
    assert caught.value.__cause__ is not None
    assert harness.backend.instances() == ()
    made = harness.backend.create_slice(gpu_index=0, profile="2g.10gb", start=2)
    assert harness.backend.instances() == (made,)


def test_slice_usage_reports_the_mig_devices_memory(harness: Harness) -> None:
    backend = harness.backend
    made = [
        backend.create_slice(gpu_index=0, profile="3g.20gb", start=4),
        backend.create_slice(gpu_index=1, profile="1g.10gb", start=0),
    ]
    for instance in made:
        assert instance.mig_uuid is not None
        usage = backend.slice_usage(mig_uuid=instance.mig_uuid)
        profile = CATALOG[("A100-40GB", "H100-80GB")[instance.gpu_index]].profile(instance.profile)
        assert usage.memory_total_bytes == profile.memory_bytes
        assert 0 <= usage.memory_used_bytes <= usage.memory_total_bytes
        assert backend.slice_usage(mig_uuid=instance.mig_uuid) == usage
    # Neither the emulated GPUs nor the fake's default report utilization for MIG devices.
    assert usage.gpu_utilization_percent is usage.memory_utilization_percent is None


def test_slice_usage_of_a_mig_device_that_does_not_exist_is_not_found(harness: Harness) -> None:
    backend = harness.backend
    made = backend.create_slice(gpu_index=0, profile="2g.10gb", start=0)
    assert made.mig_uuid is not None
    backend.destroy_slice(gpu_index=0, gi_id=made.gi_id)
    with pytest.raises(NotFoundError, match=re.escape(made.mig_uuid)):
        backend.slice_usage(mig_uuid=made.mig_uuid)


# -- bad input: typed errors naming the value --------------------------------------------------


@pytest.mark.parametrize(
    ("gpu_index", "profile", "start", "error", "named"),
    [
        (0, "5g.30gb", 0, NotFoundError, "'5g\\.30gb'"),
        (0, "1g.18gb", 0, NotFoundError, "'1g\\.18gb'"),  # an H200 profile on an A100
        (0, "1g.10gb", 3, NotFoundError, "start 3"),
        (0, "1g.5gb", -1, NotFoundError, "start -1"),
        (7, "1g.5gb", 0, NotFoundError, "GPU index 7"),
        (-1, "1g.5gb", 0, NotFoundError, "GPU index -1"),
    ],
    ids=["unknown-profile", "other-gpus-profile", "start-not-allowed", "negative-start",
         "unknown-gpu", "negative-gpu"],
)  # fmt: skip
def test_bad_create_input_is_a_typed_error_naming_the_value(
    harness: Harness, gpu_index: int, profile: str, start: int, error: type[Exception], named: str
) -> None:
    with pytest.raises(error, match=named):
        harness.backend.create_slice(gpu_index=gpu_index, profile=profile, start=start)
    assert harness.backend.instances() == ()


@pytest.mark.parametrize(
    ("gpu_index", "gi_id", "named"),
    [(0, 5, "GPU instance 5"), (9, 1, "GPU index 9")],
    ids=["unknown-gi", "unknown-gpu"],
)
def test_bad_destroy_input_is_not_found(
    harness: Harness, gpu_index: int, gi_id: int, named: str
) -> None:
    kept = harness.backend.create_slice(gpu_index=0, profile="1g.5gb", start=0)
    with pytest.raises(NotFoundError, match=named):
        harness.backend.destroy_slice(gpu_index=gpu_index, gi_id=gi_id)
    assert harness.backend.instances() == (kept,)


def test_a_closed_backend_refuses_calls(harness: Harness) -> None:
    harness.backend.close()
    with pytest.raises(BackendError, match="closed"):
        harness.backend.gpus()
    with pytest.raises(BackendError, match="closed"):
        harness.backend.create_slice(gpu_index=0, profile="1g.5gb", start=0)
    with pytest.raises(BackendError, match="closed"):
        harness.backend.slice_usage(mig_uuid=MigUuid("MIG-00000000-0000-0000-0000-000000000000"))
    harness.backend.close()  # closing twice is harmless


# -- state that outlives a backend, and concurrency ---------------------------------------------


def test_instances_outlive_the_backend_that_created_them(harness: Harness) -> None:
    made = harness.backend.create_slice(gpu_index=1, profile="3g.40gb", start=0)
    harness.backend.close()
    second = harness.another()
    assert second.gpus()[1].uuid == made.gpu_uuid
    assert second.instances() == (made,)
    with pytest.raises(PlacementOccupiedError):
        second.create_slice(gpu_index=1, profile="1g.10gb", start=2)
    second.destroy_slice(gpu_index=1, gi_id=made.gi_id)
    assert second.instances() == ()


def test_two_backends_on_the_same_gpus_see_each_others_changes(harness: Harness) -> None:
    other = harness.another()
    made = harness.backend.create_slice(gpu_index=0, profile="4g.20gb", start=0)
    assert other.instances() == (made,)
    with pytest.raises(PlacementOccupiedError):
        other.create_slice(gpu_index=0, profile="3g.20gb", start=0)
    other.destroy_slice(gpu_index=0, gi_id=made.gi_id)
    assert harness.backend.instances() == ()


def test_concurrent_creates_never_overlap(harness: Harness) -> None:
    backends = [harness.backend]
    if harness.reopen is not None:
        backends.append(harness.another())  # another process's view of the same GPUs
    barrier = threading.Barrier(10)
    made: list[MigInstance] = []
    refused: list[Exception] = []

    def worker(number: int) -> None:
        backend = backends[number % len(backends)]
        barrier.wait()
        for start in [(number + k) % 7 for k in range(7)]:
            try:
                made.append(backend.create_slice(gpu_index=0, profile="1g.5gb", start=start))
                return
            except PlacementOccupiedError as exc:
                refused.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 7
    assert sorted(i.placement.start for i in made) == list(range(7))
    assert not _overlapping(harness.backend.instances())
    assert set(harness.backend.instances()) == set(made)
    assert len(refused) >= 3 * 7  # the three losers tried every start
