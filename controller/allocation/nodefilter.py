"""Would kube-scheduler accept this node for this pod? The cheap checks, so an ungated pod does not
bounce between our allocation (which pins it to one node) and a scheduler that refuses the node.

Checked, as kube-scheduler's plugins of the same names do:

- NodeResourcesFit: the node's allocatable CPU, memory, pod count and extended resources (a
  classic pod's ``nvidia.com/mig-*``, advertised by our device-plugin shim) minus the requests of
  the pods bound to it (and of pods we have already sent there but the scheduler has not bound);
- NodeAffinity: ``spec.nodeSelector`` labels and required node affinity
  (``nodeSelectorTerms``: ``matchExpressions`` with In/NotIn/Exists/DoesNotExist/Gt/Lt and
  ``matchFields`` on ``metadata.name``);
- TaintToleration / NodeUnschedulable: ``NoSchedule`` and ``NoExecute`` taints (and
  ``spec.unschedulable``) must be tolerated.

A node without a Node object never fits: nothing could bind a pod to it. Kept incrementally from
the node and pod informers; thread-safe.

One check of our own, for classic pods: a node whose kubelet just **rejected** a classic pod at
admission (``UnexpectedAdmissionError``: the kubelet asked our device-plugin shim to Allocate and
it was not serving — the kubelet plugin crashed or is being restarted) gets no classic pod for a
while. The kubelet fails such a pod for good, and its Node status goes on listing the shim's
resources for up to its status-update period (10 s), so without this first-fit sends the next
waiting pod straight into the same rejection (seen on real kubelets: 17 of 20 classic pods
Failed while the plugin restarted within 3 s). The pause starts at ``CLASSIC_BACKOFF_S`` and
doubles on each further rejection up to ``CLASSIC_BACKOFF_MAX_S``; a classic pod of that node
running again ends it. DRA pods are not concerned: the kubelet retries their prepare calls.

The shim also says itself whether it serves, through its Lease (``kubeletplugin/deviceplugin/
lease.py``): a node whose shim gave its lease back (the plugin is stopping, e.g. a DaemonSet rolling
update) gets no classic pod until the lease is taken again; a lease taken anew (a new
``acquireTime``: the plugin restarted) ends a rejection pause at once. A node with no shim lease is
judged by the rest alone.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from api.names import CLASSIC_RESOURCE_PREFIX, SHIM_LEASE_NODE_ANNOTATION
from controller.allocation.cel_library import Quantity
from driver.cluster.port import JsonObject
from driver.cluster.views import (
    ContainerView,
    LeaseView,
    NodeView,
    PodView,
    Requirement,
    SelectorTerm,
    Taint,
    Toleration,
)

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
HOSTNAME_LABEL = "kubernetes.io/hostname"
_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
ADMISSION_REJECTED = "UnexpectedAdmissionError"
"""``status.reason`` of a pod the kubelet refused at admission (a device plugin's Allocate failed)."""
CLASSIC_BACKOFF_S = 10.0
CLASSIC_BACKOFF_MAX_S = 160.0


Usage = Mapping[str, int]
"""Requested or allocatable amounts by resource name: CPU in millicores, the rest in units."""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    allocatable: Usage
    """Resources the node lists; a resource it does not list has none (but a node listing no
    ``cpu``/``memory``/``pods`` at all is not limited in those)."""


def _amount(resource: str, value: str) -> int:
    try:
        number = Quantity.parse(value).value
    except ValueError:
        return 0
    return math.ceil(number * 1000 if resource == "cpu" else number)


def _container_usage(container: ContainerView) -> dict[str, int]:
    # a limit without a request is also the request (the API server defaults it so); where both
    # are given the request counts, as kube-scheduler counts it (not ``amounts()``: a limit wins)
    amounts = {**container.limits, **container.requests}
    return {name: _amount(name, value) for name, value in amounts.items()}


def _add(total: dict[str, int], more: Mapping[str, int]) -> None:
    for name, value in more.items():
        total[name] = total.get(name, 0) + value


def _pod(pod: JsonObject | PodView) -> PodView:
    return pod if isinstance(pod, PodView) else PodView.of(pod)


def pod_usage(pod: JsonObject | PodView) -> dict[str, int]:
    """What the pod requests of a node: containers (and sidecars) summed, other init containers
    at their maximum, plus the pod overhead and the pod itself (``pods: 1``)."""
    view = _pod(pod)
    running: dict[str, int] = {}
    init: dict[str, int] = {}
    for container in view.all_containers:
        usage = _container_usage(container)
        if not container.init or container.sidecar:  # a sidecar runs with the containers
            _add(running, usage)
        else:
            for name, value in usage.items():
                init[name] = max(init.get(name, 0), value)
    total = {name: max(running.get(name, 0), init.get(name, 0)) for name in {*running, *init}}
    _add(total, {n: _amount(n, v) for n, v in view.overhead.items()})
    total["pods"] = 1
    return {name: value for name, value in total.items() if value > 0}


def node_info(node: JsonObject) -> NodeInfo:
    view = NodeView.of(node)
    taints = view.taints
    if view.unschedulable:
        taints = (
            *taints,
            Taint(key=UNSCHEDULABLE_TAINT, value="", effect="NoSchedule", time_added=""),
        )
    return NodeInfo(
        name=view.name,
        labels=view.labels,
        taints=taints,
        allocatable={name: _amount(name, value) for name, value in view.allocatable.items()},
    )


_UNLIMITED_IF_UNLISTED = frozenset({"cpu", "memory", "pods", "ephemeral-storage"})


def _tolerates(tolerations: tuple[Toleration, ...], taint: Taint) -> bool:
    return any(toleration.tolerates(taint) for toleration in tolerations)


def _requirement(requirement: Requirement, value: str | None) -> bool:
    operator = requirement.operator
    values = requirement.values
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and values:
        try:
            left, right = int(value), int(values[0])
        except ValueError:
            return False
        return left > right if operator == "Gt" else left < right
    return False


def _term_matches(term: SelectorTerm, node: NodeInfo) -> bool:
    if not term.match_expressions and not term.match_fields:
        return False  # an empty term matches nothing
    for requirement in term.match_expressions:
        if not _requirement(requirement, node.labels.get(requirement.key)):
            return False
    for requirement in term.match_fields:
        value = node.name if requirement.key == "metadata.name" else None
        if not _requirement(requirement, value):
            return False
    return True


def static_fit(pod: JsonObject | PodView, node: NodeInfo) -> str | None:
    """Why ``node`` is not acceptable for ``pod`` apart from resources; ``None`` if it is."""
    view = _pod(pod)
    for key, value in view.node_selector.items():
        if node.labels.get(key) != value:
            return f"node {node.name} does not match nodeSelector {key}={value}"
    required = view.required_affinity.terms if view.required_affinity is not None else ()
    if required and not any(_term_matches(term, node) for term in required):
        return f"node {node.name} does not match the pod's required node affinity"
    for taint in node.taints:
        if taint.effect in _BLOCKING_EFFECTS and not _tolerates(view.tolerations, taint):
            return f"node {node.name} has taint {taint.key} the pod does not tolerate"
    return None


def is_classic(usage: Usage, *, prefix: str = CLASSIC_RESOURCE_PREFIX) -> bool:
    return any(name.startswith(prefix) for name in usage)


@dataclass(slots=True)
class _Rejection:
    until: float
    """Monotonic time before which classic pods do not go to the node."""
    count: int
    """Rejections in a row (no classic pod of the node ran since the first)."""


class NodeFilter:
    def __init__(
        self,
        *,
        classic_prefix: str = CLASSIC_RESOURCE_PREFIX,
        clock: Callable[[], float] = time.monotonic,
        backoff_s: float = CLASSIC_BACKOFF_S,
        backoff_max_s: float = CLASSIC_BACKOFF_MAX_S,
    ) -> None:
        self._classic_prefix = classic_prefix
        self._clock = clock
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._rejections: dict[str, _Rejection] = {}
        """node → the kubelet there rejected a classic pod at admission."""
        self._shims: dict[str, tuple[bool, str]] = {}
        """node → (its shim holds its lease, the lease's acquireTime)."""
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeInfo] = {}
        self._used: dict[str, dict[str, int]] = {}
        """node → amounts requested by the pods counted on it."""
        self._counted: dict[str, tuple[str, Usage, bool]] = {}
        """pod uid → (node, usage, bound) for every pod counted against a node."""

    # -- informer side -------------------------------------------------------------------------

    def node_changed(self, node: JsonObject) -> None:
        info = node_info(node)
        with self._lock:
            self._nodes[info.name] = info

    def node_deleted(self, node: JsonObject) -> None:
        with self._lock:
            self._nodes.pop(NodeView.of(node).name, None)

    def pod_changed(self, pod: JsonObject) -> bool:
        """Follow a pod; True if resources it held on a node were freed (it finished)."""
        view = PodView.of(pod)
        node = view.node_name
        uid = view.uid
        with self._lock:
            if view.terminal:
                return self._uncount(uid)
            if node:
                counted = self._counted.get(uid)
                if counted is None or counted[0] != node or not counted[2]:
                    self._uncount(uid)
                    self._count(uid, node, pod_usage(view), bound=True)
            return False

    def classic_admission(self, pod: JsonObject) -> float | None:
        """Learn from a classic pod's fate on its node: rejected at admission starts (or
        lengthens) the node's pause and returns its length in seconds; running ends it."""
        view = PodView.of(pod)
        node = view.node_name
        if not node or not is_classic(pod_usage(view), prefix=self._classic_prefix):
            return None
        with self._lock:
            if view.phase == "Running":
                self._rejections.pop(node, None)
                return None
            if view.phase != "Failed" or view.reason != ADMISSION_REJECTED:
                return None
            previous = self._rejections.get(node)
            count = 1 if previous is None else previous.count + 1
            pause = float(min(self._backoff_s * 2 ** (count - 1), self._backoff_max_s))
            self._rejections[node] = _Rejection(until=self._clock() + pause, count=count)
            return pause

    def shim_lease_changed(self, lease: JsonObject) -> bool:
        """Follow a node's shim lease; True if classic pods may now go where they could not, or
        the other way round."""
        view = LeaseView.of(lease)
        node = view.meta.annotations.get(SHIM_LEASE_NODE_ANNOTATION)
        if not node:
            return False
        state = (bool(view.holder_identity), view.acquire_time)
        with self._lock:
            previous = self._shims.get(node)
            self._shims[node] = state
            if previous == state:
                return False
            if state[0] and (previous is None or previous[1] != state[1]):
                self._rejections.pop(node, None)  # the shim (re)started since
            return True

    def shim_lease_deleted(self, lease: JsonObject) -> bool:
        node = LeaseView.of(lease).meta.annotations.get(SHIM_LEASE_NODE_ANNOTATION)
        if not node:
            return False
        with self._lock:
            return self._shims.pop(node, None) is not None

    def pod_deleted(self, pod: JsonObject) -> bool:
        """Forget a pod; True if it held resources on a node (bound, or sent there by us)."""
        with self._lock:
            return self._uncount(PodView.of(pod).uid)

    # -- allocator side ------------------------------------------------------------------------

    def assume(self, pod: JsonObject | PodView, node: str) -> None:
        """We pinned the pod to ``node``: count it there until the scheduler binds it."""
        pod = _pod(pod)
        uid = pod.uid
        with self._lock:
            counted = self._counted.get(uid)
            if counted is not None and counted[2]:
                return
            self._uncount(uid)
            self._count(uid, node, pod_usage(pod), bound=False)

    def forget(self, pod: JsonObject | PodView) -> None:
        """Undo ``assume`` (the pod was not sent there after all)."""
        uid = _pod(pod).uid
        with self._lock:
            counted = self._counted.get(uid)
            if counted is not None and not counted[2]:
                self._uncount(uid)

    def hostname(self, node: str) -> str:
        """The node's ``kubernetes.io/hostname`` label (what a pod's nodeSelector can name)."""
        with self._lock:
            info = self._nodes.get(node)
        return info.labels.get(HOSTNAME_LABEL, node) if info is not None else node

    def for_pod(self, pod: JsonObject | PodView) -> Callable[[str], bool]:
        """A verdict per node name for ``pod`` (memoized per node for one decision)."""
        pod = _pod(pod)
        usage = pod_usage(pod)
        verdicts: dict[str, bool] = {}

        def fits(node: str) -> bool:
            verdict = verdicts.get(node)
            if verdict is None:
                verdict = self.why_not(pod, node, usage=usage) is None
                verdicts[node] = verdict
            return verdict

        return fits

    def why_not(
        self,
        pod: JsonObject | PodView,
        node: str,
        *,
        usage: Usage | None = None,
        without: Iterable[str] = (),
    ) -> str | None:
        """Why the pod cannot go to ``node``; ``None`` if it can. ``without``: UIDs of pods
        whose usage is not counted (the victims of a preemption being weighed)."""
        pod = _pod(pod)
        usage = usage if usage is not None else pod_usage(pod)
        with self._lock:
            info = self._nodes.get(node)
            if info is None:
                return f"node {node} has no Node object"
            used = dict(self._used.get(node, {}))
            for uid in (pod.uid, *without):
                counted = self._counted.get(uid)
                if counted is not None and counted[0] == node:  # counted there, not to count
                    for name, value in counted[1].items():
                        used[name] = used.get(name, 0) - value
            rejection = self._rejections.get(node)
            shim = self._shims.get(node)
        classic = is_classic(usage, prefix=self._classic_prefix)
        if classic and shim is not None and not shim[0]:
            return f"the device-plugin shim on node {node} is stopped (it gave its lease back)"
        if rejection is not None and classic:
            left = rejection.until - self._clock()
            if left > 0:
                return (
                    f"the kubelet on node {node} rejected a classic pod at admission (its "
                    f"device plugin was not serving); classic pods go there again in {left:.0f}s"
                )
        problem = static_fit(pod, info)
        if problem is not None:
            return problem
        for name, want in usage.items():
            total = info.allocatable.get(name)
            if total is None:
                if name in _UNLIMITED_IF_UNLISTED:
                    continue
                return f"node {node} does not offer {name}"
            if used.get(name, 0) + want > total:
                return f"node {node} has not enough {name} left"
        return None

    # -- bookkeeping ---------------------------------------------------------------------------

    def _count(self, uid: str, node: str, usage: Usage, *, bound: bool) -> None:
        self._counted[uid] = (node, usage, bound)
        _add(self._used.setdefault(node, {}), usage)

    def _uncount(self, uid: str) -> bool:
        counted = self._counted.pop(uid, None)
        if counted is None:
            return False
        node, usage, _ = counted
        used = self._used.get(node)
        if used is not None:
            for name, value in usage.items():
                used[name] = used.get(name, 0) - value
        return True
