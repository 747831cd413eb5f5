"""GPU health through the ``GpuBackend`` seam: ``GpuInfo.healthy`` and ``health_reason``.

The contract part runs on every backend (see ``conftest.py``); then what only NVML has (a lost GPU,
memory-error queries and their "no information" answers, all over ``FakeNvml``) and what only the
emulated backend has (marks kept in its state file).
"""

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from driver.errors import BackendError, ConfigError, NotFoundError
from driver.gpu import nvml_api as api
from driver.gpu.backend import GpuBackend
from driver.gpu.emulated import EmulatedGpuBackend
from driver.gpu.fake_nvml import FakeNvml
from driver.gpu.nvml import NvmlCallError, NvmlGpuBackend
from tests.contract.conftest import Harness

_TAINT_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")

# -- the contract, on every backend -------------------------------------------------------------


def test_every_gpu_has_a_health_verdict_with_a_reason_when_unhealthy(
    discovery_backend: GpuBackend,
) -> None:
    """Also on a real GPU host: the health queries answer or say "no information", never raise."""
    for gpu in discovery_backend.gpus():
        assert isinstance(gpu.healthy, bool)
        assert (gpu.health_reason is None) == gpu.healthy
        assert (gpu.health_code is None) == gpu.healthy


def test_gpus_are_healthy_by_default(harness: Harness) -> None:
    gpus = harness.backend.gpus()
    assert [(g.healthy, g.health_reason) for g in gpus] == [(True, None), (True, None)]


def test_an_unhealthy_gpu_is_reported_with_a_reason_and_keeps_its_slices(harness: Harness) -> None:
    before = harness.backend.gpus()
    made = harness.backend.create_slice(gpu_index=1, profile="3g.40gb", start=0)
    harness.set_health(1, False)
    first, second = harness.backend.gpus()
    assert first == before[0]
    assert second.healthy is False
    assert second.health_reason
    assert second.health_code in ("MarkedUnhealthy", "RowRemapPending")
    assert _TAINT_VALUE.match(second.health_code)  # usable as a taint value (a label value)
    healthy_again = replace(second, healthy=True, health_reason=None, health_code=None)
    assert healthy_again == before[1]  # same GPU, same model
    assert harness.backend.instances(gpu_index=1) == (made,)  # nothing destroyed

    harness.set_health(1, True)
    assert harness.backend.gpus() == before
    assert harness.backend.instances() == (made,)


def test_another_backend_on_the_same_gpus_sees_the_health(harness: Harness) -> None:
    harness.set_health(0, False)
    other = harness.another()
    assert [g.healthy for g in other.gpus()] == [False, True]
    harness.set_health(0, True)
    assert [g.healthy for g in other.gpus()] == [True, True]


# -- NVML: a lost GPU ---------------------------------------------------------------------------


def test_a_lost_gpu_is_reported_unhealthy_as_last_seen_not_raised() -> None:
    fake = FakeNvml(gpus="2xA100-40GB")
    backend = NvmlGpuBackend(nvml=fake)
    seen = backend.gpus()
    fake.set_lost(1)
    first, lost = backend.gpus()
    assert first == seen[0]
    assert (lost.index, lost.uuid, lost.model) == (1, seen[1].uuid, seen[1].model)
    assert lost.healthy is False
    assert lost.health_reason is not None
    assert "GPU is lost" in lost.health_reason
    assert lost.health_code == "GpuLost"
    with pytest.raises(BackendError, match="GPU is lost"):  # the lost GPU's own answer
        backend.instances(gpu_index=1)
    with pytest.raises(BackendError, match="GPU is lost"):
        backend.create_slice(gpu_index=1, profile="1g.5gb", start=0)
    fake.set_lost(1, lost=False)
    assert backend.gpus() == seen
    backend.close()


def test_a_gpu_lost_before_it_was_ever_read_gets_a_placeholder_identity() -> None:
    fake = FakeNvml(gpus="2xA100-40GB")
    fake.set_lost(0)
    backend = NvmlGpuBackend(nvml=fake)
    lost, fine = backend.gpus()
    assert (lost.index, lost.uuid, lost.healthy, lost.model, lost.mig_enabled) == (
        0,
        "GPU-unknown-0",
        False,
        None,
        False,
    )
    assert lost.health_reason is not None
    assert "GPU is lost" in lost.health_reason
    assert lost.health_code == "GpuLost"
    assert fine.healthy
    backend.close()


@pytest.mark.parametrize(
    ("function", "code", "healthy"),
    [
        ("nvmlDeviceGetHandleByIndex", api.NVML_ERROR_GPU_IS_LOST, False),
        ("nvmlDeviceGetUUID", api.NVML_ERROR_UNKNOWN, False),
        ("nvmlDeviceGetMemoryInfo", api.NVML_ERROR_GPU_IS_LOST, False),
        ("nvmlDeviceGetRemappedRows", api.NVML_ERROR_GPU_IS_LOST, False),
        ("nvmlDeviceGetRetiredPagesPendingStatus", api.NVML_ERROR_UNKNOWN, False),
        ("nvmlDeviceGetRemappedRows", api.NVML_ERROR_NOT_SUPPORTED, True),
        ("nvmlDeviceGetRemappedRows", api.NVML_ERROR_FUNCTION_NOT_FOUND, True),
        ("nvmlDeviceGetRemappedRows", api.NVML_ERROR_NO_PERMISSION, True),
    ],
    ids=["handle-lost", "uuid-unknown", "memory-info-lost", "rows-lost", "pages-unknown",
         "rows-not-supported", "rows-function-not-found", "rows-no-permission"],
)  # fmt: skip
def test_which_query_failures_make_a_gpu_unhealthy(function: str, code: int, healthy: bool) -> None:
    fake = FakeNvml(gpus="A100-40GB")
    backend = NvmlGpuBackend(nvml=fake)
    fake.fail(function, code=code)
    (gpu,) = backend.gpus()
    assert gpu.healthy is healthy
    assert (gpu.health_reason is None) is healthy
    (again,) = backend.gpus()  # one failed answer, then the GPU answers again
    assert again.healthy
    backend.close()


def test_other_failures_of_a_query_that_must_work_still_raise() -> None:
    fake = FakeNvml(gpus="A100-40GB")
    backend = NvmlGpuBackend(nvml=fake)
    fake.fail("nvmlDeviceGetName", code=api.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(NvmlCallError) as caught:
        backend.gpus()
    assert caught.value.code == api.NVML_ERROR_NO_PERMISSION
    backend.close()


# -- NVML: memory errors pending a reset -------------------------------------------------------


@pytest.mark.parametrize(
    ("pages_pending", "rows_pending", "rows_failure", "reason"),
    [
        (None, False, False, None),
        (False, False, False, None),
        (True, False, False, "retired memory pages are pending a GPU reset"),
        (None, True, False, "remapped memory rows are pending a GPU reset"),
        (None, False, True, "remapping a faulty memory row failed"),
        (True, True, True, "retired memory pages are pending a GPU reset; remapping a faulty "
         "memory row failed; remapped memory rows are pending a GPU reset"),
    ],
    ids=["pages-not-supported", "nothing-pending", "pages-pending", "rows-pending", "rows-failed",
         "everything"],
)  # fmt: skip
def test_memory_errors_pending_a_reset_make_a_gpu_unhealthy(
    pages_pending: bool | None, rows_pending: bool, rows_failure: bool, reason: str | None
) -> None:
    fake = FakeNvml(gpus="2xH100-80GB")
    fake.set_retired_pages_pending(1, pending=pages_pending)
    fake.set_remapped_rows(1, pending=rows_pending, failure=rows_failure)
    backend = NvmlGpuBackend(nvml=fake)
    fine, checked = backend.gpus()
    assert (fine.healthy, fine.health_reason) == (True, None)
    assert (checked.healthy, checked.health_reason) == (reason is None, reason)
    assert checked.model is not None  # still a MIG GPU with its profiles
    backend.close()


@pytest.mark.parametrize(
    ("pages_pending", "rows_pending", "rows_failure", "code"),
    [
        (True, False, False, "RetiredPagesPending"),
        (None, True, False, "RowRemapPending"),
        (True, True, False, "RowRemapPending"),
        (True, True, True, "RowRemapFailure"),
    ],
    ids=["pages", "rows-pending", "rows-pending-and-pages", "rows-failed-and-everything"],
)
def test_the_gravest_memory_error_gives_the_health_code(
    pages_pending: bool | None, rows_pending: bool, rows_failure: bool, code: str
) -> None:
    fake = FakeNvml(gpus="H100-80GB")
    fake.set_retired_pages_pending(0, pending=pages_pending)
    fake.set_remapped_rows(0, pending=rows_pending, failure=rows_failure)
    backend = NvmlGpuBackend(nvml=fake)
    (gpu,) = backend.gpus()
    assert (gpu.healthy, gpu.health_code) == (False, code)
    backend.close()


class _OldPynvml(FakeNvml):
    """A pynvml release without the memory-error functions."""

    def __getattribute__(self, name: str) -> Any:
        if name in ("nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows"):
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_a_pynvml_without_the_memory_error_functions_means_no_information() -> None:
    fake = _OldPynvml(gpus="A100-40GB")
    fake.set_remapped_rows(0, pending=True, failure=True)
    backend = NvmlGpuBackend(nvml=fake)
    (gpu,) = backend.gpus()
    assert (gpu.healthy, gpu.health_reason) == (True, None)
    assert "nvmlDeviceGetRemappedRows" not in fake.calls
    backend.close()


# -- emulated: marks in the state ---------------------------------------------------------------


def test_health_marks_are_kept_in_the_state_file_only_while_set(tmp_path: Path) -> None:
    state = tmp_path / "gpus.json"
    backend = EmulatedGpuBackend(node_name="n", spec="2xA100-40GB", state_file=state)
    backend.set_health(1, healthy=False, reason="XID 79: fell off the bus")
    made = backend.create_slice(gpu_index=0, profile="1g.5gb", start=0)  # marks survive saves
    document = json.loads(state.read_text())
    assert document["unhealthy"] == {"1": "XID 79: fell off the bus"}
    assert len(document["instances"]) == 1
    other = EmulatedGpuBackend(node_name="n", spec="2xA100-40GB", state_file=state)
    assert [(g.healthy, g.health_reason) for g in other.gpus()] == [
        (True, None),
        (False, "XID 79: fell off the bus"),
    ]
    other.set_health(1, healthy=True)
    assert "unhealthy" not in json.loads(state.read_text())
    assert all(g.healthy for g in backend.gpus())
    assert backend.instances() == (made,)


@pytest.mark.parametrize("reason", [None, "", "   "], ids=["none", "empty", "blank"])
def test_a_mark_without_a_reason_says_it_was_marked(reason: str | None) -> None:
    backend = EmulatedGpuBackend(node_name="n", spec="A100-40GB")
    backend.set_health(0, healthy=False, reason=reason)
    (gpu,) = backend.gpus()
    assert (gpu.healthy, gpu.health_reason) == (False, "marked unhealthy")


def test_marking_an_unknown_gpu_is_not_found() -> None:
    backend = EmulatedGpuBackend(node_name="n", spec="A100-40GB")
    with pytest.raises(NotFoundError, match="GPU index 3"):
        backend.set_health(3, healthy=False)
    backend.close()
    with pytest.raises(BackendError, match="closed"):
        backend.set_health(0, healthy=False)


@pytest.mark.parametrize(
    ("unhealthy", "named"),
    [
        ('["1"]', "must be an object"),
        ('{"2": "x"}', "GPU '2'"),
        ('{"-1": "x"}', "GPU '-1'"),
        ('{"one": "x"}', "corrupt"),
        ('{"0": ""}', "non-empty string"),
        ('{"0": 5}', "non-empty string"),
    ],
    ids=["not-an-object", "unknown-gpu", "negative-gpu", "not-an-index", "empty-reason",
         "reason-not-text"],
)  # fmt: skip
def test_bad_health_marks_in_the_state_file_are_a_config_error(
    tmp_path: Path, unhealthy: str, named: str
) -> None:
    state = tmp_path / "gpus.json"
    state.write_text(
        '{"version": 1, "node": "n", "gpus": ["A100-40GB", "A100-40GB"], "instances": [], '
        f'"unhealthy": {unhealthy}}}'
    )
    with pytest.raises(ConfigError, match=named) as caught:
        EmulatedGpuBackend(node_name="n", spec="2xA100-40GB", state_file=state)
    assert str(state) in str(caught.value)
