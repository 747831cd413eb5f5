"""The plugin's standing on its node, read when scraped: is the kubelet's registration of it in
force, and do MIG instances exist that no prepared claim owns (a leak: it must be 0).

- ``registered`` — 1 while the kubelet's last ``NotifyRegistrationStatus`` said registered, 0
  after it said not (or before it ever called).
- ``unowned_instances`` — MIG instances on the GPUs that no checkpoint entry records. The
  checkpoint is read before and after the GPUs are listed, and an instance counts only if neither
  read records it: prepare records a claim (``PrepareStarted``, with its placements) before it
  creates the instance, so one being made is in the second read; unprepare destroys the instance
  before it drops the claim, so one being released is in the first. Listing the GPUs costs NVML
  calls: the answer is kept ``max_age`` seconds. A failed listing leaves the sample out (logged
  once until a listing works again): an unknown is not 0.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from api.checkpoint import Checkpoint
from driver.errors import DriverError
from driver.gpu.backend import MigInstance
from kubeletplugin.metrics import NAMESPACE
from kubeletplugin.state.slices import owner_of

logger = logging.getLogger(__name__)


def unowned(instances: Sequence[MigInstance], *checkpoints: Checkpoint) -> list[MigInstance]:
    """The instances no claim of any of ``checkpoints`` records."""
    return [i for i in instances if all(owner_of(c, i) is None for c in checkpoints)]


class NodeStateCollector(Collector):
    def __init__(
        self,
        *,
        registered: Callable[[], bool | None],
        instances: Callable[[], Sequence[MigInstance]],
        checkpoint: Callable[[], Checkpoint],
        max_age: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registered = registered
        self._instances = instances
        self._checkpoint = checkpoint
        self._max_age = max_age
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, int] | None = None
        self._failing = False

    def collect(self) -> Iterator[Metric]:
        registered = GaugeMetricFamily(
            f"{NAMESPACE}_registered",
            "1 while the kubelet has this plugin registered (its last NotifyRegistrationStatus).",
        )
        registered.add_metric([], 1.0 if self._registered() else 0.0)
        yield registered
        leaked = GaugeMetricFamily(
            f"{NAMESPACE}_unowned_instances",
            "MIG instances on this node's GPUs that no prepared claim owns (must be 0).",
        )
        count = self._unowned_count()
        if count is not None:
            leaked.add_metric([], count)
        yield leaked

    def _unowned_count(self) -> int | None:
        with self._lock:
            now = self._clock()
            if self._cached is not None and now - self._cached[0] < self._max_age:
                return self._cached[1]
            try:
                before = self._checkpoint()  # read around the listing: see the module docstring
                instances = self._instances()
                count = len(unowned(instances, before, self._checkpoint()))
            except DriverError as exc:
                if not self._failing:
                    logger.warning("cannot count the MIG instances without a claim: %s", exc)
                self._failing = True
                self._cached = None
                return None
            self._failing = False
            self._cached = (now, count)
            return count
