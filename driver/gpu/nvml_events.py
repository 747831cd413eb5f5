"""XID critical-error events through NVML's event API, for the NVML backend's ``next_xid_event``.

As NVIDIA's device plugin does (``internal/rm/health.go``): one event set
(``nvmlEventSetCreate``), every GPU registered for ``nvmlEventTypeXidCriticalError`` (masked by
``nvmlDeviceGetSupportedEventTypes``; a GPU that supports none is logged and left out), then
``nvmlEventSetWait_v2`` with a timeout; ``NVML_ERROR_TIMEOUT`` means no event. Events of other types
are skipped. Registration is done on the first wait, so events before it are not seen (NVML keeps
none for an event set that does not exist yet). The event's device handle is mapped back to the GPU
by its UUID. pynvml-free: the library is the injected ``NvmlLibrary``.
"""

import logging
import threading
import time
from typing import Any

from driver.gpu import nvml_api as api
from driver.gpu.backend import XidEvent
from driver.gpu.nvml_call import NvmlCallError, call_nvml
from driver.ids import GpuUuid

log = logging.getLogger(__name__)


class NvmlXidWatcher:
    """Owns one NVML event set; ``next_event`` is called from one thread at a time."""

    def __init__(self, *, nvml: api.NvmlLibrary) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()
        self._event_set: Any = None
        self._index_by_uuid: dict[str, int] = {}
        self._nothing_to_watch = False
        self._closed = False

    def next_event(self, *, timeout_seconds: float) -> XidEvent | None:
        """The next XID critical-error event within ``timeout_seconds``; ``None`` if none came."""
        deadline = time.monotonic() + max(timeout_seconds, 0.0)
        event_set = self._event_set_or_create()
        if event_set is None:  # no GPU can report events: wait out the timeout like NVML would
            time.sleep(max(deadline - time.monotonic(), 0.0))
            return None
        while True:
            remaining_ms = max(int((deadline - time.monotonic()) * 1000), 0)
            try:
                data = call_nvml(
                    self._nvml,
                    "nvmlEventSetWait_v2",
                    self._nvml.nvmlEventSetWait_v2,
                    event_set,
                    remaining_ms,
                )
            except NvmlCallError as exc:
                if exc.code == api.NVML_ERROR_TIMEOUT:
                    return None
                raise
            if int(data.eventType) & api.NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
                return self._event(data)
            log.debug("skipping NVML event of type %#x", int(data.eventType))
            if remaining_ms == 0:
                return None

    def close(self) -> None:
        """Free the event set (before ``nvmlShutdown``)."""
        with self._lock:
            event_set, self._event_set = self._event_set, None
            self._closed = True
        if event_set is not None:
            try:
                call_nvml(self._nvml, "nvmlEventSetFree", self._nvml.nvmlEventSetFree, event_set)
            except NvmlCallError as exc:
                log.warning("freeing the NVML event set failed: %s", exc)

    def _event_set_or_create(self) -> Any:
        with self._lock:
            if self._closed:
                raise NvmlCallError("the NVML XID watcher is closed", code=None)
            if self._event_set is not None or self._nothing_to_watch:
                return self._event_set
            event_set = call_nvml(self._nvml, "nvmlEventSetCreate", self._nvml.nvmlEventSetCreate)
            registered = self._register_all(event_set)
            if not registered:
                call_nvml(self._nvml, "nvmlEventSetFree", self._nvml.nvmlEventSetFree, event_set)
                self._nothing_to_watch = True
                log.warning("no GPU reports XID events; XID health checks are off on this node")
                return None
            self._event_set = event_set
            log.info("watching XID critical errors of GPUs %s", ", ".join(map(str, registered)))
            return event_set

    def _register_all(self, event_set: Any) -> list[int]:
        count = int(call_nvml(self._nvml, "nvmlDeviceGetCount", self._nvml.nvmlDeviceGetCount))
        registered: list[int] = []
        for index in range(count):
            try:
                handle = call_nvml(
                    self._nvml,
                    "nvmlDeviceGetHandleByIndex",
                    self._nvml.nvmlDeviceGetHandleByIndex,
                    index,
                )
                uuid = _text(
                    call_nvml(self._nvml, "nvmlDeviceGetUUID", self._nvml.nvmlDeviceGetUUID, handle)
                )
                supported = int(
                    call_nvml(
                        self._nvml,
                        "nvmlDeviceGetSupportedEventTypes",
                        self._nvml.nvmlDeviceGetSupportedEventTypes,
                        handle,
                    )
                )
                if not supported & api.NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
                    log.warning("GPU %s does not report XID critical errors; not watched", index)
                    continue
                call_nvml(
                    self._nvml,
                    "nvmlDeviceRegisterEvents",
                    self._nvml.nvmlDeviceRegisterEvents,
                    handle,
                    api.NVML_EVENT_TYPE_XID_CRITICAL_ERROR,
                    event_set,
                )
            except NvmlCallError as exc:
                # a lost GPU is reported by the health probes of gpus(); others are still watched
                log.warning("cannot watch XID events of GPU %s: %s", index, exc)
                continue
            self._index_by_uuid[uuid] = index
            registered.append(index)
        return registered

    def _event(self, data: Any) -> XidEvent:
        uuid = _text(
            call_nvml(self._nvml, "nvmlDeviceGetUUID", self._nvml.nvmlDeviceGetUUID, data.device)
        )
        index = self._index_by_uuid.get(uuid)
        if index is None:
            raise NvmlCallError(f"XID event for GPU {uuid}, which is not watched", code=None)
        return XidEvent(
            gpu_index=index,
            gpu_uuid=GpuUuid(uuid),
            xid=int(data.eventData),
            gi_id=_instance_id(data.gpuInstanceId),
            ci_id=_instance_id(data.computeInstanceId),
        )


def _instance_id(value: Any) -> int | None:
    number = int(value)
    return None if number == api.NVML_NO_INSTANCE_ID else number


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
