"""Prometheus metrics of the kubelet plugin, on a registry of its own (no process-global state).

Per-claim counts and latencies of prepare and unprepare (``result`` = ``ok`` or ``error``), the RPC
latency the kubelet sees, and the MIG slices in use by GPU and profile (from the checkpoint, so it
is right after a restart too); the GPUs by health, as the last inventory poll found them.
"""

from collections.abc import Mapping
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

NAMESPACE: Final = "instaslice_kubelet_plugin"
_LATENCY_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 45.0,
)  # fmt: skip


class PluginMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self._claims = Counter(
            "claim_operations",
            "Claims prepared or unprepared, by operation and result.",
            ["operation", "result"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self._claim_seconds = Histogram(
            "claim_operation_seconds",
            "Time to prepare or unprepare one claim.",
            ["operation"],
            namespace=NAMESPACE,
            registry=self.registry,
            buckets=_LATENCY_BUCKETS,
        )
        self._rpc_seconds = Histogram(
            "rpc_seconds",
            "Time to answer one kubelet DRA call.",
            ["method"],
            namespace=NAMESPACE,
            registry=self.registry,
            buckets=_LATENCY_BUCKETS,
        )
        self._slices = Gauge(
            "slices_in_use",
            "MIG slices of prepared claims, by GPU index and profile.",
            ["gpu", "profile"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self._recovered = Counter(
            "recovery_actions",
            "Actions of start-up recovery (orphan instances destroyed, claims rolled back, ...).",
            ["action"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self._published = Gauge(
            "published_devices",
            "Devices in this node's published ResourceSlices.",
            namespace=NAMESPACE,
            registry=self.registry,
        )

        self._gpus = Gauge(
            "gpus",
            "GPUs of this node by health (unhealthy ones have their devices withdrawn).",
            ["health"],
            namespace=NAMESPACE,
            registry=self.registry,
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

    def set_published_devices(self, count: int) -> None:
        self._published.set(count)

    def set_gpu_health(self, *, healthy: int, unhealthy: int) -> None:
        self._gpus.labels(health="healthy").set(healthy)
        self._gpus.labels(health="unhealthy").set(unhealthy)

    def render(self) -> bytes:
        """The text exposition format of every metric."""
        return generate_latest(self.registry)
