"""Why pods wait, and what free room no waiting pod can use: worked out when scraped, from the
allocation state and the pod cache, never kept beside them (so the figures cannot drift).

A pod counts as waiting while it carries our scheduling gate, or after we handed it to
kube-scheduler until it is bound. Its reason is one of ``WAIT_REASONS``:

- ``reserved`` / ``preempting``: room is held for it (a GPU reserved past the starvation bound,
  or victims being evicted for it).
- ``node-filter``: some GPU could take one of its profiles now, but the pod may not go there
  (node selector, affinity, taints, claims pinned elsewhere), or its slices only fit one at a time
  on different nodes, or the room goes to a pod ahead of it in the serving order.
- ``fragmented``: no GPU can take any of its profiles, but some GPU has as many free memory slices
  as one of them takes, just not at a placement the profile allows — defragmentation would help.
- ``no-capacity``: no GPU has that many free memory slices.
- ``quota``: a ResourceQuota refused the shadow claim of its classic request.
- ``gated-elsewhere``: another scheduling gate is on it too (Kueue's admission gate, for one);
  we decide once that gate is gone.
- ``unsatisfiable`` / ``invalid``: no release of capacity can help (a profile no GPU publishes, a
  request larger than any GPU; a broken selector, request or missing DeviceClass).
- ``hand-off``: handed to kube-scheduler, which has not bound it yet.
- ``pending``: being decided, or its claims do not exist yet.

A pod's profile is known once it failed to fit (its claims' candidate profiles): one profile, or
``mixed`` when it may take several; empty otherwise.

Fragmentation per GPU model: the free memory slices, and of them the *stranded* ones — on GPUs
where no profile any waiting pod asks can be placed now. With no pod waiting for capacity nothing
is stranded: free room nobody asks for is headroom, not fragmentation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from api.names import PLACEMENT_CONDITION
from controller.allocation.conditions import Reason
from controller.allocation.holds import HoldKind
from controller.allocation.waiting import Waiter
from driver.cluster.port import parse_time
from driver.cluster.views import PodView
from driver.placement.state import StateKey

REPORTED_REASONS = {
    Reason.QUOTA_EXCEEDED: "quota",
    Reason.PREEMPTING: "preempting",
    Reason.RESERVED: "reserved",
    Reason.UNSATISFIABLE: "unsatisfiable",
    Reason.UNKNOWN_PROFILE: "unsatisfiable",
    Reason.INVALID_SELECTOR: "invalid",
    Reason.INVALID_REQUEST: "invalid",
    Reason.DEVICE_CLASS_NOT_FOUND: "invalid",
}
"""The reported Placement reasons that name a pod's wait on their own."""

WAIT_REASONS = (
    "no-capacity",
    "fragmented",
    "node-filter",
    "reserved",
    "preempting",
    "quota",
    "gated-elsewhere",
    "unsatisfiable",
    "invalid",
    "hand-off",
    "pending",
)
MIXED = "mixed"


@dataclass(frozen=True, slots=True)
class WaitingPod:
    """A waiting pod as the registry of pods that found no room knows it."""

    key: str
    profiles: frozenset[str]
    hold: HoldKind | None


@dataclass(slots=True)
class WaitReport:
    pods: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(reason, profile) → waiting pods."""
    oldest: dict[str, float] = field(default_factory=dict)
    """Profile → age in seconds of the oldest waiting pod asking for it."""
    free_slices: Counter[str] = field(default_factory=Counter)
    """GPU model → free memory slices."""
    stranded_slices: Counter[str] = field(default_factory=Counter)
    """GPU model → free memory slices on GPUs where no waiting profile can be placed."""


def waiting_pod(waiter: Waiter, holds: Iterable[HoldKind]) -> WaitingPod:
    held = next((kind for kind in holds if kind is not HoldKind.NEXT), None)
    return WaitingPod(key=waiter.key, profiles=waiter.profiles, hold=held)


def profile_label(profiles: frozenset[str]) -> str:
    if not profiles:
        return ""
    return next(iter(profiles)) if len(profiles) == 1 else MIXED


@dataclass(frozen=True, slots=True)
class _Room:
    """What the GPUs offer the waiting profiles now."""

    placeable: frozenset[str]
    """Profiles some GPU can take now."""
    enough_memory: frozenset[str]
    """Profiles some GPU has enough free memory slices for (placeable or not)."""


def gpu_room(states: Mapping[StateKey, int], wanted: frozenset[str], report: WaitReport) -> _Room:
    """Walk the GPUs' distinct states (``StateKey`` → how many GPUs are in it) once: fill in the
    report's free and stranded slices per model, and say which wanted profiles have room."""
    placeable: set[str] = set()
    enough: set[str] = set()
    for (table, mask, media_taken, counts), gpus in states.items():
        model = table.model.name
        free = (table.slices - mask.bit_count()) * gpus
        report.free_slices[model] += free
        caps = table.capacities(mask=mask, media_taken=media_taken, counts=counts)
        usable = False
        for name in wanted:
            profile = table.profile_by_name.get(name)
            if profile is None:
                continue
            if caps[profile.index] > 0:
                placeable.add(name)
                usable = True
            if table.slices - mask.bit_count() >= profile.profile.memory_slices:
                enough.add(name)
        # every model gets a figure, 0 when all its free room is usable or nobody waits
        report.stranded_slices[model] += free if wanted and not usable else 0
    return _Room(placeable=frozenset(placeable), enough_memory=frozenset(enough))


def _capacity_reason(pod: WaitingPod, room: _Room) -> str:
    if pod.hold is HoldKind.RESERVATION:
        return "reserved"
    if pod.hold is HoldKind.PREEMPTION:
        return "preempting"
    if pod.profiles & room.placeable:
        return "node-filter"
    if pod.profiles & room.enough_memory:
        return "fragmented"
    return "no-capacity"


def _age(pod: PodView, now: datetime) -> float | None:
    stamp = pod.meta.creation_timestamp
    if not stamp:
        return None
    try:
        return max(0.0, (now - parse_time(stamp)).total_seconds())
    except ValueError:
        return None


def _handed_off(pod: PodView) -> bool:
    return any(
        c.type == PLACEMENT_CONDITION and c.status == "False" and c.reason == Reason.HANDED_OFF
        for c in pod.conditions
    )


def pod_reason(
    pod: PodView,
    *,
    gate: str,
    waiting: Mapping[str, WaitingPod],
    reported: Mapping[str, Reason],
    room: _Room,
) -> str | None:
    """Why ``pod`` waits, or None if it does not (see the module docstring)."""
    if gate not in pod.scheduling_gates:
        if pod.bound or pod.meta.deleting or pod.terminal:
            return None
        return "hand-off" if _handed_off(pod) else None
    if pod.scheduling_gates != (gate,):
        return "gated-elsewhere"
    registered = waiting.get(pod.key)
    if registered is not None:
        return _capacity_reason(registered, room)
    reason = reported.get(pod.uid)
    if reason is not None and reason in REPORTED_REASONS:
        return REPORTED_REASONS[reason]
    return "pending"


def wait_report(
    pods: Iterable[PodView],
    *,
    gate: str,
    waiting: Mapping[str, WaitingPod],
    reported: Mapping[str, Reason],
    states: Mapping[StateKey, int],
    now: datetime,
) -> WaitReport:
    """The figures of this module's docstring for the pods of the cache."""
    report = WaitReport()
    wanted = frozenset(p for w in waiting.values() if w.hold is None for p in w.profiles)
    room = gpu_room(states, wanted, report)
    for pod in pods:
        reason = pod_reason(pod, gate=gate, waiting=waiting, reported=reported, room=room)
        if reason is None:
            continue
        registered = waiting.get(pod.key)
        profile = profile_label(registered.profiles) if registered is not None else ""
        report.pods[(reason, profile)] += 1
        age = _age(pod, now)
        if age is not None and age > report.oldest.get(profile, -1.0):
            report.oldest[profile] = age
    return report
