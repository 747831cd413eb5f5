"""The built-in MIG catalog against the reference tables, written out here literally.

Source: docs/design.md F18 (placement rules, GI profile ids, max counts) and
F19 (per-GPU tables: memory and SM fractions, GiB, SMs, placements). Nothing here is computed from
the catalog's own constants: a typo in the catalog fails a test instead of agreeing with itself.
``tests/contract/test_gpu_backend.py`` reuses ``REFERENCE`` to check what the backends enforce.
"""

from typing import NamedTuple

import pytest

from driver.errors import ConfigError
from driver.mig.catalog import CATALOG, gpu_model
from driver.mig.model import MIB


class Row(NamedTuple):
    profile: str
    gi_id: int
    memory_slices: int
    compute_slices: int
    max_count: int
    starts: tuple[int, ...]
    size: int
    gib: tuple[float, float] | None
    """GiB as ``nvidia-smi mig -lgip`` reports it (a range where drivers differ); None: not captured."""
    sms: int | None


class Gpu(NamedTuple):
    memory_slices: int
    compute_slices: int
    rows: tuple[Row, ...]


ALL7 = (0, 1, 2, 3, 4, 5, 6)
EVEN4 = (0, 2, 4, 6)
EVEN3 = (0, 2, 4)

REFERENCE: dict[str, Gpu] = {
    "A100-40GB": Gpu(8, 7, (
        Row("1g.5gb", 19, 1, 1, 7, ALL7, 1, (4.75, 4.75), 14),
        Row("1g.5gb+me", 20, 1, 1, 1, ALL7, 1, (4.75, 4.75), 14),
        Row("1g.10gb", 15, 2, 1, 4, EVEN4, 2, (9.62, 9.75), 14),
        Row("2g.10gb", 14, 2, 2, 3, EVEN3, 2, (9.62, 9.62), 28),
        Row("3g.20gb", 9, 4, 3, 2, (0, 4), 4, (19.50, 19.50), 42),
        Row("4g.20gb", 5, 4, 4, 1, (0,), 4, (19.50, 19.50), 56),
        Row("7g.40gb", 0, 8, 7, 1, (0,), 8, (39.25, 39.50), 98),
    )),
    "A100-80GB": Gpu(8, 7, (
        Row("1g.10gb", 19, 1, 1, 7, ALL7, 1, (9.50, 9.50), 14),
        Row("1g.10gb+me", 20, 1, 1, 1, ALL7, 1, (9.50, 9.50), 14),
        Row("1g.20gb", 15, 2, 1, 4, EVEN4, 2, (19.50, 19.50), 14),
        Row("2g.20gb", 14, 2, 2, 3, EVEN3, 2, (19.50, 19.50), 28),
        Row("3g.40gb", 9, 4, 3, 2, (0, 4), 4, (39.50, 39.50), 42),
        Row("4g.40gb", 5, 4, 4, 1, (0,), 4, (39.50, 39.50), 56),
        Row("7g.80gb", 0, 8, 7, 1, (0,), 8, (79.25, 79.25), 98),
    )),
    "A30-24GB": Gpu(4, 4, (
        Row("1g.6gb", 14, 1, 1, 4, (0, 1, 2, 3), 1, (5.81, 5.81), 14),
        Row("1g.6gb+me", 21, 1, 1, 1, (0, 1, 2, 3), 1, (5.81, 5.81), 14),
        Row("2g.12gb", 5, 2, 2, 2, (0, 2), 2, (11.69, 11.69), 28),
        Row("2g.12gb+me", 6, 2, 2, 1, (0, 2), 2, (11.69, 11.69), 28),
        Row("4g.24gb", 0, 4, 4, 1, (0,), 4, (23.44, 23.44), 56),
    )),
    "H100-80GB": Gpu(8, 7, (
        Row("1g.10gb", 19, 1, 1, 7, ALL7, 1, (9.75, 9.75), 16),
        Row("1g.10gb+me", 20, 1, 1, 1, ALL7, 1, (9.75, 9.75), 16),
        Row("1g.20gb", 15, 2, 1, 4, EVEN4, 2, (19.62, 19.62), 26),
        Row("2g.20gb", 14, 2, 2, 3, EVEN3, 2, (19.62, 19.62), 32),
        Row("3g.40gb", 9, 4, 3, 2, (0, 4), 4, (39.50, 39.50), 60),
        Row("4g.40gb", 5, 4, 4, 1, (0,), 4, (39.50, 39.50), 64),
        Row("7g.80gb", 0, 8, 7, 1, (0,), 8, (79.25, 79.25), 132),
    )),
    "H100-94GB": Gpu(8, 7, (
        Row("1g.12gb", 19, 1, 1, 7, ALL7, 1, (10.75, 10.75), 16),
        Row("1g.12gb+me", 20, 1, 1, 1, ALL7, 1, (10.75, 10.75), 16),
        Row("1g.24gb", 15, 2, 1, 4, EVEN4, 2, (21.62, 21.62), 26),
        Row("2g.24gb", 14, 2, 2, 3, EVEN3, 2, (21.62, 21.62), 32),
        Row("3g.47gb", 9, 4, 3, 2, (0, 4), 4, (46.38, 46.38), 60),
        Row("4g.47gb", 5, 4, 4, 1, (0,), 4, (46.38, 46.38), 64),
        Row("7g.94gb", 0, 8, 7, 1, (0,), 8, (93.12, 93.12), 132),
    )),
    "H200-141GB": Gpu(8, 7, (
        Row("1g.18gb", 19, 1, 1, 7, ALL7, 1, (16.00, 16.00), 16),
        Row("1g.18gb+me", 20, 1, 1, 1, ALL7, 1, (16.00, 16.00), 16),
        Row("1g.35gb", 15, 2, 1, 4, EVEN4, 2, (32.25, 32.25), 26),
        Row("2g.35gb", 14, 2, 2, 3, EVEN3, 2, (32.25, 32.25), 32),
        Row("3g.71gb", 9, 4, 3, 2, (0, 4), 4, (69.50, 69.50), 60),
        Row("4g.71gb", 5, 4, 4, 1, (0,), 4, (69.50, 69.50), 64),
        Row("7g.141gb", 0, 8, 7, 1, (0,), 8, (139.75, 139.75), 132),
    )),
    "B200-180GB": Gpu(8, 7, (
        Row("1g.23gb", 19, 1, 1, 7, ALL7, 1, (20.50, 22.00), 18),
        Row("1g.23gb+me", 20, 1, 1, 1, ALL7, 1, (20.50, 22.00), 18),
        Row("1g.45gb", 15, 2, 1, 4, EVEN4, 2, (44.25, 44.25), 30),
        Row("2g.45gb", 14, 2, 2, 3, EVEN3, 2, (44.25, 44.25), 36),
        Row("3g.90gb", 9, 4, 3, 2, (0, 4), 4, None, None),
        Row("4g.90gb", 5, 4, 4, 1, (0,), 4, None, None),
        Row("7g.180gb", 0, 8, 7, 1, (0,), 8, None, None),
    )),
}  # fmt: skip

CASES = [(gpu, row) for gpu, ref in REFERENCE.items() for row in ref.rows]


def test_catalog_has_exactly_the_reference_gpus() -> None:
    assert sorted(CATALOG) == sorted(REFERENCE)


@pytest.mark.parametrize("gpu", list(REFERENCE))
def test_catalog_gpu_has_exactly_the_reference_profiles(gpu: str) -> None:
    model = CATALOG[gpu]
    assert sorted(model.profile_names) == sorted(row.profile for row in REFERENCE[gpu].rows)
    assert model.memory_slices == REFERENCE[gpu].memory_slices
    assert model.compute_slices == REFERENCE[gpu].compute_slices


@pytest.mark.parametrize(("gpu", "row"), CASES, ids=[f"{g}-{r.profile}" for g, r in CASES])
def test_catalog_profile_matches_reference(gpu: str, row: Row) -> None:
    profile = CATALOG[gpu].profile(row.profile)
    assert profile.gi_profile_id == row.gi_id
    assert profile.memory_slices == row.memory_slices
    assert profile.compute_slices == row.compute_slices
    assert profile.max_count == row.max_count
    assert tuple(p.start for p in profile.placements) == row.starts
    assert {p.size for p in profile.placements} == {row.size}
    assert profile.media_extensions == row.profile.endswith("+me")
    assert profile.captured == (row.gib is not None)
    if row.gib is not None:
        low, high = row.gib
        assert low - 0.01 <= profile.memory_bytes / 1024 / MIB <= high + 0.01
    if row.sms is not None:
        assert profile.multiprocessors == row.sms


@pytest.mark.parametrize(
    ("gpu", "ci_profile_by_compute_slices"),
    [
        # nvml.h NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3,4,7}_SLICE = 0, 1, 2, 3, 4.
        ("A100-40GB", {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}),
        ("A30-24GB", {1: 0, 2: 1, 4: 3}),
    ],
    ids=["8-slice", "A30"],
)
def test_default_compute_instance_covers_the_whole_gpu_instance(
    gpu: str, ci_profile_by_compute_slices: dict[int, int]
) -> None:
    for profile in CATALOG[gpu].profiles:
        assert profile.ci_profile_id == ci_profile_by_compute_slices[profile.compute_slices]


@pytest.mark.parametrize(
    ("name", "expected"),
    [("A100-40GB", "A100-40GB"), ("a100-40gb", "A100-40GB"), (" h200-141gb ", "H200-141GB")],
    ids=["exact", "lower-case", "padded"],
)
def test_gpu_model_lookup(name: str, expected: str) -> None:
    assert gpu_model(name).name == expected


def test_gpu_model_unknown_names_the_value() -> None:
    with pytest.raises(ConfigError, match="'V100-16GB'"):
        gpu_model("V100-16GB")
