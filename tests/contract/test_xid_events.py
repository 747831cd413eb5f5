"""XID critical-error events through the ``GpuBackend`` seam: the same contract for both backends,
and NVML's event-API rules (registration, event types, MIG instance ids, freeing) over the fake."""

from __future__ import annotations

import threading

import pytest

from driver.errors import BackendError, NotFoundError
from driver.gpu import nvml_api
from driver.gpu.emulated import EmulatedGpuBackend
from driver.gpu.fake_nvml import FakeNvml
from driver.gpu.nvml import NvmlGpuBackend
from tests.contract.conftest import Harness

WAIT = 5.0
"""Generous upper bound for an event that was already queued (returned at once in practice)."""


def test_no_event_means_none_after_the_timeout(harness: Harness) -> None:
    assert harness.backend.next_xid_event(timeout_seconds=0.01) is None


def test_an_xid_reported_by_a_gpu_comes_back_as_an_event(harness: Harness) -> None:
    assert harness.inject_xid is not None
    backend = harness.backend
    backend.next_xid_event(timeout_seconds=0)  # watching starts with the first call (NVML's rule)
    harness.inject_xid(1, 79)
    event = backend.next_xid_event(timeout_seconds=WAIT)
    assert event is not None
    assert (event.gpu_index, event.gpu_uuid, event.xid) == (1, backend.gpus()[1].uuid, 79)
    assert event.gi_id is None
    assert backend.next_xid_event(timeout_seconds=0.01) is None  # each event once


def test_events_come_in_the_order_reported(harness: Harness) -> None:
    assert harness.inject_xid is not None
    harness.backend.next_xid_event(timeout_seconds=0)
    for gpu, xid in ((0, 48), (1, 94), (0, 31)):
        harness.inject_xid(gpu, xid)
    seen = []
    for _ in range(3):
        event = harness.backend.next_xid_event(timeout_seconds=WAIT)
        assert event is not None
        seen.append((event.gpu_index, event.xid))
    assert seen == [(0, 48), (1, 94), (0, 31)]


def test_a_waiting_caller_gets_an_event_reported_meanwhile(harness: Harness) -> None:
    assert harness.inject_xid is not None
    inject = harness.inject_xid
    harness.backend.next_xid_event(timeout_seconds=0)
    waiting = threading.Event()

    def report() -> None:
        waiting.wait()
        inject(0, 62)

    reporter = threading.Thread(target=report)
    reporter.start()
    waiting.set()
    event = harness.backend.next_xid_event(timeout_seconds=WAIT)
    reporter.join()
    assert event is not None
    assert event.xid == 62


def test_waiting_on_a_closed_backend_raises(harness: Harness) -> None:
    harness.backend.close()
    with pytest.raises(BackendError):
        harness.backend.next_xid_event(timeout_seconds=0.01)


# -- NVML's event API over the fake ------------------------------------------------------------


def test_nvml_registers_every_gpu_for_xid_events_once_and_frees_the_set_on_close() -> None:
    fake = FakeNvml(gpus="2xA100-40GB")
    backend = NvmlGpuBackend(nvml=fake)
    assert "nvmlEventSetCreate" not in fake.calls  # nothing is watched until asked
    backend.next_xid_event(timeout_seconds=0)
    backend.next_xid_event(timeout_seconds=0)
    assert fake.calls.count("nvmlEventSetCreate") == 1
    assert fake.calls.count("nvmlDeviceRegisterEvents") == 2
    backend.close()
    assert "nvmlEventSetFree" in fake.calls
    assert fake.calls.index("nvmlEventSetFree") < fake.calls.index("nvmlShutdown")


def test_nvml_misses_xids_from_before_it_watched_as_nvml_does() -> None:
    fake = FakeNvml(gpus="A100-40GB")
    backend = NvmlGpuBackend(nvml=fake)
    assert fake.inject_xid(0, 79) == 0  # no event set registered: delivered nowhere
    assert backend.next_xid_event(timeout_seconds=0.01) is None
    backend.close()


def test_nvml_event_on_a_mig_instance_names_it() -> None:
    fake = FakeNvml(gpus="A100-40GB")
    backend = NvmlGpuBackend(nvml=fake)
    backend.next_xid_event(timeout_seconds=0)
    fake.inject_xid(0, 94, gi_id=3, ci_id=0)
    event = backend.next_xid_event(timeout_seconds=WAIT)
    assert event is not None
    assert (event.xid, event.gi_id, event.ci_id) == (94, 3, 0)
    backend.close()


def test_nvml_skips_events_that_are_not_xid_critical_errors() -> None:
    fake = FakeNvml(gpus="A100-40GB")
    backend = NvmlGpuBackend(nvml=fake)
    backend.next_xid_event(timeout_seconds=0)
    # registered only for XIDs: an ECC event is not even delivered
    assert fake.inject_xid(0, 0, event_type=nvml_api.NVML_EVENT_TYPE_DOUBLE_BIT_ECC_ERROR) == 0
    assert backend.next_xid_event(timeout_seconds=0.01) is None
    backend.close()


def test_nvml_watches_the_other_gpus_when_one_is_lost() -> None:
    fake = FakeNvml(gpus="2xA100-40GB")
    backend = NvmlGpuBackend(nvml=fake)
    fake.set_lost(0)
    backend.next_xid_event(timeout_seconds=0)
    assert fake.inject_xid(0, 79) == 0
    assert fake.inject_xid(1, 48) == 1
    event = backend.next_xid_event(timeout_seconds=WAIT)
    assert event is not None
    assert (event.gpu_index, event.xid) == (1, 48)
    backend.close()


def test_nvml_wait_failure_is_a_backend_error() -> None:
    fake = FakeNvml(gpus="A100-40GB")
    backend = NvmlGpuBackend(nvml=fake)
    backend.next_xid_event(timeout_seconds=0)
    fake.fail("nvmlEventSetWait_v2", code=nvml_api.NVML_ERROR_UNKNOWN)
    with pytest.raises(BackendError, match="nvmlEventSetWait_v2"):
        backend.next_xid_event(timeout_seconds=0.01)
    backend.close()


def test_fake_nvml_refuses_unknown_event_sets_and_unsupported_types() -> None:
    fake = FakeNvml(gpus="A100-40GB")
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(fake.NVMLError) as unknown:
        fake.nvmlEventSetWait_v2(12345, 0)
    assert unknown.value.value == nvml_api.NVML_ERROR_INVALID_ARGUMENT
    event_set = fake.nvmlEventSetCreate()
    with pytest.raises(fake.NVMLError) as unsupported:
        fake.nvmlDeviceRegisterEvents(handle, 0x4, event_set)  # PState: not supported here
    assert unsupported.value.value == nvml_api.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(fake.NVMLError) as timeout:
        fake.nvmlEventSetWait_v2(event_set, 0)
    assert timeout.value.value == nvml_api.NVML_ERROR_TIMEOUT
    fake.nvmlEventSetFree(event_set)
    with pytest.raises(fake.NVMLError):
        fake.nvmlEventSetWait_v2(event_set, 0)


# -- emulated ----------------------------------------------------------------------------------


def test_emulated_refuses_an_xid_for_a_gpu_it_does_not_have() -> None:
    backend = EmulatedGpuBackend(node_name="n", spec="A100-40GB")
    with pytest.raises(NotFoundError, match="GPU index 3"):
        backend.inject_xid(3, 79)
    backend.close()


def test_emulated_close_wakes_a_waiting_caller() -> None:
    backend = EmulatedGpuBackend(node_name="n", spec="A100-40GB")
    outcome: list[object] = []

    def wait() -> None:
        try:
            outcome.append(backend.next_xid_event(timeout_seconds=60))
        except BackendError as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    backend.close()
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], BackendError)
