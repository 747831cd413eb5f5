"""Why a gated pod is not placed, said where a person looks: a pod condition and an event.

A pod that cannot be placed stays gated with ``instaslice.dev/Placement=False`` and a reason:

- ``NoCapacity`` — it would fit on the published inventory, just not now; retried when capacity
  changes (a claim released or deleted, a slice published), never by polling;
- ``Unsatisfiable`` — it could not be placed even on an empty cluster of the current inventory
  (more slices on one GPU than any GPU holds, selectors matching no published device, claims
  already allocated on different nodes); retried only when the inventory or the pod's claims change;
- ``InvalidSelector`` — a CEL selector of its claim or DeviceClass does not compile or fails at
  run time (as kube-scheduler, a runtime error is an error for the claim, not a "no match");
- ``UnknownProfile`` — a classic ``nvidia.com/mig-<profile>`` request for a profile nobody publishes;
- ``InvalidRequest`` — a request InstaSlice cannot serve (a bad opaque config, admin access,
  consumable capacity, a claim mixing our devices with another driver's);
- ``DeviceClassNotFound`` — a request names a DeviceClass that does not exist (yet);
- ``Preempting`` — lower-priority pods holding our slices are being evicted for it, and the room
  they leave is held for it (which pods, which GPUs);
- ``Reserved`` — it waited past the starvation bound: a GPU is reserved for it and empties by
  attrition (which GPU, how many slices are still taken there).

Pods evicted for another get a ``Preempted`` event naming the pod, its priority and the node.

A pod handed to kube-scheduler (``handoff``) is no longer gated: ``Placement=False`` with
``HandedOff`` says why we let it go without a slice of ours; kube-scheduler's own
``PodScheduled`` condition tells the rest.

Each problem affects only its own pod. The condition and the event are written only when the
reason or message changes, so a pod retried a hundred times costs one write, not a hundred.
"""

from __future__ import annotations

import enum
import logging
import threading

from api.names import PLACEMENT_CONDITION
from driver.cluster import ops
from driver.cluster.clock import Clock
from driver.cluster.events import NORMAL, WARNING, EventRecorder
from driver.cluster.port import ClusterApi
from driver.cluster.views import PodView
from driver.errors import ApiNotFoundError, ClusterError, DriverError

logger = logging.getLogger(__name__)


class Reason(enum.StrEnum):
    PLACED = "Placed"
    NO_CAPACITY = "NoCapacity"
    UNSATISFIABLE = "Unsatisfiable"
    INVALID_SELECTOR = "InvalidSelector"
    UNKNOWN_PROFILE = "UnknownProfile"
    INVALID_REQUEST = "InvalidRequest"
    DEVICE_CLASS_NOT_FOUND = "DeviceClassNotFound"
    HANDED_OFF = "HandedOff"
    PREEMPTING = "Preempting"
    RESERVED = "Reserved"
    PREEMPTED = "Preempted"
    QUOTA_EXCEEDED = "QuotaExceeded"


PERMANENT_REASONS = frozenset(
    {
        Reason.UNSATISFIABLE,
        Reason.INVALID_SELECTOR,
        Reason.UNKNOWN_PROFILE,
        Reason.INVALID_REQUEST,
    }
)
"""Reasons no release of capacity can cure: the pod waits for its claims or the inventory."""


class PlacementProblem(DriverError):  # noqa: N818 - a report for the pod, not a crash
    """Why a pod cannot be placed; ``reason`` says which kind (see the module docstring)."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    @property
    def permanent(self) -> bool:
        return self.reason in PERMANENT_REASONS


class ConditionReporter:
    """Writes the Placement condition and its event, once per change of reason or message."""

    def __init__(self, *, api: ClusterApi, events: EventRecorder, clock: Clock) -> None:
        self._api = api
        self._events = events
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, tuple[str, str]] = {}

    def problem(self, pod: PodView, problem: PlacementProblem) -> None:
        """The pod stays gated: ``Placement=False`` with the problem's reason, and a warning event."""
        self._report(pod, status="False", reason=problem.reason, message=problem.message)

    def waiting(self, pod: PodView, *, reason: Reason, message: str) -> None:
        """The pod waits with room held for it (``Preempting``, ``Reserved``)."""
        self._report(pod, status="False", reason=reason, message=message)

    def preempted(self, victim: PodView, *, message: str) -> None:
        """An event on a pod evicted for another (its own status is the kubelet's to write)."""
        self._events.record(
            victim.raw, event_type=WARNING, reason=str(Reason.PREEMPTED), message=message
        )

    def handed_off(self, pod: PodView, *, message: str) -> None:
        """The pod goes to kube-scheduler without an allocation of ours: say so, with a warning."""
        self._report(pod, status="False", reason=Reason.HANDED_OFF, message=message)

    def placed(self, pod: PodView, *, node: str) -> None:
        """Clear an earlier ``False`` condition once the pod is placed (no write otherwise)."""
        with self._lock:
            had_problem = pod.uid in self._last
        if not had_problem and not _has_false_condition(pod):
            return
        self._report(
            pod,
            status="True",
            reason=Reason.PLACED,
            message=f"every MIG slice of the pod is allocated on node {node}",
        )

    def reported(self) -> dict[str, Reason]:
        """Pod UID → the reason of the ``False`` condition last written on it (still gated)."""
        with self._lock:
            return {uid: Reason(reason) for uid, (reason, _) in self._last.items()}

    def forget(self, pod_uid: str) -> None:
        with self._lock:
            self._last.pop(pod_uid, None)

    def _report(self, pod: PodView, *, status: str, reason: Reason, message: str) -> None:
        uid = pod.uid
        with self._lock:
            if self._last.get(uid) == (reason, message) and status == "False":
                return
        try:
            ops.set_pod_condition(
                self._api,
                pod=pod.raw,
                condition_type=PLACEMENT_CONDITION,
                status=status,
                reason=str(reason),
                message=message,
                now=self._clock.now(),
            )
        except ApiNotFoundError:
            return
        except ClusterError as exc:
            logger.info(
                "cannot set %s on pod %s/%s: %s",
                PLACEMENT_CONDITION,
                pod.namespace,
                pod.name,
                exc,
            )
            return
        event_type = WARNING if status == "False" else NORMAL
        self._events.record(pod.raw, event_type=event_type, reason=str(reason), message=message)
        with self._lock:
            if status == "False":
                self._last[uid] = (reason, message)
            else:
                self._last.pop(uid, None)


def _has_false_condition(pod: PodView) -> bool:
    return any(c.type == PLACEMENT_CONDITION and c.status == "False" for c in pod.conditions)
