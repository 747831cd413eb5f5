"""Prometheus metrics of the controller, on a registry of its own (no process-global state).

Counters and histograms are fed by the allocator as things happen; the gauges that describe the
current state (pods waiting behind our gate, free placements per profile, leadership) are read
from the allocator when scraped, so they can never drift from it.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controller.allocation.waitreport import WaitReport

NAMESPACE: Final = "instaslice_controller"
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS: Final = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
)  # fmt: skip
_DECISION_BUCKETS: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip


class _StateCollector(Collector):
    def __init__(
        self,
        *,
        pending: Callable[[], int],
        free: Callable[[], Mapping[str, int]],
        leader: Callable[[], bool],
        holds: Callable[[], Mapping[str, int]],
    ) -> None:
        self._pending = pending
        self._free = free
        self._leader = leader
        self._holds = holds

    def collect(self) -> Iterator[Metric]:
        pending = GaugeMetricFamily(
            f"{NAMESPACE}_pending_pods",
            "Pods held by the instaslice.dev/placement gate, not placed yet.",
        )
        pending.add_metric([], self._pending())
        yield pending
        free = GaugeMetricFamily(
            f"{NAMESPACE}_free_placements",
            "Instances of each MIG profile that could still be created (each GPU counted for "
            "that profile alone).",
            labels=["profile"],
        )
        for profile, count in sorted(self._free().items()):
            free.add_metric([profile], count)
        yield free
        leader = GaugeMetricFamily(
            f"{NAMESPACE}_leader", "1 while this replica is the allocating leader."
        )
        leader.add_metric([], 1.0 if self._leader() else 0.0)
        yield leader
        holds = GaugeMetricFamily(
            f"{NAMESPACE}_active_holds",
            "Room held for waiting pods, by kind: reservation (starvation bound passed), "
            "preemption (victims being evicted), next (a pod ahead in the order, for a moment).",
            labels=["kind"],
        )
        for kind, count in sorted(self._holds().items()):
            holds.add_metric([kind], count)
        yield holds


class _WaitCollector(Collector):
    """Why pods wait, the oldest wait per profile and the stranded room, from one
    ``WaitReport`` per scrape (``controller/allocation/waitreport.py``). Only the leader's
    state knows who waits for what, so the other replicas export the families without samples
    and a ``sum`` over every replica counts each pod once."""

    def __init__(self, report: Callable[[], WaitReport], leader: Callable[[], bool]) -> None:
        self._report = report
        self._leader = leader

    def collect(self) -> Iterator[Metric]:
        report = self._report() if self._leader() else WaitReport()
        pods = GaugeMetricFamily(
            f"{NAMESPACE}_waiting_pods",
            "Pods waiting for a MIG slice, by why (no-capacity, fragmented, node-filter, "
            "reserved, preempting, quota, gated-elsewhere, unsatisfiable, invalid, hand-off, "
            "pending) and profile (mixed: it may take several; empty: not known yet).",
            labels=["reason", "profile"],
        )
        for (reason, profile), count in sorted(report.pods.items()):
            pods.add_metric([reason, profile], count)
        yield pods
        oldest = GaugeMetricFamily(
            f"{NAMESPACE}_oldest_waiting_pod_seconds",
            "Age (since creation) of the oldest pod waiting for a MIG slice, by profile.",
            labels=["profile"],
        )
        for profile, seconds in sorted(report.oldest.items()):
            oldest.add_metric([profile], seconds)
        yield oldest
        for name, documentation, values in (
            ("free_memory_slices", "Free MIG memory slices, by GPU model.", report.free_slices),
            (
                "stranded_memory_slices",
                "Free MIG memory slices on GPUs where no profile a waiting pod asks for can be "
                "placed now, by GPU model (0 while no pod waits for capacity).",
                report.stranded_slices,
            ),
        ):
            family = GaugeMetricFamily(f"{NAMESPACE}_{name}", documentation, labels=["model"])
            for model, count in sorted(values.items()):
                family.add_metric([model], count)
            yield family


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self._latency = self._histogram(
            "allocation_latency_seconds",
            "Time from a pod's creation (first seen by the controller) to its gate being lifted.",
            _LATENCY_BUCKETS,
        )
        self._decision = self._histogram(
            "decision_seconds",
            "Time the placement decision for one pod took (under the allocator's lock).",
            _DECISION_BUCKETS,
        )
        self._claims = self._counter(
            "claims_allocated",
            "Claims whose allocation this controller wrote.",
            ("kind",),
        )
        self._ungated = self._counter(
            "pods_ungated",
            "Pods whose instaslice.dev/placement gate this controller lifted.",
        )
        self._conflicts = self._counter(
            "conflicts",
            "Writes that lost a race (409) or allocations withdrawn after overlapping another.",
            ("kind",),
        )
        self._problems = self._counter(
            "placement_problems",
            "Decisions that left a pod gated, by reason.",
            ("reason",),
        )
        self._handoffs = self._counter(
            "pods_handed_off",
            "Pods handed to kube-scheduler without an allocation of ours, by why: no-capacity "
            "(waited --handoff-after), not-bound (placed, but kube-scheduler could not bind it), "
            "scheduler-mode (--allocation-mode scheduler).",
            ("reason",),
        )
        self._nominations_failed = self._counter(
            "node_nominations_failed",
            "Placed pods whose status.nominatedNodeName could not be set (a hint for "
            "kube-scheduler: they were ungated all the same).",
        )
        self._released = self._counter(
            "shadow_claims_released",
            "Shadow claims of finished classic pods whose allocation was cleared.",
        )
        self._priority_metrics()

    def _priority_metrics(self) -> None:
        """Who gets freed room: preemptions, reservations, the order, waits by priority."""
        self._preemptions = self._counter(
            "preemptions",
            "Preemptions for pods that fit nowhere, by outcome: started (victims being evicted), "
            "budget (a PodDisruptionBudget stood in the way; nothing evicted), refused (the "
            "Eviction API refused a victim), failed (an API error).",
            ("outcome",),
        )
        self._victims = self._counter(
            "preemption_victims",
            "Pods evicted through the Eviction API to make room for a higher-priority pod.",
        )
        self._reservations = self._counter(
            "reservations",
            "GPUs reserved for a pod that waited past the starvation bound.",
        )
        self._served_ahead = self._counter(
            "served_ahead",
            "Times freed room went to a waiting pod ahead in the serving order instead of the "
            "pod that asked first.",
        )
        self._wait = Histogram(
            "wait_seconds",
            "Time from a pod's first failure to fit to its placement, by priority class (the "
            "pod's spec.priorityClassName, or none).",
            ("priority_class",),
            namespace=NAMESPACE,
            registry=self.registry,
            buckets=_LATENCY_BUCKETS,
        )

    def _counter(self, name: str, documentation: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(name, documentation, labels, namespace=NAMESPACE, registry=self.registry)

    def _histogram(self, name: str, documentation: str, buckets: Sequence[float]) -> Histogram:
        return Histogram(
            name, documentation, namespace=NAMESPACE, registry=self.registry, buckets=buckets
        )

    def bind_state(
        self,
        *,
        pending: Callable[[], int],
        free: Callable[[], Mapping[str, int]],
        leader: Callable[[], bool],
        holds: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        """Register the scrape-time gauges (once)."""
        self.registry.register(
            _StateCollector(pending=pending, free=free, leader=leader, holds=holds or (lambda: {}))
        )

    def bind_wait_report(
        self, report: Callable[[], WaitReport], *, leader: Callable[[], bool]
    ) -> None:
        """Register the scrape-time wait figures (once); ``leader``: whether to report them."""
        self.registry.register(_WaitCollector(report, leader))

    def ungated(self, *, latency_seconds: float | None) -> None:
        self._ungated.inc()
        if latency_seconds is not None:
            self._latency.observe(max(0.0, latency_seconds))

    def nomination_failed(self) -> None:
        self._nominations_failed.inc()

    def decided(self, seconds: float) -> None:
        self._decision.observe(seconds)

    def claim_allocated(self, *, shadow: bool) -> None:
        self._claims.labels(kind="shadow" if shadow else "dra").inc()

    def conflict(self, kind: str) -> None:
        self._conflicts.labels(kind=kind).inc()

    def problem(self, reason: str) -> None:
        self._problems.labels(reason=reason).inc()

    def handed_off(self, reason: str) -> None:
        self._handoffs.labels(reason=reason).inc()

    def shadow_released(self) -> None:
        self._released.inc()

    def preemption(self, outcome: str, *, victims: int = 0) -> None:
        self._preemptions.labels(outcome=outcome).inc()
        if victims:
            self._victims.inc(victims)

    def reserved(self) -> None:
        self._reservations.inc()

    def served_ahead(self, count: int) -> None:
        if count:
            self._served_ahead.inc(count)

    def waited(self, *, priority_class: str, seconds: float) -> None:
        self._wait.labels(priority_class=priority_class or "none").observe(max(0.0, seconds))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


WEBHOOK_NAMESPACE: Final = "instaslice_webhook"
_ANSWER_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip
ADMISSION_DECISIONS: Final = ("gated", "protected", "allowed", "refused")
"""``gated``: the scheduling gate added (the controller places the pod); ``protected``: a new
ResourceClaim of ours given the delete-protection finalizer; ``allowed``: admitted unchanged (not
ours, or gated or protected already); ``refused``: a classic request we cannot serve."""


def admission_decision(answer: Mapping[str, object]) -> str:
    """Which of ``ADMISSION_DECISIONS`` an answering ``AdmissionReview`` carries."""
    response = answer.get("response")
    if not isinstance(response, Mapping) or response.get("allowed") is not True:
        return "refused"
    patch = response.get("patch")
    if not patch:
        return "allowed"
    try:
        protects = isinstance(patch, str) and b"/metadata/finalizers" in base64.b64decode(patch)
    except ValueError:  # binascii.Error: not ours to judge here
        protects = False
    return "protected" if protects else "gated"


class WebhookMetrics:
    """The pod webhook's own figures, as its server sees them. kube-apiserver's
    ``apiserver_admission_webhook_admission_duration_seconds`` measures the same calls from its
    side: the difference is the network, TLS and kube-apiserver's own wait for a CPU."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self._duration = Histogram(
            "request_duration_seconds",
            "Time from a webhook request's headers read to its answer written, server side.",
            namespace=WEBHOOK_NAMESPACE,
            registry=self.registry,
            buckets=_ANSWER_BUCKETS,
        )
        requests = Counter(
            "requests",
            "Webhook requests answered, by HTTP status (400: not an AdmissionReview; 500: the "
            "decision failed and kube-apiserver applied the failurePolicy).",
            ["code"],
            namespace=WEBHOOK_NAMESPACE,
            registry=self.registry,
        )
        self._requests = requests
        self._ok = requests.labels(code="200")  # the common case, without a label lookup
        admissions = Counter(
            "admissions",
            "Admissions answered, by decision: gated (a pod's scheduling gate added), "
            "protected (a claim's delete-protection finalizer added), allowed (unchanged), "
            "refused.",
            ["decision"],
            namespace=WEBHOOK_NAMESPACE,
            registry=self.registry,
        )
        self._decisions = {
            decision: admissions.labels(decision) for decision in ADMISSION_DECISIONS
        }

    def answered(self, code: int, seconds: float, answer: Mapping[str, object] | None) -> None:
        """One request answered with HTTP ``code`` after ``seconds``; ``answer`` is the
        ``AdmissionReview`` sent back (None for an error answer)."""
        self._duration.observe(max(0.0, seconds))
        (self._ok if code == 200 else self._requests.labels(code=str(code))).inc()
        if answer is not None:
            self._decisions[admission_decision(answer)].inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
