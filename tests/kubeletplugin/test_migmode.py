"""``--mig-mode when-idle`` on the NVML backend over the fake NVML (NVML's pending/current rules and
an external reset) and on the emulated backend: enabled when idle, reset when pending, a busy GPU
never touched, a failed reset reported as needing one."""

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from driver.errors import BackendError
from driver.gpu import nvml_api as api
from driver.gpu.backend import MigModeBackend
from driver.gpu.emulated import EmulatedGpuBackend
from driver.gpu.fake_nvml import FakeNvml
from driver.gpu.nvml import NvmlGpuBackend
from kubeletplugin.node.migmode import (
    REASON_BUSY,
    REASON_ENABLED,
    REASON_ENABLING,
    REASON_FAILED,
    REASON_RESET_NEEDED,
    REASON_RESETTING,
    MigModeStep,
    enable_mig_when_idle,
)


@dataclass
class Gpus:
    """A backend with GPU 0 MIG on and GPU 1 MIG off, and the controls a test needs."""

    backend: MigModeBackend
    set_busy: Callable[[int, int], None]
    fail_next_reset: Callable[[], None]
    mode: Callable[[int], tuple[bool, bool]]
    """(current, pending)."""


def _nvml(*, needs_reset: bool) -> Gpus:
    fake = FakeNvml(gpus="2xA100-40GB", mig_enabled=[True, False], mig_mode_needs_reset=needs_reset)

    def reset(index: int) -> None:
        fake.reset_gpu(index)

    def busy(index: int, count: int) -> None:
        fake.set_processes(index, compute=count, graphics=0 if count == 0 else 1)

    return Gpus(
        backend=NvmlGpuBackend(nvml=fake, reset_gpu=reset),
        set_busy=busy,
        fail_next_reset=lambda: fake.fail_reset(code=api.NVML_ERROR_NO_PERMISSION),
        mode=fake.mig_mode,
    )


def _emulated(*, needs_reset: bool) -> Gpus:
    backend = EmulatedGpuBackend(
        node_name="node-a", spec="2xA100-40GB", mig_disabled=[1], mig_mode_needs_reset=needs_reset
    )

    def mode(index: int) -> tuple[bool, bool]:
        gpu = backend.gpus()[index]
        return gpu.mig_enabled, bool(gpu.mig_pending)

    return Gpus(
        backend=backend,
        set_busy=backend.set_running_processes,
        fail_next_reset=lambda: backend.fail_next_reset("Insufficient Permissions"),
        mode=mode,
    )


BACKENDS = {"nvml": _nvml, "emulated": _emulated}


def _run(gpus: Gpus) -> list[MigModeStep]:
    reported: list[MigModeStep] = []
    steps = enable_mig_when_idle(gpus.backend, report=reported.append)
    assert steps == reported
    return steps


def _reasons(steps: list[MigModeStep]) -> list[tuple[int, str, str]]:
    return [(s.gpu_index, s.event_type, s.reason) for s in steps]


@pytest.mark.parametrize("kind", BACKENDS)
def test_an_idle_gpu_needing_a_reset_is_enabled_and_reset(kind: str) -> None:
    gpus = BACKENDS[kind](needs_reset=True)
    steps = _run(gpus)
    assert _reasons(steps) == [
        (1, "Normal", REASON_ENABLING),
        (1, "Normal", REASON_RESETTING),
        (1, "Normal", REASON_ENABLED),
    ]
    assert gpus.mode(1) == (True, True)
    assert gpus.mode(0) == (True, True)
    gpu = gpus.backend.gpus()[1]
    assert gpu.model is not None
    assert gpu.model.profile("1g.5gb").name == "1g.5gb"
    assert "GPU 1 (NVIDIA A100-SXM4-40GB" in steps[0].message
    # Done is done: a second run finds nothing to do.
    assert _run(gpus) == []


@pytest.mark.parametrize("kind", BACKENDS)
def test_an_idle_gpu_that_applies_the_mode_at_once_is_not_reset(kind: str) -> None:
    gpus = BACKENDS[kind](needs_reset=False)
    assert _reasons(_run(gpus)) == [(1, "Normal", REASON_ENABLING), (1, "Normal", REASON_ENABLED)]
    assert gpus.mode(1) == (True, True)


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_busy_gpu_is_never_touched(kind: str) -> None:
    gpus = BACKENDS[kind](needs_reset=True)
    gpus.set_busy(1, 2)
    steps = _run(gpus)
    assert _reasons(steps) == [(1, "Warning", REASON_BUSY)]
    assert "processes run on the GPU" in steps[0].message
    assert gpus.mode(1) == (False, False)


def test_the_nvml_backend_never_calls_set_mig_mode_on_a_busy_gpu() -> None:
    fake = FakeNvml(gpus="1xA100-40GB", mig_enabled=False)
    fake.set_processes(0, compute=0, graphics=1)
    enable_mig_when_idle(NvmlGpuBackend(nvml=fake, reset_gpu=fake.reset_gpu), report=lambda _: None)
    assert "nvmlDeviceSetMigMode" not in fake.calls
    assert "reset_gpu" not in fake.calls
    assert "nvmlDeviceGetGraphicsRunningProcesses" in fake.calls


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_failed_reset_leaves_the_mode_pending_and_says_a_reset_is_needed(kind: str) -> None:
    gpus = BACKENDS[kind](needs_reset=True)
    gpus.fail_next_reset()
    steps = _run(gpus)
    assert _reasons(steps) == [
        (1, "Normal", REASON_ENABLING),
        (1, "Normal", REASON_RESETTING),
        (1, "Warning", REASON_RESET_NEEDED),
    ]
    assert "Insufficient Permissions" in steps[-1].message
    assert "nvidia-smi --gpu-reset -i 1" in steps[-1].message
    assert gpus.mode(1) == (False, True)
    # The next start finds the mode pending: no second set, straight to the reset.
    steps = _run(gpus)
    assert _reasons(steps) == [
        (1, "Normal", REASON_RESETTING),
        (1, "Normal", REASON_ENABLED),
    ]


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_gpu_that_becomes_busy_while_pending_is_not_reset(kind: str) -> None:
    gpus = BACKENDS[kind](needs_reset=True)
    gpus.backend.set_mig_mode(gpu_index=1, enabled=True)
    gpus.set_busy(1, 1)
    assert _reasons(_run(gpus)) == [(1, "Warning", REASON_BUSY)]
    assert gpus.mode(1) == (False, True)


def test_a_refused_mode_change_is_reported_not_raised() -> None:
    fake = FakeNvml(gpus="2xA100-40GB", mig_enabled=False)
    fake.fail("nvmlDeviceSetMigMode", code=api.NVML_ERROR_NO_PERMISSION)
    steps = enable_mig_when_idle(
        NvmlGpuBackend(nvml=fake, reset_gpu=fake.reset_gpu), report=lambda _: None
    )
    assert _reasons(steps)[0] == (0, "Warning", REASON_FAILED)
    assert "Insufficient Permissions" in steps[0].message
    # One GPU's failure does not stop the next one.
    assert _reasons(steps)[1:] == [
        (1, "Normal", REASON_ENABLING),
        (1, "Normal", REASON_RESETTING),
        (1, "Normal", REASON_ENABLED),
    ]


def test_fake_nvml_follows_nvml_pending_and_reset_rules() -> None:
    fake = FakeNvml(gpus="1xA100-40GB", mig_enabled=True)
    backend = NvmlGpuBackend(nvml=fake, reset_gpu=fake.reset_gpu)
    made = backend.create_slice(gpu_index=0, profile="1g.5gb", start=0)
    # MIG cannot be turned off while GPU instances exist.
    with pytest.raises(BackendError, match="In use"):
        backend.set_mig_mode(gpu_index=0, enabled=False)
    backend.destroy_slice(gpu_index=0, gi_id=made.gi_id)
    backend.set_mig_mode(gpu_index=0, enabled=False)
    assert fake.mig_mode(0) == (True, False)
    fake.set_processes(0, compute=1)
    with pytest.raises(BackendError, match="resetting GPU 0 failed: In use"):
        backend.reset_gpu(gpu_index=0)
    fake.set_processes(0)
    backend.create_slice(gpu_index=0, profile="1g.5gb", start=0)
    backend.reset_gpu(gpu_index=0)
    # The reset applied the pending mode, and no MIG instance outlives it.
    assert fake.mig_mode(0) == (False, False)
    assert backend.gpus()[0].model is None
    assert backend.instances() == ()


def test_emulated_reset_ends_the_gpus_instances_only() -> None:
    backend = EmulatedGpuBackend(node_name="n", spec="2xA100-40GB")
    backend.create_slice(gpu_index=0, profile="1g.5gb", start=0)
    kept = backend.create_slice(gpu_index=1, profile="1g.5gb", start=0)
    backend.reset_gpu(gpu_index=0)
    assert backend.instances() == (kept,)
