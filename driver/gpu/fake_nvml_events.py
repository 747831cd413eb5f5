"""NVML's event API for ``driver.gpu.fake_nvml``: event sets, registration, waits, injected XIDs.

It follows NVML's rules: an event is delivered only to event sets that had registered the GPU for
that event type when the event happened (earlier events are lost); a wait answers the oldest queued
event or raises ``NVML_ERROR_TIMEOUT`` after ``timeoutms``; an unknown or freed event set is
``INVALID_ARGUMENT``; registering a type the GPU does not support is ``NOT_SUPPORTED``. Answers are
``c_nvmlEventData_t`` with nvml.h's field names; ``gpuInstanceId``/``computeInstanceId`` are
``0xFFFFFFFF`` for an event not about one MIG instance.
"""
# Names below are pynvml's and nvml.h's, hence not PEP 8:
# ruff: noqa: N801

import collections
import ctypes
import threading
import time
from dataclasses import dataclass, field
from typing import Final

from driver.gpu import nvml_api as api
from driver.gpu.fake_nvml_types import FakeNvmlError

SUPPORTED_EVENT_TYPES: Final = (
    api.NVML_EVENT_TYPE_SINGLE_BIT_ECC_ERROR
    | api.NVML_EVENT_TYPE_DOUBLE_BIT_ECC_ERROR
    | api.NVML_EVENT_TYPE_XID_CRITICAL_ERROR
)
"""What the fake's GPUs support (``nvmlDeviceGetSupportedEventTypes``), as a data-center GPU does."""


class c_nvmlEventData_t(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_uint64),
        ("eventType", ctypes.c_ulonglong),
        ("eventData", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


@dataclass(frozen=True, slots=True)
class _Event:
    gpu_index: int
    event_type: int
    data: int
    gi_id: int
    ci_id: int


@dataclass
class _EventSet:
    registered: dict[int, int] = field(default_factory=dict)
    """GPU index → event-type mask."""
    queue: collections.deque[_Event] = field(default_factory=collections.deque)


class FakeEventHub:
    """The event sets of one fake library. Thread-safe; a wait blocks only its caller."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._sets: dict[int, _EventSet] = {}
        self._next_id = 1

    def create(self) -> int:
        with self._cond:
            handle = self._next_id
            self._next_id += 1
            self._sets[handle] = _EventSet()
            return handle

    def register(self, event_set: int, *, gpu_index: int, event_types: int) -> None:
        if event_types & ~SUPPORTED_EVENT_TYPES:
            raise FakeNvmlError(api.NVML_ERROR_NOT_SUPPORTED)
        with self._cond:
            registered = self._set(event_set).registered
            registered[gpu_index] = registered.get(gpu_index, 0) | event_types

    def free(self, event_set: int) -> None:
        with self._cond:
            self._set(event_set)
            del self._sets[int(event_set)]
            self._cond.notify_all()

    def post(
        self, *, gpu_index: int, event_type: int, data: int, gi_id: int | None, ci_id: int | None
    ) -> int:
        """Queue the event for every set registered for it; how many sets got it."""
        event = _Event(
            gpu_index=gpu_index,
            event_type=event_type,
            data=data,
            gi_id=api.NVML_NO_INSTANCE_ID if gi_id is None else gi_id,
            ci_id=api.NVML_NO_INSTANCE_ID if ci_id is None else ci_id,
        )
        delivered = 0
        with self._cond:
            for event_set in self._sets.values():
                if event_set.registered.get(gpu_index, 0) & event_type:
                    event_set.queue.append(event)
                    delivered += 1
            self._cond.notify_all()
        return delivered

    def wait(self, event_set: int, *, timeout_ms: int, device_handle: int) -> c_nvmlEventData_t:
        """The oldest event of ``event_set``; ``device_handle`` turns a GPU index into its handle."""
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        with self._cond:
            while True:
                queued = self._set(event_set).queue
                if queued:
                    event = queued.popleft()
                    return c_nvmlEventData_t(
                        device=device_handle | event.gpu_index,
                        eventType=event.event_type,
                        eventData=event.data,
                        gpuInstanceId=event.gi_id,
                        computeInstanceId=event.ci_id,
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise FakeNvmlError(api.NVML_ERROR_TIMEOUT)
                self._cond.wait(remaining)

    def _set(self, event_set: int) -> _EventSet:
        found = self._sets.get(int(event_set))
        if found is None:
            raise FakeNvmlError(api.NVML_ERROR_INVALID_ARGUMENT)
        return found
