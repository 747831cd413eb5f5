"""What each live slice uses, read from the GPU backend at scrape time at a bounded cost.

A scrape asks for the usage of every live MIG device; each device's answer is kept for
``max_age_seconds``, so scrapes closer together than that (several Prometheus replicas, a person
with curl) cost the GPU nothing more, and devices that are gone are forgotten. A device the
backend cannot read (NVML failed, the GPU fell off the bus) has no usage for that read, is counted
in ``errors`` and logged when it starts failing, and never fails the scrape: the other slices'
figures and every other series still come back.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Protocol

from driver.errors import DriverError
from driver.gpu.backend import SliceUsage
from driver.ids import MigUuid

logger = logging.getLogger(__name__)

USAGE_MAX_AGE_SECONDS: Final = 10.0
"""How long one read of a device's usage is served again: below the usual scrape interval."""


class UsageSource(Protocol):
    """The one ``GpuBackend`` call this module needs."""

    def slice_usage(self, *, mig_uuid: MigUuid) -> SliceUsage: ...


@dataclass(frozen=True, slots=True)
class _Read:
    at: float
    usage: SliceUsage | None
    """None: the read failed."""


class SliceUsageCache:
    def __init__(
        self,
        *,
        source: UsageSource,
        max_age_seconds: float = USAGE_MAX_AGE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._max_age = max_age_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._reads: dict[MigUuid, _Read] = {}
        self._errors = 0

    @property
    def errors(self) -> int:
        """Reads of a device's usage that failed, since start."""
        with self._lock:
            return self._errors

    def read(self, mig_uuids: Iterable[MigUuid]) -> dict[MigUuid, SliceUsage]:
        """The usage of each of ``mig_uuids`` that could be read (at most ``max_age_seconds``
        old); devices not asked for are forgotten."""
        with self._lock:
            now = self._clock()
            reads: dict[MigUuid, _Read] = {}
            for mig_uuid in sorted(set(mig_uuids)):
                last = self._reads.get(mig_uuid)
                if last is None or now - last.at >= self._max_age:
                    last = _Read(at=now, usage=self._read_one(mig_uuid, failed_before=last))
                reads[mig_uuid] = last
            self._reads = reads
        return {mig_uuid: r.usage for mig_uuid, r in reads.items() if r.usage is not None}

    def _read_one(self, mig_uuid: MigUuid, *, failed_before: _Read | None) -> SliceUsage | None:
        try:
            return self._source.slice_usage(mig_uuid=mig_uuid)
        except Exception as exc:  # a scrape never fails for one device
            self._errors += 1
            if failed_before is None or failed_before.usage is not None:
                logger.log(
                    logging.WARNING if isinstance(exc, DriverError) else logging.ERROR,
                    "cannot read the usage of MIG device %s (its usage series are left out "
                    "while this lasts): %s",
                    mig_uuid,
                    exc,
                    extra={"mig_uuid": mig_uuid},
                    exc_info=not isinstance(exc, DriverError),
                )
            return None
