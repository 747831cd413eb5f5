"""Every pod of the churn, from creation to deletion, as a watch of its namespace saw it.

A pod *ran* once its phase was Running or Succeeded, or a container of it started. One that never
ran must say why — a condition (``PodScheduled`` False, our ``instaslice.dev/Placement``), a
status reason (``Evicted``...) or an Event about it — or be one the churn deleted before it could
(a Deployment scaled down while it waited); ``PodLedger.outcomes`` sorts them so.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from api import names
from driver.cluster.informer import Informer, ListWatch
from driver.cluster.port import EVENTS, PODS, ClusterApi, JsonObject
from localcluster.soak.workloads import KIND_LABEL, NAMESPACE, Shape, shape_of


@dataclass(slots=True)
class PodRecord:
    uid: str
    name: str
    kind: str
    shape: Shape | None
    first_seen_s: float
    node: str = ""
    ran: bool = False
    phase: str = "Pending"
    waiting_since_s: float | None = None
    """Since when it waits to be placed (gated or unbound, not being deleted); None otherwise."""
    deleted_s: float | None = None
    reasons: list[str] = field(default_factory=list)
    """Why it did not (yet) run, as the pod said: condition and status reasons, newest last."""


def _started(status: JsonObject) -> bool:
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        if "running" in state or "terminated" in state:
            return True
    return False


def _reasons(pod: JsonObject) -> list[str]:
    status = pod.get("status") or {}
    found = []
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True" and condition.get("reason"):
            found.append(f"{condition.get('type')}: {condition.get('reason')}")
    if status.get("reason"):
        found.append(f"status: {status['reason']}")
    return found


_TELLING_FIRST = (names.PLACEMENT_CONDITION, "PodScheduled", "status", "event")


def telling_reason(reasons: list[str]) -> str:
    """The reason that says most: ours, then the scheduler's, then the pod's status, then the
    newest other one (``ContainersNotReady`` and the like follow from the first ones)."""
    for source in _TELLING_FIRST:
        for reason in reversed(reasons):
            if reason.startswith(f"{source}:"):
                return reason
    return reasons[-1]


def waiting(pod: JsonObject) -> bool:
    """Gated by us or not bound to a node yet, and not being deleted."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if meta.get("deletionTimestamp"):
        return False
    gates = {g.get("name") for g in spec.get("schedulingGates") or []}
    return names.SCHEDULING_GATE in gates or not spec.get("nodeName")


class PodLedger:
    def __init__(self, *, api: ClusterApi, now: Callable[[], float]) -> None:
        self._api = api
        self._now = now
        self._lock = threading.Lock()
        self.records: dict[str, PodRecord] = {}
        self._informer = Informer(
            source=ListWatch(api, PODS, namespace=NAMESPACE), name="soak-pods"
        )
        self._informer.add_handler(on_add=self._seen, on_update=self._changed, on_delete=self._gone)

    def start(self) -> None:
        self._informer.start()
        self._informer.wait_for_sync(timeout=60)

    def stop(self) -> None:
        self._informer.stop()

    def _time(self) -> float:
        return self._now()

    def _seen(self, pod: JsonObject) -> None:
        self._record(pod)

    def _changed(self, old: JsonObject, new: JsonObject) -> None:
        self._record(new)

    def _record(self, pod: JsonObject) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        now = self._time()
        with self._lock:
            record = self.records.get(meta["uid"])
            if record is None:
                labels = meta.get("labels") or {}
                record = PodRecord(
                    uid=meta["uid"],
                    name=meta["name"],
                    kind=str(labels.get(KIND_LABEL) or "other"),
                    shape=shape_of(pod),
                    first_seen_s=now,
                )
                self.records[record.uid] = record
            record.phase = str(status.get("phase") or "Pending")
            record.node = str((pod.get("spec") or {}).get("nodeName") or record.node)
            if record.phase in ("Running", "Succeeded") or _started(status):
                record.ran = True
            if waiting(pod):
                if record.waiting_since_s is None:
                    record.waiting_since_s = now
            else:
                record.waiting_since_s = None
            for reason in _reasons(pod):
                if reason not in record.reasons:
                    record.reasons.append(reason)

    def _gone(self, pod: JsonObject) -> None:
        with self._lock:
            record = self.records.get(pod["metadata"]["uid"])
            if record is not None:
                record.deleted_s = self._time()
                record.waiting_since_s = None

    def waiting_pods(self) -> list[PodRecord]:
        with self._lock:
            return [r for r in self.records.values() if r.waiting_since_s is not None]

    def outcomes(self) -> dict[str, Counter[str]]:
        """Pods by outcome: ``ran`` (by kind), ``did not run`` (by the reason it gave). A pod
        that gave no reason is ``without a reason``: what the soak must never see."""
        events = self._event_reasons()
        ran: Counter[str] = Counter()
        not_run: Counter[str] = Counter()
        with self._lock:
            records = list(self.records.values())
        for record in records:
            if record.ran:
                ran[record.kind] += 1
                continue
            said = record.reasons or events.get(record.uid, [])
            if said:
                not_run[telling_reason(said)] += 1
            elif record.deleted_s is not None:
                not_run["deleted before it was placed (scale-down or quiesce)"] += 1
            else:
                not_run["without a reason"] += 1
        return {"ran": ran, "did not run": not_run}

    def _event_reasons(self) -> dict[str, list[str]]:
        by_pod: dict[str, list[str]] = {}
        for event in self._api.list_objects(EVENTS, namespace=NAMESPACE).items:
            involved = event.get("involvedObject") or event.get("regarding") or {}
            if involved.get("kind") == "Pod" and event.get("reason"):
                by_pod.setdefault(str(involved.get("uid")), []).append(f"event: {event['reason']}")
        return by_pod
