"""GPUs made unhealthy by XID critical errors: a thread waits for the backend's XID events.

A critical XID (``health_settings.XidPolicy``) marks its GPU — the whole GPU, also when the event
names one MIG instance: the errors that count (ECC, row remapping, fallen off the bus, NVLink,
GSP) are about the hardware under every slice — until the plugin restarts, as NVIDIA's device
plugin does: such a GPU needs an administrator (a reset, or draining and replacing it), and
nothing NVML answers afterwards proves it healthy. Marks are kept by GPU UUID.

``apply`` overlays the marks on what the backend reports (``GpuInfo.healthy`` False, the XID in
``health_reason`` and ``health_code`` ``Xid<n>``); a GPU already unhealthy for another reason keeps
that reason first. Each new mark calls ``on_change`` (the publisher republishes at once).
"""

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from driver.daemon.wakeable import WakeableThread
from driver.errors import DriverError
from driver.gpu.backend import GpuBackend, GpuInfo, XidEvent
from kubeletplugin.health.settings import XidPolicy

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class XidMark:
    xid: int
    gpu_index: int
    gi_id: int | None

    @property
    def code(self) -> str:
        return f"Xid{self.xid}"

    @property
    def reason(self) -> str:
        where = f" on GPU instance {self.gi_id}" if self.gi_id is not None else ""
        return f"XID {self.xid} critical error{where} (reset the GPU and restart the plugin)"


class XidHealth:
    def __init__(
        self,
        *,
        backend: GpuBackend,
        policy: XidPolicy,
        on_change: Callable[[], None] | None = None,
        wait_seconds: float = 1.0,
        retry_seconds: float = 5.0,
    ) -> None:
        self._backend = backend
        self._policy = policy
        self._on_change = on_change
        self._wait_seconds = wait_seconds
        self._retry_seconds = retry_seconds
        self._lock = threading.Lock()
        self._marks: dict[str, XidMark] = {}
        self._thread = WakeableThread(self._run, name="xid-health")

    @property
    def marks(self) -> dict[str, XidMark]:
        """GPU UUID → the first critical XID it reported."""
        with self._lock:
            return dict(self._marks)

    def record(self, event: XidEvent) -> bool:
        """Take one event into account; True if it made a GPU unhealthy that was not marked."""
        if not self._policy.is_critical(event.xid):
            logger.info(
                "GPU %s reported XID %s, which is not critical (%s)",
                event.gpu_index,
                event.xid,
                self._policy.describe(),
                extra={"gpu": event.gpu_index},
            )
            return False
        with self._lock:
            if event.gpu_uuid in self._marks:
                return False
            self._marks[event.gpu_uuid] = XidMark(
                xid=event.xid, gpu_index=event.gpu_index, gi_id=event.gi_id
            )
        logger.warning(
            "GPU %s (%s) reported critical XID %s; its devices are tainted until the plugin restarts",
            event.gpu_index,
            event.gpu_uuid,
            event.xid,
            extra={"gpu": event.gpu_index},
        )
        if self._on_change is not None:
            self._on_change()
        return True

    def apply(self, gpus: Iterable[GpuInfo]) -> tuple[GpuInfo, ...]:
        """``gpus`` with the XID marks: a marked GPU is unhealthy."""
        marks = self.marks
        result = []
        for gpu in gpus:
            mark = marks.get(gpu.uuid)
            if mark is None:
                result.append(gpu)
            elif gpu.healthy:
                result.append(
                    replace(gpu, healthy=False, health_reason=mark.reason, health_code=mark.code)
                )
            else:
                reason = f"{gpu.health_reason or 'unhealthy'}; {mark.reason}"
                result.append(replace(gpu, health_reason=reason))
        return tuple(result)

    def start(self) -> None:
        """Watch the backend's XID events in a daemon thread (none with every XID ignored)."""
        if self._policy.ignore_all and not self._policy.critical:
            logger.info("XID health checks are off (every XID ignored)")
            return
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def _run(self) -> None:
        failing = False
        while not self._thread.stopping():
            try:
                event = self._backend.next_xid_event(timeout_seconds=self._wait_seconds)
            except DriverError as exc:
                if not failing:
                    logger.warning("waiting for XID events failed (retrying): %s", exc)
                failing = True
                self._thread.sleep(self._retry_seconds)
                continue
            except Exception:
                logger.exception("waiting for XID events failed unexpectedly (retrying)")
                self._thread.sleep(self._retry_seconds)
                continue
            if failing:
                logger.info("watching XID events again")
                failing = False
            if event is not None:
                self.record(event)
