"""What ``bench preemption`` sees of its pods and claims, with when it saw it, and the arithmetic
on it: each preemptor's way from creation to bound split into stages, the victims each preemption
took against the fewest the MIG layout allows, and evictions counted twice.

Kept apart from ``bench.preemption`` (which drives the real control plane) so that the arithmetic
is tested without one.
"""

from __future__ import annotations

import json
import re
import statistics
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from api.names import HOLD_ANNOTATION, SCHEDULING_GATE
from driver.cluster.informer import Informer, ListWatch
from driver.cluster.port import PODS, RESOURCE_CLAIMS, ClusterApi, JsonObject, gate_names, name_of
from driver.mig.catalog import CATALOG

STAGES = ("create", "decide", "evict", "free", "allocate", "ungate", "bind")
"""A preemptor's way, each stage ending when this process sees it: ``create`` (the create call
returned: kube-apiserver and our webhook), ``decide`` (its preemption hold annotation: the
controller found no room, chose the victims and recorded them), ``evict`` (every victim gone from
the API: the evictions), ``free`` (every victim's claim deallocated: kube-controller-manager's
resourceclaim controller once the pod is gone), ``allocate`` (its own claim allocated on the held
GPU), ``ungate`` (its scheduling gate lifted), ``bind`` (``spec.nodeName``: kube-scheduler)."""


def minimal_victims(*, model: str, fill: str, ask: str) -> int:
    """The fewest pods of profile ``fill`` whose eviction makes room for one of profile ``ask``
    on a GPU of ``model`` on which every placement of ``fill`` is taken (a full fleet): 1 for a
    3g.20gb among 3g.20gb pods, 3 for a 3g.20gb among 1g.5gb pods (its start 4 covers three
    1g.5gb placements, its start 0 four)."""
    gpu = CATALOG[model]
    taken = gpu.profile(fill).placements
    return min(
        sum(1 for placed in taken if placed.mask & wanted.mask)
        for wanted in gpu.profile(ask).placements
    )


def per_gpu(*, model: str, profile: str) -> int:
    """Pods of ``profile`` that fill one GPU of ``model`` (its placements do not overlap)."""
    return len(CATALOG[model].profile(profile).placements)


@dataclass(frozen=True, slots=True)
class SeenHold:
    """One preemption as the preemptor's hold annotation recorded it."""

    seen: float
    since: str
    node: str
    victims: tuple[str, ...]
    """Pod names (the namespace is the benchmark's)."""


@dataclass(slots=True)
class PodSeen:
    sent: float | None = None
    created: float | None = None
    gated_at_creation: bool | None = None
    ungated: float | None = None
    bound: float | None = None
    node: str = ""
    terminating: float | None = None
    gone: float | None = None
    holds: list[SeenHold] = field(default_factory=list)


def parse_hold(text: str, *, seen: float) -> SeenHold | None:
    """A preemption hold annotation (``instaslice.dev/hold``); None for another kind or junk."""
    try:
        body = json.loads(text)
        if body.get("kind") != "preemption":
            return None
        victims = tuple(str(v).rpartition("/")[2] for v in body.get("victims", ()))
        return SeenHold(
            seen=seen, since=str(body["since"]), node=str(body["node"]), victims=victims
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


@dataclass(slots=True)
class Seen:
    """Pods and claims by name (pods and their claims share names), each with the moments
    (monotonic seconds) this process saw what happened to it. Not thread-safe: ``Timeline``
    guards it."""

    pods: dict[str, PodSeen] = field(default_factory=dict)
    allocated: dict[str, float] = field(default_factory=dict)
    freed: dict[str, float] = field(default_factory=dict)

    def pod(self, pod: JsonObject, *, now: float) -> bool:
        """Take in a pod as a watch shows it; whether it was seen bound just now."""
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        seen = self.pods.setdefault(name_of(pod), PodSeen())
        if seen.ungated is None and SCHEDULING_GATE not in gate_names(pod):
            seen.ungated = now
        if seen.terminating is None and meta.get("deletionTimestamp"):
            seen.terminating = now
        text = (meta.get("annotations") or {}).get(HOLD_ANNOTATION)
        hold = parse_hold(text, seen=now) if text else None
        if hold is not None and all(h.since != hold.since for h in seen.holds):
            seen.holds.append(hold)
        if seen.bound is None and spec.get("nodeName"):
            seen.bound, seen.node = now, str(spec["nodeName"])
            return True
        return False

    def pod_gone(self, name: str, *, now: float) -> None:
        seen = self.pods.setdefault(name, PodSeen())
        if seen.gone is None:
            seen.gone = now

    def claim(self, claim: JsonObject, *, now: float) -> None:
        name = name_of(claim)
        if (claim.get("status") or {}).get("allocation"):
            self.allocated.setdefault(name, now)
        elif name in self.allocated:
            self.freed.setdefault(name, now)


class Timeline:
    """``Seen`` fed by two informers on one namespace. Thread-safe: informer threads write, the
    benchmark reads (``seen`` only once the informers are stopped, or under ``wait_bound``)."""

    def __init__(self, api: ClusterApi, *, namespace: str) -> None:
        self._lock = threading.Condition()
        self.seen = Seen()
        self._pods = Informer(source=ListWatch(api, PODS, namespace=namespace), name="bench-pods")
        self._pods.add_handler(
            on_add=self._pod, on_update=lambda old, new: self._pod(new), on_delete=self._pod_gone
        )
        self._claims = Informer(
            source=ListWatch(api, RESOURCE_CLAIMS, namespace=namespace), name="bench-claims"
        )
        self._claims.add_handler(on_add=self._claim, on_update=lambda old, new: self._claim(new))

    def start(self) -> None:
        for informer in (self._pods, self._claims):
            informer.start()
            informer.wait_for_sync(timeout=60)

    def stop(self) -> None:
        self._pods.stop()
        self._claims.stop()

    def sent(self, name: str) -> None:
        with self._lock:
            self.seen.pods.setdefault(name, PodSeen()).sent = time.monotonic()

    def created(self, name: str, pod: JsonObject) -> None:
        with self._lock:
            seen = self.seen.pods.setdefault(name, PodSeen())
            seen.created = time.monotonic()
            seen.gated_at_creation = SCHEDULING_GATE in gate_names(pod)

    def wait_bound(self, names: Iterable[str], *, timeout: float) -> bool:
        """Whether every pod of ``names`` was seen bound within ``timeout`` seconds."""
        wanted = list(names)
        deadline = time.monotonic() + timeout
        with self._lock:
            while not all(self._bound(name) for name in wanted):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 1.0))
        return True

    def _bound(self, name: str) -> bool:
        seen = self.seen.pods.get(name)
        return seen is not None and seen.bound is not None

    def _pod(self, pod: JsonObject) -> None:
        with self._lock:
            if self.seen.pod(pod, now=time.monotonic()):
                self._lock.notify_all()

    def _pod_gone(self, pod: JsonObject) -> None:
        with self._lock:
            self.seen.pod_gone(name_of(pod), now=time.monotonic())

    def _claim(self, claim: JsonObject) -> None:
        with self._lock:
            self.seen.claim(claim, now=time.monotonic())


def stage_times(seen: Seen, name: str) -> dict[str, float]:
    """Seconds the preemptor ``name`` spent in each stage of ``STAGES`` it was seen to pass (a
    stage seen out of order counts as 0 s); its first preemption's victims make ``evict`` and
    ``free``. Empty when it was never sent."""
    pod = seen.pods.get(name)
    if pod is None or pod.sent is None:
        return {}
    ends: dict[str, float | None] = {
        "create": pod.created,
        "allocate": seen.allocated.get(name),
        "ungate": pod.ungated,
        "bind": pod.bound,
    }
    if pod.holds:
        first = pod.holds[0]
        ends["decide"] = first.seen
        gone = [v.gone if (v := seen.pods.get(victim)) else None for victim in first.victims]
        freed = [seen.freed.get(victim) for victim in first.victims]
        ends["evict"] = _last(gone)
        ends["free"] = _last(freed)
    spent: dict[str, float] = {}
    previous = pod.sent
    for stage in STAGES:
        at = ends.get(stage)
        if at is None:
            continue
        at = max(previous, at)
        spent[stage] = at - previous
        previous = at
    return spent


def _last(moments: list[float | None]) -> float | None:
    """The latest of ``moments``; None when there are none or one is unknown."""
    known = [m for m in moments if m is not None]
    return max(known) if known and len(known) == len(moments) else None


def stage_figures(per_pod: Iterable[Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Per stage, the median and the largest time over the pods that passed it."""
    values: dict[str, list[float]] = {stage: [] for stage in STAGES}
    for spent in per_pod:
        for stage, seconds in spent.items():
            values[stage].append(seconds)
    return {
        stage: {"p50_s": round(statistics.median(v), 3), "max_s": round(max(v), 3)}
        for stage, v in values.items()
        if v
    }


_PREEMPTOR = re.compile(r"evicted by InstaSlice for pod (?:[^/\s]+/)?(\S+) \(")


def evictions_from_events(events: Iterable[JsonObject]) -> dict[str, Any]:
    """The controller's ``Preempted`` events (one per victim and preemptor, ``count`` bumped on a
    repeat): the victims per preemptor, and the victims evicted more than once (by pod uid)."""
    by_preemptor: dict[str, list[str]] = {}
    times: dict[str, int] = {}
    names: dict[str, str] = {}
    for event in events:
        if event.get("reason") != "Preempted":
            continue
        involved = event.get("involvedObject") or {}
        uid = str(involved.get("uid", ""))
        names[uid] = str(involved.get("name", ""))
        count = event.get("count")
        times[uid] = times.get(uid, 0) + (count if isinstance(count, int) and count > 0 else 1)
        found = _PREEMPTOR.search(str(event.get("message", "")))
        preemptor = found.group(1) if found else "?"
        by_preemptor.setdefault(preemptor, []).append(names[uid])
    twice = sorted(names[uid] for uid, n in times.items() if n > 1)
    return {
        "events": sum(times.values()),
        "victims": len(times),
        "by_preemptor": {k: sorted(v) for k, v in sorted(by_preemptor.items())},
        "evicted_more_than_once": twice,
    }
