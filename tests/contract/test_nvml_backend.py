"""What only the NVML backend has: NVML's life cycle, MIG mode, error codes, names, cap minors.

All against ``FakeNvml``, which answers as NVML does; the GPU-host run is the ``gpu``-marked part of
``test_gpu_backend.py``.
"""

import re
from pathlib import Path
from typing import Any

import pytest

from driver.errors import BackendError, ConfigError, NotFoundError, PlacementOccupiedError
from driver.gpu import caps
from driver.gpu import nvml_api as api
from driver.gpu.backend import SliceUsage
from driver.gpu.fake_nvml import FakeNvml, FakeNvmlError
from driver.gpu.nvml import NvmlCallError, NvmlGpuBackend
from driver.mig.catalog import CATALOG

MUTATING_CALLS = {
    "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlComputeInstanceDestroy",
    "nvmlGpuInstanceDestroy",
}


def _backend(fake: FakeNvml, tmp_path: Path | None = None) -> NvmlGpuBackend:
    minors = caps.MIG_MINORS_PATH if tmp_path is None else tmp_path / "mig-minors"
    return NvmlGpuBackend(nvml=fake, mig_minors_path=minors)


def test_nvml_is_initialised_once_and_shut_down_once() -> None:
    fake = FakeNvml(gpus="2xA100-40GB")
    backend = _backend(fake)
    backend.gpus()
    made = backend.create_slice(gpu_index=1, profile="1g.5gb", start=0)
    backend.instances()
    backend.destroy_slice(gpu_index=1, gi_id=made.gi_id)
    assert fake.calls.count("nvmlInit") == 1
    assert fake.initialised
    backend.close()
    backend.close()
    assert fake.calls.count("nvmlShutdown") == 1
    assert not fake.initialised


def test_nvml_that_cannot_initialise_is_a_backend_error() -> None:
    fake = FakeNvml(gpus="A100-40GB")
    fake.fail("nvmlInit", code=api.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(BackendError, match="nvmlInit") as caught:
        _backend(fake)
    assert isinstance(caught.value.__cause__, FakeNvmlError)
    assert caught.value.__cause__.value == api.NVML_ERROR_DRIVER_NOT_LOADED


def test_discovery_changes_nothing() -> None:
    fake = FakeNvml(gpus="A100-40GB,A30-24GB", mig_enabled=(True, False))
    backend = _backend(fake)
    backend.gpus()
    backend.instances()
    backend.instances(gpu_index=1)
    assert not MUTATING_CALLS & set(fake.calls)
    assert not any("SetMigMode" in call for call in fake.calls)


def test_a_gpu_with_mig_off_is_reported_and_never_changed() -> None:
    fake = FakeNvml(gpus="2xA100-40GB", mig_enabled=(True, False))
    backend = _backend(fake)
    on, off = backend.gpus()
    assert (on.mig_enabled, on.mig_pending, on.model is not None) == (True, True, True)
    assert (off.mig_enabled, off.mig_pending, off.model) == (False, False, None)
    assert off.multiprocessors == 0
    with pytest.raises(ConfigError, match=re.escape("MIG mode is not enabled on GPU 1")):
        backend.create_slice(gpu_index=1, profile="1g.5gb", start=0)
    with pytest.raises(NotFoundError, match="MIG mode is off"):
        backend.destroy_slice(gpu_index=1, gi_id=1)
    assert backend.instances(gpu_index=1) == ()
    fake.set_mig_mode(1, current=False, pending=True)
    with pytest.raises(ConfigError, match="pending a GPU reset"):
        backend.create_slice(gpu_index=1, profile="1g.5gb", start=0)
    assert not MUTATING_CALLS & set(fake.calls)


def test_a_gpu_without_mig_support_reports_mig_off() -> None:
    fake = FakeNvml(gpus="A100-40GB")
    fake.fail("nvmlDeviceGetMigMode", code=api.NVML_ERROR_NOT_SUPPORTED)
    (gpu,) = _backend(fake).gpus()
    assert (gpu.mig_enabled, gpu.mig_pending, gpu.model) == (False, None, None)


@pytest.mark.parametrize("gpu", list(CATALOG))
def test_profile_names_are_derived_when_nvml_has_none(gpu: str) -> None:
    """Drivers without the V call give no names; the derived ones match NVIDIA's for every GPU."""
    fake = FakeNvml(gpus=gpu, profile_info_v2=False)
    (info,) = _backend(fake).gpus()
    assert info.model is not None
    assert sorted(info.model.profile_names) == sorted(CATALOG[gpu].profile_names)


def test_discovered_profiles_follow_nvml_selector_order_and_ids() -> None:
    (gpu,) = _backend(FakeNvml(gpus="A100-40GB")).gpus()
    assert gpu.model is not None
    assert [(p.name, p.gi_profile_id) for p in gpu.model.profiles] == [
        ("1g.5gb", 19),  # NVML_GPU_INSTANCE_PROFILE_1_SLICE
        ("2g.10gb", 14),
        ("3g.20gb", 9),
        ("4g.20gb", 5),
        ("7g.40gb", 0),
        ("1g.5gb+me", 20),  # …_1_SLICE_REV1
        ("1g.10gb", 15),  # …_1_SLICE_REV2
    ]


def test_insufficient_resources_on_create_is_placement_occupied() -> None:
    fake = FakeNvml(gpus="A100-40GB")
    backend = _backend(fake)
    fake.fail(
        "nvmlDeviceCreateGpuInstanceWithPlacement", code=api.NVML_ERROR_INSUFFICIENT_RESOURCES
    )
    with pytest.raises(
        PlacementOccupiedError, match=re.escape("1g.5gb at placement start 2")
    ) as caught:
        backend.create_slice(gpu_index=0, profile="1g.5gb", start=2)
    assert isinstance(caught.value.__cause__, FakeNvmlError)
    assert caught.value.__cause__.value == api.NVML_ERROR_INSUFFICIENT_RESOURCES


def test_other_nvml_failures_are_backend_errors_raised_from_nvml() -> None:
    fake = FakeNvml(gpus="A100-40GB")
    backend = _backend(fake)
    fake.fail("nvmlDeviceCreateGpuInstanceWithPlacement", code=api.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(NvmlCallError) as caught:
        backend.create_slice(gpu_index=0, profile="1g.5gb", start=2)
    assert not isinstance(caught.value, PlacementOccupiedError)
    assert caught.value.code == api.NVML_ERROR_NO_PERMISSION
    assert isinstance(caught.value.__cause__, FakeNvmlError)
    assert backend.instances() == ()


def test_a_failed_rollback_leaves_a_reported_gi_without_ci_for_recovery() -> None:
    fake = FakeNvml(gpus="A100-40GB")
    backend = _backend(fake)
    fake.fail("nvmlGpuInstanceCreateComputeInstance", code=api.NVML_ERROR_UNKNOWN)
    fake.fail("nvmlGpuInstanceDestroy", code=api.NVML_ERROR_IN_USE)
    with pytest.raises(BackendError, match="destroying the GPU instance failed too"):
        backend.create_slice(gpu_index=0, profile="3g.20gb", start=0)
    (orphan,) = backend.instances()
    assert (orphan.profile, orphan.ci_id, orphan.mig_uuid, orphan.complete) == (
        "3g.20gb",
        None,
        None,
        False,
    )
    backend.destroy_slice(gpu_index=0, gi_id=orphan.gi_id)
    assert backend.instances() == ()


def test_a_ci_that_cannot_be_read_back_is_destroyed_with_its_gi() -> None:
    fake = FakeNvml(gpus="A100-40GB")
    backend = _backend(fake)
    fake.fail("nvmlComputeInstanceGetInfo", code=api.NVML_ERROR_UNKNOWN)
    with pytest.raises(BackendError, match="compute instance"):
        backend.create_slice(gpu_index=0, profile="1g.10gb", start=2)
    assert fake.calls.count("nvmlComputeInstanceDestroy") == 1
    assert backend.instances() == ()


def test_destroy_of_a_gi_in_use_fails_and_can_be_retried() -> None:
    fake = FakeNvml(gpus="A100-40GB")
    backend = _backend(fake)
    made = backend.create_slice(gpu_index=0, profile="2g.10gb", start=0)
    fake.fail("nvmlGpuInstanceDestroy", code=api.NVML_ERROR_IN_USE)
    with pytest.raises(BackendError, match="In use"):
        backend.destroy_slice(gpu_index=0, gi_id=made.gi_id)
    (left,) = backend.instances()
    assert (left.gi_id, left.ci_id) == (made.gi_id, None)  # its CI went first
    backend.destroy_slice(gpu_index=0, gi_id=made.gi_id)
    assert backend.instances() == ()


def test_compute_instances_created_out_of_band_are_destroyed_too() -> None:
    fake = FakeNvml(gpus="A100-40GB")
    backend = _backend(fake)
    device = fake.nvmlDeviceGetHandleByIndex(0)
    placement = fake.c_nvmlGpuInstancePlacement_t(start=4, size=4)
    gi = fake.nvmlDeviceCreateGpuInstanceWithPlacement(device, 9, placement)  # 3g.20gb
    for _ in range(3):
        fake.nvmlGpuInstanceCreateComputeInstance(gi, 0)  # three 1-slice CIs
    (instance,) = backend.instances()
    assert (instance.profile, instance.ci_id) == ("3g.20gb", 0)
    backend.destroy_slice(gpu_index=0, gi_id=instance.gi_id)
    assert fake.calls.count("nvmlComputeInstanceDestroy") == 3
    assert backend.instances() == ()


def test_cap_minors_come_from_the_mig_minors_file(tmp_path: Path) -> None:
    (tmp_path / "mig-minors").write_text(caps.layout_text(gpu_count=2))
    backend = _backend(FakeNvml(gpus="2xH100-80GB"), tmp_path)
    made = backend.create_slice(gpu_index=1, profile="1g.10gb", start=3)
    assert made.gi_cap_minor == caps.layout_minor(gpu_minor=1, gi_id=made.gi_id)
    assert made.ci_cap_minor == caps.layout_minor(gpu_minor=1, gi_id=made.gi_id, ci_id=0)
    assert backend.instances() == (made,)


def test_cap_minors_are_none_without_the_file(tmp_path: Path) -> None:
    made = _backend(FakeNvml(gpus="A100-40GB"), tmp_path).create_slice(
        gpu_index=0, profile="1g.5gb", start=0
    )
    assert (made.gi_cap_minor, made.ci_cap_minor) == (None, None)


def test_mig_minors_parsing() -> None:
    text = "config 1\nmonitor 2\ngpu0/gi1/access 12\n\ngarbage\ngpu0/gi1/ci0/access 13\nx y z\n"
    table = caps.parse_mig_minors(text)
    assert dict(table) == {
        "config": 1,
        "monitor": 2,
        "gpu0/gi1/access": 12,
        "gpu0/gi1/ci0/access": 13,
    }
    assert caps.layout_minor(gpu_minor=0, gi_id=1) == 12
    assert caps.layout_minor(gpu_minor=0, gi_id=1, ci_id=0) == 13


class _BytesNvml(FakeNvml):
    """Older pynvml releases return ``bytes`` for names and UUIDs."""

    def nvmlDeviceGetUUID(self, handle: Any) -> Any:
        return super().nvmlDeviceGetUUID(handle).encode()

    def nvmlDeviceGetName(self, handle: Any) -> Any:
        return super().nvmlDeviceGetName(handle).encode()


def test_bytes_from_older_pynvml_are_decoded() -> None:
    backend = _backend(_BytesNvml(gpus="A100-40GB"))
    (gpu,) = backend.gpus()
    assert gpu.product_name == "NVIDIA A100-SXM4-40GB"
    made = backend.create_slice(gpu_index=0, profile="1g.5gb", start=0)
    assert made.mig_uuid is not None
    assert made.mig_uuid.startswith("MIG-")


# -- the fake answers as NVML does ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "size", "code"),
    [(1, 2, api.NVML_ERROR_INVALID_ARGUMENT), (0, 1, api.NVML_ERROR_INVALID_ARGUMENT)],
    ids=["start-not-allowed", "wrong-size"],
)
def test_fake_refuses_bad_placements_as_invalid_arguments(start: int, size: int, code: int) -> None:
    fake = FakeNvml(gpus="A100-40GB")
    fake.nvmlInit()
    device = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(FakeNvmlError) as caught:
        fake.nvmlDeviceCreateGpuInstanceWithPlacement(
            device, 15, fake.c_nvmlGpuInstancePlacement_t(start=start, size=size)
        )
    assert caught.value.value == code


def test_fake_needs_init_and_refuses_destroying_a_gi_with_cis() -> None:
    fake = FakeNvml(gpus="A100-40GB")
    with pytest.raises(FakeNvmlError) as caught:
        fake.nvmlDeviceGetCount()
    assert caught.value.value == api.NVML_ERROR_UNINITIALIZED
    fake.nvmlInit()
    device = fake.nvmlDeviceGetHandleByIndex(0)
    gi = fake.nvmlDeviceCreateGpuInstanceWithPlacement(
        device, 0, fake.c_nvmlGpuInstancePlacement_t(start=0, size=8)
    )
    fake.nvmlGpuInstanceCreateComputeInstance(gi, 4)
    with pytest.raises(FakeNvmlError) as in_use:
        fake.nvmlGpuInstanceDestroy(gi)
    assert in_use.value.value == api.NVML_ERROR_IN_USE
    with pytest.raises(FakeNvmlError) as full:
        fake.nvmlGpuInstanceCreateComputeInstance(gi, 0)
    assert full.value.value == api.NVML_ERROR_INSUFFICIENT_RESOURCES
    with pytest.raises(FakeNvmlError) as missing:
        fake.nvmlDeviceGetGpuInstanceById(device, 5)
    assert missing.value.value == api.NVML_ERROR_NOT_FOUND


def test_slice_usage_reads_the_mig_device_by_its_uuid_and_utilization_where_supported() -> None:
    fake = FakeNvml(gpus="A100-40GB")
    backend = _backend(fake)
    try:
        made = backend.create_slice(gpu_index=0, profile="3g.20gb", start=0)
        assert made.mig_uuid is not None
        fake.set_mig_usage(made.mig_uuid, memory_used=5 * 1024**3, utilization=(37, 12))
        fake.calls.clear()
        usage = backend.slice_usage(mig_uuid=made.mig_uuid)
        assert usage == SliceUsage(
            memory_used_bytes=5 * 1024**3,
            memory_total_bytes=CATALOG["A100-40GB"].profile("3g.20gb").memory_bytes,
            gpu_utilization_percent=37,
            memory_utilization_percent=12,
        )
        assert fake.calls == [
            "nvmlDeviceGetHandleByUUID",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetUtilizationRates",
        ]
        fake.set_mig_usage(made.mig_uuid, memory_used=1024)
        usage = backend.slice_usage(mig_uuid=made.mig_uuid)
        assert (usage.memory_used_bytes, usage.gpu_utilization_percent) == (1024, None)
    finally:
        backend.close()


@pytest.mark.parametrize(
    "function",
    ["nvmlDeviceGetHandleByUUID", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates"],
)
def test_a_failed_usage_query_is_a_backend_error_with_nvmls_code(function: str) -> None:
    fake = FakeNvml(gpus="A100-40GB")
    backend = _backend(fake)
    try:
        made = backend.create_slice(gpu_index=0, profile="1g.5gb", start=0)
        assert made.mig_uuid is not None
        fake.fail(function, code=api.NVML_ERROR_GPU_IS_LOST)
        with pytest.raises(NvmlCallError, match=function) as caught:
            backend.slice_usage(mig_uuid=made.mig_uuid)
        assert caught.value.code == api.NVML_ERROR_GPU_IS_LOST
        assert not isinstance(caught.value, NotFoundError)
    finally:
        backend.close()
