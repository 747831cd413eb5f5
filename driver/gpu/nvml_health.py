"""GPU health as NVML reports it, read-only: a lost GPU, retired pages and remapped rows.

Kept apart from the backend's discovery and create/destroy so each reads on its own; the library
comes through the injected ``NvmlLibrary`` (``driver.gpu.nvml`` stays the only module importing
``pynvml``).

- A GPU whose ordinary queries fail with ``GPU_IS_LOST`` or ``UNKNOWN`` is reported unhealthy (as
  last seen, or with an ``GPU-unknown-<index>`` identity if it never answered) instead of failing
  the whole list.
- Each unhealthy GPU gets a ``health_code`` (a taint value): ``GpuLost``, ``RowRemapFailure``,
  ``RowRemapPending`` or ``RetiredPagesPending`` (the gravest when several apply).
- So is one with retired pages pending a reset (``nvmlDeviceGetRetiredPagesPendingStatus``) or with
  remapped rows pending or failed (``nvmlDeviceGetRemappedRows``). Those two are skipped when pynvml
  or the driver lacks them or the GPU answers ``NOT_SUPPORTED``: no information is not bad health.
"""

import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final

from driver.gpu import nvml_api as api
from driver.gpu.backend import GpuInfo
from driver.gpu.nvml_call import NvmlCallError, call_nvml
from driver.ids import GpuUuid

log = logging.getLogger(__name__)

_LOST_CODES: Final = (api.NVML_ERROR_GPU_IS_LOST, api.NVML_ERROR_UNKNOWN)
"""Codes of a read-only query that mean the GPU itself is gone or broken."""
_NO_INFO_CODES: Final = (api.NVML_ERROR_NOT_SUPPORTED, api.NVML_ERROR_FUNCTION_NOT_FOUND)
GPU_LOST_CODE: Final = "GpuLost"
RETIRED_PAGES_PENDING_CODE: Final = "RetiredPagesPending"
ROW_REMAP_FAILURE_CODE: Final = "RowRemapFailure"
ROW_REMAP_PENDING_CODE: Final = "RowRemapPending"


class NvmlGpuHealth:
    """Reads GPUs with their health; remembers each GPU as last seen to report it once lost."""

    def __init__(self, *, nvml: api.NvmlLibrary) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()
        self._last_seen: dict[int, GpuInfo] = {}

    def gpu_and_health(
        self, index: int, *, read_gpu: Callable[[int], GpuInfo], handle: Callable[[int], Any]
    ) -> GpuInfo:
        """``read_gpu(index)`` with its health; a lost GPU is reported unhealthy, not raised."""
        try:
            gpu = read_gpu(index)
            found = self._memory_health(handle(index))
        except NvmlCallError as exc:
            if exc.code not in _LOST_CODES:
                raise
            return self._lost(index, exc)
        with self._lock:
            self._last_seen[index] = gpu
        if found is None:
            return gpu
        reason, code = found
        return replace(gpu, healthy=False, health_reason=reason, health_code=code)

    def _lost(self, index: int, exc: NvmlCallError) -> GpuInfo:
        reason = f"the GPU stopped answering: {exc}"
        log.debug("GPU %s is unhealthy: %s", index, reason)
        with self._lock:
            last = self._last_seen.get(index)
        if last is not None:
            return replace(last, healthy=False, health_reason=reason, health_code=GPU_LOST_CODE)
        return GpuInfo(
            index=index,
            uuid=GpuUuid(f"GPU-unknown-{index}"),
            product_name="unknown",
            memory_bytes=0,
            multiprocessors=0,
            mig_enabled=False,
            mig_pending=None,
            minor=None,
            model=None,
            healthy=False,
            health_reason=reason,
            health_code=GPU_LOST_CODE,
        )

    def _memory_health(self, handle: Any) -> tuple[str, str] | None:
        """Why the GPU's memory needs a reset before new slices go on it, and the code of the
        gravest reason; ``None`` if fine."""
        reasons: list[str] = []
        codes: list[str] = []
        pending_pages = self._health_query("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        if pending_pages is not None and int(pending_pages) == api.NVML_FEATURE_ENABLED:
            reasons.append("retired memory pages are pending a GPU reset")
            codes.append(RETIRED_PAGES_PENDING_CODE)
        rows = self._health_query("nvmlDeviceGetRemappedRows", handle)
        if rows is not None:
            _corrected, _uncorrected, rows_pending, rows_failed = (int(v) for v in rows)
            if rows_failed:
                reasons.append("remapping a faulty memory row failed")
                codes.insert(0, ROW_REMAP_FAILURE_CODE)
            if rows_pending:
                reasons.append("remapped memory rows are pending a GPU reset")
                codes.insert(1 if rows_failed else 0, ROW_REMAP_PENDING_CODE)
        if not reasons:
            return None
        return "; ".join(reasons), codes[0]

    def _health_query(self, name: str, handle: Any) -> Any:
        """A read-only health query, or ``None`` when pynvml, the driver or the GPU lacks it."""
        fn = getattr(self._nvml, name, None)
        if fn is None:
            return None
        try:
            return call_nvml(self._nvml, name, fn, handle)
        except NvmlCallError as exc:
            if exc.code in _LOST_CODES:
                raise
            if exc.code not in _NO_INFO_CODES:
                log.debug("health query %s gave no answer: %s", name, exc)
            return None
