"""What one pass over a pod ends in, and the knobs of the write-check protocol (``writes``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from driver.errors import DriverError


class Outcome(enum.Enum):
    DONE = "done"
    WAIT = "wait"
    """Woken by an event about the pod or its claims."""
    WAIT_CAPACITY = "wait-capacity"
    """Woken when slices are freed or the inventory changes."""
    WAIT_CHANGE = "wait-change"
    """Woken when the inventory or the DeviceClasses change."""
    RETRY_AFTER = "retry-after"
    RETRY = "retry"
    """Requeued with the work queue's per-key backoff."""


@dataclass(frozen=True, slots=True)
class Result:
    outcome: Outcome
    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class SyncConfig:
    verify_timeout: float = 5.0
    """How long to wait for the claim informer to see our write before checking it; past it
    the writer no longer withdraws (it retries instead)."""
    adopt_grace: float = 6.0
    """How long an allocation we did not write is left to its writer's check before we ungate
    for it ourselves (longer than ``verify_timeout``)."""
    overlap_grace: float = 5.0
    """How long an overlap between allocations we did not write may last before the gated
    pod's claim is withdrawn (their writers may have died before checking)."""
    yield_delay: tuple[float, float] = (0.01, 0.2)
    """Random delay before retrying a pod whose allocation was withdrawn."""
    quota_retry: float = 15.0
    """How soon a pod whose shadow claim a ResourceQuota refused is looked at again when no
    release in the meantime wakes it (a raised quota is not watched)."""
    not_leader_retry: float = 1.0
    """How soon a pod is looked at again after a pass stopped because this replica could not
    prove it leads (``is_leader()`` is False while a lease renew is overdue). Leadership may come
    back without a new term — a late renew succeeds, and nothing requeues the gated pods then —
    so the pod is retried; once the replica has stepped down, its retries are dropped and
    ``start_leading`` requeues every gated pod when the lease is won again."""
    handoff_after: float | None = None
    """Hand a DRA pod to kube-scheduler (ungated, no allocation of ours) once it has waited this
    long for capacity, or, placed and ungated, has not been bound for this long (``handoff``).
    None: never (the daemon's flag defaults to 120 s)."""
    scheduler_mode: bool = False
    """kube-scheduler allocates: every gated pod is handed over at once, nothing is allocated."""
    nominate_node: bool = True
    """Set a placed pod's ``status.nominatedNodeName`` to its node before ungating it
    (docs/design.md F24)."""
    starvation_after: float | None = 60.0
    """A pod that has waited this long and fits nowhere only because some GPU's occupants are in
    its way gets that GPU reserved (``arbiter``): nothing of equal or lower priority is placed
    there until the pod is. None: never."""
    preemption: bool = True
    """Evict lower-priority pods holding our slices for a pod that fits nowhere (``preemption``)."""
    preemption_retry: float = 5.0
    """How soon a preemptor looks again after the Eviction API refused one of its victims."""
    preemption_slack: float = 30.0
    """How long past its victims' longest grace period a preemption hold waits for them to go;
    then the preemptor looks again (a victim stuck terminating is not waited for forever)."""


class NotLeaderError(DriverError):
    """This replica is not the leader (any more): stop writing."""
