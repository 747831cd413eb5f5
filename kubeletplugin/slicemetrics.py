"""Per-slice series of the kubelet plugin, read at scrape time from the checkpoint (docs/design.md D9).

- ``slice_info`` — 1 per slice that exists on the node: its GPU, GPU instance, compute instance,
  MIG UUID, placement, claim and pod, and whether a DRA claim or a classic pod (through its shadow
  claim) holds it. It carries dcgm-exporter's own labels for the same MIG device as well (F28:
  ``UUID`` — the parent GPU's —, ``GPU_I_ID``, ``GPU_I_PROFILE``), so
  ``DCGM_FI_DEV_FB_USED * on(UUID, GPU_I_ID) group_left(pod_namespace, pod_name) slice_info``
  attributes the exporter's figures to pods without relabelling. The pods of a claim shared by
  several are listed in one series, comma-separated, so the join stays one-to-one.
- ``slice_memory_used_bytes``, ``slice_memory_total_bytes`` and, where the GPU reports them per
  MIG device, ``slice_gpu_utilization_ratio`` and ``slice_memory_utilization_ratio``; labelled
  ``node``, ``gpu``, ``mig_uuid`` (``sliceusage`` reads them, cached, failures counted in
  ``slice_usage_errors_total``).
- ``slice_seconds_total{claim_namespace, profile}`` — slice-seconds for chargeback: the released
  slices' seconds the checkpoint keeps plus the live slices' ages. A pure function of the
  checkpoint and the clock, so it needs no bookkeeping here and survives restarts; a wall clock
  set back is the one thing that could lower it, and it is held at its highest value instead.

Nothing is cached but usage: every series follows the checkpoint, which is what exists (D3), so a
slice's series appear with its completed prepare and disappear with its unprepare.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from api.checkpoint import Checkpoint, PreparedClaim, PreparedDevice, PrepareState, slice_ages
from driver.errors import DriverError
from driver.gpu.backend import SliceUsage
from driver.ids import MigUuid
from kubeletplugin.metrics import NAMESPACE
from kubeletplugin.sliceusage import SliceUsageCache

logger = logging.getLogger(__name__)

INFO_LABELS: Final = (
    "node",
    "gpu",
    "gpu_uuid",
    "UUID",
    "mig_uuid",
    "gpu_instance_id",
    "GPU_I_ID",
    "compute_instance_id",
    "profile",
    "GPU_I_PROFILE",
    "placement_start",
    "claim_namespace",
    "claim_name",
    "claim_uid",
    "pod_namespace",
    "pod_name",
    "pod_uid",
    "kind",
)
"""``slice_info``'s labels; the upper-case ones are dcgm-exporter's names (F28)."""
USAGE_LABELS: Final = ("node", "gpu", "mig_uuid")
SECONDS_LABELS: Final = ("claim_namespace", "profile")
KIND_DRA: Final = "dra"
KIND_CLASSIC: Final = "classic"


@dataclass(frozen=True, slots=True)
class Holder:
    """Who a slice serves: the pods of its claim (names and UIDs comma-separated when several)."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class LiveSlice:
    """One slice that exists, and whom it serves."""

    device: PreparedDevice
    mig_uuid: MigUuid
    claim: PreparedClaim
    holder: Holder

    @property
    def kind(self) -> str:
        return KIND_CLASSIC if self.claim.shim is not None else KIND_DRA


def holder(claim: PreparedClaim) -> Holder:
    """For a classic pod, the container the kubelet shows holding the slices once known (it may
    be another pod than the one the shadow claim was made for); else the claim's pods."""
    shim = claim.shim
    if shim is not None and shim.pod_uid:
        names = [p.name for p in claim.pods if p.uid == shim.pod_uid]
        return Holder(
            namespace=shim.pod_namespace or claim.namespace,
            name=shim.pod_name or (names[0] if names else ""),
            uid=shim.pod_uid,
        )
    pods = sorted(claim.pods, key=lambda p: (p.name, p.uid))
    return Holder(
        namespace=claim.namespace if pods else "",
        name=",".join(p.name for p in pods),
        uid=",".join(p.uid for p in pods),
    )


def live_slices(checkpoint: Checkpoint) -> list[LiveSlice]:
    """Every slice of a completed claim, by GPU and placement."""
    found = [
        LiveSlice(
            device=device, mig_uuid=MigUuid(device.mig_uuid), claim=claim, holder=holder(claim)
        )
        for claim in checkpoint.claims.values()
        if claim.state is PrepareState.PREPARE_COMPLETED
        for device in claim.devices
        if device.mig_uuid
    ]
    return sorted(found, key=lambda s: (s.device.gpu_index, s.device.placement_start))


def info_labels(node: str, live: LiveSlice) -> list[str]:
    """``slice_info``'s label values, in ``INFO_LABELS`` order."""
    device, claim, pod = live.device, live.claim, live.holder
    gi_id = "" if device.gi_id is None else str(device.gi_id)
    ci_id = "" if device.ci_id is None else str(device.ci_id)
    return [
        node,
        str(device.gpu_index),
        device.gpu_uuid,
        device.gpu_uuid,
        live.mig_uuid,
        gi_id,
        gi_id,
        ci_id,
        device.profile,
        device.profile,
        str(device.placement_start),
        claim.namespace,
        claim.name,
        claim.uid,
        pod.namespace,
        pod.name,
        pod.uid,
        live.kind,
    ]


class SliceCollector(Collector):
    """The per-slice series (module docstring), built from ``checkpoint()`` on every scrape."""

    def __init__(
        self,
        *,
        node_name: str,
        checkpoint: Callable[[], Checkpoint],
        usage: SliceUsageCache,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._node = node_name
        self._checkpoint = checkpoint
        self._usage = usage
        self._clock = clock
        self._lock = threading.Lock()
        self._highest: dict[tuple[str, str], float] = {}

    def describe(self) -> Iterator[Metric]:
        """The families without samples: registering must not read the checkpoint or the GPUs."""
        return iter(self._families(slices=[], usage={}, seconds={}))

    def collect(self) -> Iterator[Metric]:
        try:
            checkpoint = self._checkpoint()
        except DriverError as exc:
            logger.warning("per-slice series left out of this scrape: %s", exc)
            return iter(self._families(slices=[], usage={}, seconds={}))
        slices = live_slices(checkpoint)
        usage = self._usage.read(s.mig_uuid for s in slices)
        return iter(self._families(slices=slices, usage=usage, seconds=self._seconds(checkpoint)))

    def _seconds(self, checkpoint: Checkpoint) -> dict[tuple[str, str], float]:
        """Slice-seconds by (namespace, profile): released plus the live slices' ages, never
        below what an earlier scrape showed."""
        now = self._clock()
        totals = {(s.namespace, s.profile): s.seconds for s in checkpoint.released_slice_seconds}
        for claim in checkpoint.claims.values():
            for profile, age in slice_ages(claim, at=now):
                key = (claim.namespace, profile)
                totals[key] = totals.get(key, 0.0) + age
        with self._lock:
            for key, value in totals.items():
                self._highest[key] = max(value, self._highest.get(key, 0.0))
            return dict(self._highest)

    def _families(
        self,
        *,
        slices: Sequence[LiveSlice],
        usage: dict[MigUuid, SliceUsage],
        seconds: dict[tuple[str, str], float],
    ) -> list[Metric]:
        info = _gauge(
            "slice_info",
            "1 per MIG slice on this node: where it is, its claim and the pod it serves "
            "(labels UUID, GPU_I_ID and GPU_I_PROFILE as dcgm-exporter names them).",
            INFO_LABELS,
        )
        for live in slices:
            info.add_metric(info_labels(self._node, live), 1.0)
        counter = CounterMetricFamily(
            f"{NAMESPACE}_slice_seconds",
            "Seconds MIG slices existed, summed over slices, by claim namespace and profile.",
            labels=SECONDS_LABELS,
        )
        for (namespace, profile), value in sorted(seconds.items()):
            counter.add_metric([namespace, profile], value)
        errors = CounterMetricFamily(
            f"{NAMESPACE}_slice_usage_errors",
            "Reads of a MIG slice's usage that failed (that slice's usage series are left out).",
        )
        errors.add_metric([], self._usage.errors)
        return [info, *self._usage_families(slices, usage), counter, errors]

    def _usage_families(
        self, slices: Sequence[LiveSlice], usage: dict[MigUuid, SliceUsage]
    ) -> list[Metric]:
        used = _gauge("slice_memory_used_bytes", "Memory in use on the MIG slice.", USAGE_LABELS)
        total = _gauge("slice_memory_total_bytes", "Memory of the MIG slice.", USAGE_LABELS)
        gpu = _gauge(
            "slice_gpu_utilization_ratio",
            "Share of the last sample period a kernel ran on the MIG slice (only where the GPU "
            "reports it per MIG device).",
            USAGE_LABELS,
        )
        memory = _gauge(
            "slice_memory_utilization_ratio",
            "Share of the last sample period the MIG slice's memory was read or written (only "
            "where the GPU reports it per MIG device).",
            USAGE_LABELS,
        )
        for live in slices:
            read = usage.get(live.mig_uuid)
            if read is None:
                continue
            labels = [self._node, str(live.device.gpu_index), live.mig_uuid]
            used.add_metric(labels, read.memory_used_bytes)
            total.add_metric(labels, read.memory_total_bytes)
            if read.gpu_utilization_percent is not None:
                gpu.add_metric(labels, read.gpu_utilization_percent / 100)
            if read.memory_utilization_percent is not None:
                memory.add_metric(labels, read.memory_utilization_percent / 100)
        return [used, total, gpu, memory]


def _gauge(name: str, documentation: str, labels: Sequence[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{NAMESPACE}_{name}", documentation, labels=labels)
