"""The order in which waiting pods are served: kube-scheduler's, by priority then age.

kube-scheduler's active queue pops the pod of the highest ``spec.priority`` first and, among equal
priorities, the one that has waited longest (``PrioritySort``). Ours does the same, and more strictly,
since our workers decide concurrently: a pod may take freed slices only if no pod *ahead* of it
in this order is waiting for them (``waiting``), and a hold placed for a pod ahead of it blocks it
(``holds``).

``spec.priority`` is what the Priority admission plugin resolved from the pod's PriorityClass when
the pod was created; it stays on the pod, so a PriorityClass deleted later changes no order.
"""

from __future__ import annotations

from dataclasses import dataclass

from driver.cluster.views import PodView

NEVER = "Never"
"""``spec.preemptionPolicy`` of a pod that waits in priority order and evicts nothing."""


@dataclass(frozen=True, slots=True, order=True)
class PodOrder:
    """Sorts as the pods are served: the smallest first."""

    rank: int
    """``-spec.priority``: the highest priority first."""
    created: str
    """``metadata.creationTimestamp`` (RFC 3339 in UTC sorts as text): the oldest first."""
    seen: float
    """When this controller first saw the pod (monotonic): orders pods created in the same
    second, as kube-scheduler's queue timestamp does."""
    uid: str
    """Breaks ties between pods created in the same second, the same way on every replica."""

    @property
    def priority(self) -> int:
        return -self.rank

    def ahead_of(self, other: PodOrder) -> bool:
        return self < other


def order_of(pod: PodView, *, seen: float = 0.0) -> PodOrder:
    return PodOrder(rank=-pod.priority, created=pod.meta.creation_timestamp, seen=seen, uid=pod.uid)


def may_preempt(pod: PodView) -> bool:
    """Whether the pod may evict lower-priority pods to get its slices."""
    return pod.preemption_policy != NEVER


LAST = PodOrder(rank=2**32, created="", seen=0.0, uid="")
"""After every pod: the order of work queue keys that are not pods (shadow-claim releases)."""
