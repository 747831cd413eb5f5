"""Handing a pod to kube-scheduler: when we let a pod go without (or withdraw) our allocation.

kube-scheduler allocates our partitionable devices itself on Kubernetes >= 1.36 (docs/design.md F14), and
cluster-autoscaler's DRA support and Karpenter act only on pods kube-scheduler reports
``Unschedulable`` — never on pods held by a scheduling gate. So in controller mode a DRA pod is
handed over (``PodSync``):

- **no capacity**: it has not been placeable for ``handoff_after`` seconds (counted from the
  ``lastTransitionTime`` of its ``instaslice.dev/Placement=False`` condition, so a controller
  restart does not restart the count, and time spent behind another gate, e.g. Kueue's, does not
  count) and we still cannot place it: the gate is lifted with its claims unallocated. kube-scheduler then owns it: it
  allocates when capacity appears, and until then reports the pod ``Unschedulable`` — the signal
  autoscalers add nodes for;
- **not bound**: we placed it and lifted the gate, but kube-scheduler could not bind it (for
  ``handoff_after`` seconds its ``PodScheduled`` stayed ``False/Unschedulable``: a taint, an
  affinity, a host port, resources we do not model). The condition's ``lastTransitionTime`` may
  date from the pod's creation (``False`` since it was gated), so the time is counted from when this
  controller first saw the pod unschedulable (a restarted controller counts again). Our allocations nobody has reserved yet are withdrawn (a
  resourceVersion-checked clear: if kube-scheduler reserves the claim meanwhile, the clear loses
  and the pod keeps it), so kube-scheduler may allocate elsewhere instead of the pod staying pinned
  with a slice reserved.

Classic ``nvidia.com/mig-*`` pods are never handed over in controller mode: with the shim on, a node
advertises the resource as a device-plugin resource, kube-scheduler would bind the pod against that
capacity with no shadow claim, and the shim would have no slice to give it (the pod fails at
admission). And a classic pod we placed carries our ``nodeSelector``, which cannot be removed once it
is ungated (docs/design.md F4). They stay gated with ``NoCapacity`` (documented in docs/deploy.md).

In **scheduler mode** (``--allocation-mode scheduler``) every gated pod is handed over at once —
pods gated before the switch, classic ones included (kube-scheduler serves those through the
DeviceClasses' ``extendedResourceName``): a classic pod's unused shadow claims are released first,
so no slice stays reserved for a pod that will get others.
"""

from __future__ import annotations

import logging
from datetime import datetime

from api.names import PLACEMENT_CONDITION, SCHEDULING_GATE
from controller.classic import shadow
from driver.cluster.port import ClusterApi, JsonObject, parse_time
from driver.cluster.views import ClaimView, PodView

logger = logging.getLogger(__name__)

POD_SCHEDULED = "PodScheduled"
UNSCHEDULABLE = "Unschedulable"
"""kube-scheduler's reason; a pod that was gated keeps ``SchedulingGated`` (and the condition's
``lastTransitionTime`` of its creation: the status stays ``False``) until kube-scheduler looked."""


def unplaced_since(pod: PodView) -> datetime | None:
    """Since when the pod's ``Placement`` condition has been ``False``; None if it is not."""
    for condition in pod.conditions:
        if condition.type == PLACEMENT_CONDITION and condition.status == "False":
            since = condition.last_transition_time
            return parse_time(since) if since else None
    return None


def unbound_since(pod: JsonObject | PodView) -> datetime | None:
    """When kube-scheduler last found an ungated, unbound, live pod with ResourceClaims
    unschedulable; else None (only such pods can hold an allocation of ours to withdraw)."""
    view = pod if isinstance(pod, PodView) else PodView.of(pod)
    if (
        not view.claim_refs
        or view.gated_by(SCHEDULING_GATE)
        or view.bound
        or view.meta.deleting
        or view.terminal
    ):
        return None
    for condition in view.conditions:
        if (
            condition.type == POD_SCHEDULED
            and condition.status == "False"
            and condition.reason == UNSCHEDULABLE
        ):
            since = condition.last_transition_time
            return parse_time(since) if since else None
    return None


def unreserved(claim: ClaimView, pod: PodView) -> bool:
    """Nobody but ``pod`` (not bound: no container uses the claim) reserves the claim. The
    controller reserves a claim for its pod in the allocation write itself, so "reserved by this
    pod alone" is the normal state of a claim we placed and kube-scheduler did not bind (or, for a
    gated pod, withdrawing the allocation hurts no one)."""
    return all(consumer.uid == pod.uid for consumer in claim.reserved_for)


def release_shadow_claims(api: ClusterApi, pod: PodView, claims: list[ClaimView]) -> None:
    """Release the shadow claims of a gated classic pod handed to kube-scheduler (which creates its
    own claim for the request): allocation and reservation cleared, so no slice stays taken. The
    claims themselves stay until the pod goes (they are owned by it; the controller is not granted
    claim deletion). Idempotent."""
    for claim in claims:
        if shadow.holds_something(claim):
            shadow.release(api, claim, pod_uid=pod.uid)
            logger.info(
                "pod %s/%s handed to kube-scheduler: shadow claim %s released",
                pod.namespace,
                pod.name,
                claim.name,
            )
