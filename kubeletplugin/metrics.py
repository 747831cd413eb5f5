"""Prometheus metrics of the kubelet plugin, on a registry of its own (no process-global state).

Per-claim counts and latencies of prepare and unprepare (``result`` = ``ok`` or ``error``), the RPC
latency the kubelet sees, and the MIG slices in use by GPU and profile (from the checkpoint, so it
is right after a restart too); the GPUs by health, as the last inventory poll found them; how long
slices lived, by profile, observed when they are released.
"""

from collections.abc import Mapping, Sequence
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from api.checkpoint import PreparedClaim, slice_ages

NAMESPACE: Final = "instaslice_kubelet_plugin"
_LATENCY_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 45.0,
)  # fmt: skip
_LIFETIME_BUCKETS: Final = (
    60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0, 172800.0, 604800.0,
    2592000.0,
)  # fmt: skip
"""A minute to 30 days: slices live as long as their pods, from test jobs to services."""


class PluginMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self._claims = self._counter(
            "claim_operations",
            "Claims prepared or unprepared, by operation and result.",
            ("operation", "result"),
        )
        self._claim_seconds = self._histogram(
            "claim_operation_seconds",
            "Time to prepare or unprepare one claim.",
            ("operation",),
            buckets=_LATENCY_BUCKETS,
        )
        self._rpc_seconds = self._histogram(
            "rpc_seconds", "Time to answer one kubelet DRA call.", ("method",), _LATENCY_BUCKETS
        )
        self._slices = self._gauge(
            "slices_in_use",
            "MIG slices of prepared claims, by GPU index and profile.",
            ("gpu", "profile"),
        )
        self._recovered = self._counter(
            "recovery_actions",
            "Actions of start-up recovery (orphan instances destroyed, claims rolled back, ...).",
            ("action",),
        )
        self._published = self._gauge(
            "published_devices", "Devices in this node's published ResourceSlices."
        )
        self._gpus = self._gauge(
            "gpus",
            "GPUs of this node by health (unhealthy ones have their devices withdrawn).",
            ("health",),
        )
        self._lifetime = self._histogram(
            "slice_lifetime_seconds",
            "Time from a slice's creation to its destruction, by profile (slices of claims "
            "released by this process).",
            ("profile",),
            buckets=_LIFETIME_BUCKETS,
        )

    def _counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, documentation, labels, namespace=NAMESPACE, registry=self.registry)

    def _gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, documentation, labels, namespace=NAMESPACE, registry=self.registry)

    def _histogram(
        self, name: str, documentation: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> Histogram:
        return Histogram(
            name,
            documentation,
            labels,
            namespace=NAMESPACE,
            registry=self.registry,
            buckets=buckets,
        )

    def claim_done(self, *, operation: str, seconds: float, ok: bool) -> None:
        self._claims.labels(operation=operation, result="ok" if ok else "error").inc()
        self._claim_seconds.labels(operation=operation).observe(seconds)

    def rpc_done(self, *, method: str, seconds: float) -> None:
        self._rpc_seconds.labels(method=method).observe(seconds)

    def set_slices_in_use(self, counts: Mapping[tuple[int, str], int]) -> None:
        """Replace the gauge's series with ``{(gpu index, profile): slices}``."""
        self._slices.clear()
        for (gpu, profile), count in sorted(counts.items()):
            self._slices.labels(gpu=str(gpu), profile=profile).set(count)

    def recovery_action(self, action: str, count: int = 1) -> None:
        if count:
            self._recovered.labels(action=action).inc(count)

    def slices_released(self, entry: PreparedClaim, *, at: float) -> None:
        """The claim's slices were destroyed at Unix time ``at``: observe their lifetimes (none
        for a claim never completed, or of unknown age)."""
        for profile, seconds in slice_ages(entry, at=at):
            self._lifetime.labels(profile=profile).observe(seconds)

    def set_published_devices(self, count: int) -> None:
        self._published.set(count)

    def set_gpu_health(self, *, healthy: int, unhealthy: int) -> None:
        self._gpus.labels(health="healthy").set(healthy)
        self._gpus.labels(health="unhealthy").set(unhealthy)

    def render(self) -> bytes:
        """The text exposition format of every metric."""
        return generate_latest(self.registry)
