"""kube-scheduler's binding half: the InstaSlice controller allocates, this only binds.

An ungated, unbound pod (``schedulerName: default-scheduler``) is bound to a node that passes what
kube-scheduler's filters check: every claim exists, belongs to the pod if generated, is not being
deleted and is allocated with an allocation ``nodeSelector`` matching the node (dynamicresources);
``spec.nodeSelector`` and required node affinity (NodeAffinity); NoSchedule/NoExecute taints and
``spec.unschedulable`` (TaintToleration, NodeUnschedulable); cpu, memory, pod count and extended
resources such as ``nvidia.com/mig-*`` against ``status.allocatable`` minus what bound pods request
(NodeResourcesFit). Of the nodes left it takes the least allocated, then the first by name.

Before binding (PreBind) the pod is added to ``status.reservedFor`` of each claim with a
resourceVersion-checked status update. Like kube-scheduler 1.36 (docs/design.md F2) it also fills in a
missing ``allocation.allocationTimestamp`` in that update, which the API server refuses as a change
of an immutable allocation: such a pod is never bound. A pod that cannot be placed gets
``PodScheduled=False`` (``Unschedulable``, kube's message format) and is tried again when a node, a
claim or a pod on a node changes.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections import Counter
from fractions import Fraction

from driver.cluster.clock import Clock, SystemClock
from driver.cluster.events import NORMAL, WARNING, EventRecorder
from driver.cluster.indexes import BY_CLAIM, BY_NODE, pod_claim_keys, spec_node_name
from driver.cluster.ops import pod_reference, set_pod_condition
from driver.cluster.port import (
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    JsonObject,
    format_time,
    gate_names,
    key_for,
    metadata,
    name_of,
    namespace_of,
    object_key,
    uid_of,
)
from driver.errors import ApiNotFoundError, ConflictError, DriverError
from localcluster.cluster.client import ControlPlaneApi
from localcluster.cluster.loop import InformerFactory, KeyedLoop, ensure_index
from localcluster.cluster.podutil import (
    ClaimNotCreatedError,
    allocation,
    is_deleting,
    is_owned_by,
    is_reserved_for,
    is_terminal,
    node_allocatable,
    node_labels_match,
    node_name,
    node_selector_matches,
    pod_claim_refs,
    pod_requests,
    required_node_affinity,
    untolerated_taint,
)

log = logging.getLogger(__name__)

SCHEDULER_NAME = "default-scheduler"
MAX_RESERVED_FOR = 256
_ATTEMPTS = 5
_UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


_NON_ZERO_DEFAULTS = {"cpu": Fraction(1, 10), "memory": Fraction(200 * 1024 * 1024)}
"""What kube-scheduler's scoring assumes for a pod that requests no cpu/memory (100m, 200Mi)."""


def _non_zero(requests: dict[str, Fraction]) -> dict[str, Fraction]:
    return {r: requests.get(r) or default for r, default in _NON_ZERO_DEFAULTS.items()}


class UnschedulableError(Exception):
    """The pod cannot be bound now; the message is what ``PodScheduled`` says."""


class Scheduler:
    def __init__(
        self,
        *,
        api: ControlPlaneApi,
        informers: InformerFactory,
        clock: Clock | None = None,
        scheduler_name: str = SCHEDULER_NAME,
    ) -> None:
        self._api = api
        self._clock = clock or SystemClock()
        self._name = scheduler_name
        self._pods = informers.informer(PODS)
        self._nodes = informers.informer(NODES)
        self._claims = informers.informer(RESOURCE_CLAIMS)
        self._events = EventRecorder(api=api, component=scheduler_name, clock=self._clock)
        self._loop = KeyedLoop(name="scheduler", sync=self._schedule, workers=1)
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._assumed: dict[str, tuple[str, JsonObject]] = {}  # pod uid -> (node, pod)
        self._requests_by_uid: dict[str, dict[str, Fraction]] = {}  # a pod's requests never change

    def start(self) -> None:
        ensure_index(self._pods, BY_CLAIM, pod_claim_keys)
        ensure_index(self._pods, BY_NODE, spec_node_name)
        self._pods.add_handler(
            on_add=self._on_pod, on_update=self._on_pod_update, on_delete=self._on_pod_delete
        )
        self._nodes.add_handler(
            on_add=lambda _: self._retry_pending(),
            on_update=self._on_node_update,
            on_delete=lambda _: self._retry_pending(),
        )
        self._claims.add_handler(on_add=self._on_claim, on_update=lambda _, c: self._on_claim(c))
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()

    # --- events ---------------------------------------------------------------------------------

    def _wants_scheduling(self, pod: JsonObject) -> bool:
        spec = pod.get("spec") or {}
        return (
            not node_name(pod)
            and not gate_names(pod)
            and not is_deleting(pod)
            and not is_terminal(pod)
            and (spec.get("schedulerName") or SCHEDULER_NAME) == self._name
        )

    def _on_pod(self, pod: JsonObject) -> None:
        if node_name(pod):
            with self._lock:
                self._assumed.pop(uid_of(pod), None)
        if self._wants_scheduling(pod):
            self._loop.add(object_key(pod))

    def _on_pod_update(self, old: JsonObject, pod: JsonObject) -> None:
        self._on_pod(pod)
        if node_name(pod) and is_terminal(pod) and not is_terminal(old):
            self._retry_pending()  # its resources are free again

    def _on_pod_delete(self, pod: JsonObject) -> None:
        with self._lock:
            self._assumed.pop(uid_of(pod), None)
            self._requests_by_uid.pop(uid_of(pod), None)
            self._pending.discard(object_key(pod))
        if node_name(pod):
            self._retry_pending()

    def _on_node_update(self, old: JsonObject, node: JsonObject) -> None:
        def relevant(n: JsonObject) -> tuple[object, ...]:
            return (
                metadata(n).get("labels"),
                n.get("spec"),
                (n.get("status") or {}).get("allocatable"),
            )

        if relevant(old) != relevant(node):
            self._retry_pending()

    def _on_claim(self, claim: JsonObject) -> None:
        key = key_for(name=name_of(claim), namespace=namespace_of(claim))
        for pod in self._pods.by_index(BY_CLAIM, key):
            if self._wants_scheduling(pod):
                self._loop.add(object_key(pod))

    def _retry_pending(self) -> None:
        with self._lock:
            pending = sorted(self._pending)
        for key in pending:
            self._loop.add(key)

    # --- one scheduling cycle -------------------------------------------------------------------

    def _schedule(self, key: str) -> None:
        pod = self._pods.get_by_key(key)
        if pod is None or not self._wants_scheduling(pod):
            with self._lock:
                self._pending.discard(key)
            return
        with self._lock:
            if uid_of(pod) in self._assumed:
                return  # bound already; the informer has not shown it yet
        try:
            claims = self._pod_claims(pod)
            node = self._choose_node(pod, claims)
        except UnschedulableError as exc:
            with self._lock:
                self._pending.add(key)
            self._mark_unschedulable(pod, "Unschedulable", str(exc))
            return
        with self._lock:
            self._pending.discard(key)
            self._assumed[uid_of(pod)] = (node, pod)
        try:
            reserved = self._reserve_claims(pod, claims)
            try:
                self._api.bind_pod(
                    namespace=namespace_of(pod) or "", name=name_of(pod), uid=uid_of(pod), node=node
                )
            except DriverError:
                self._unreserve_claims(pod, reserved)
                raise
        except DriverError as exc:
            with self._lock:
                self._assumed.pop(uid_of(pod), None)
            self._mark_unschedulable(pod, "SchedulerError", str(exc))
            raise
        log.info("bound pod %s to %s", key, node)
        self._events.record(
            pod,
            event_type=NORMAL,
            reason="Scheduled",
            message=f"Successfully assigned {key} to {node}",
        )

    def _pod_claims(self, pod: JsonObject) -> list[JsonObject]:
        try:
            refs = pod_claim_refs(pod)
        except ClaimNotCreatedError as exc:
            raise UnschedulableError(str(exc)) from exc
        claims: list[JsonObject] = []
        namespace = namespace_of(pod)
        for ref in refs:
            claim = self._claims.get(ref.claim_name, namespace=namespace)
            if claim is None:
                raise UnschedulableError(f'resourceclaim "{ref.claim_name}" not found')
            if ref.generated and not is_owned_by(claim, pod):
                raise UnschedulableError(
                    f"ResourceClaim {namespace}/{ref.claim_name} was not created for pod "
                    f"{namespace}/{name_of(pod)} (pod is not owner)"
                )
            if is_deleting(claim):
                raise UnschedulableError(f'resourceclaim "{ref.claim_name}" is being deleted')
            if allocation(claim) is None:
                raise UnschedulableError(
                    f'resourceclaim "{ref.claim_name}" is not allocated yet (this scheduler only '
                    "binds; the InstaSlice controller allocates)"
                )
            reserved = (claim.get("status") or {}).get("reservedFor") or []
            if not is_reserved_for(claim, pod) and len(reserved) >= MAX_RESERVED_FOR:
                raise UnschedulableError(f'resourceclaim "{ref.claim_name}" is in use')
            claims.append(claim)
        return claims

    def _choose_node(self, pod: JsonObject, claims: list[JsonObject]) -> str:
        nodes = sorted(self._nodes.list(), key=name_of)
        if not nodes:
            raise UnschedulableError(
                "0/0 nodes are available: no nodes available to schedule pods."
            )
        wanted = pod_requests(pod)
        reasons: Counter[str] = Counter()
        scored: list[tuple[Fraction, str]] = []
        for node in nodes:
            reason, score = self._filter(pod, node, claims, wanted)
            if reason is not None:
                reasons[reason] += 1
            else:
                scored.append((score, name_of(node)))
        if not scored:
            parts = sorted(f"{count} {reason}" for reason, count in reasons.items())
            raise UnschedulableError(f"0/{len(nodes)} nodes are available: {', '.join(parts)}.")
        return min(scored)[1]

    def _filter(
        self,
        pod: JsonObject,
        node: JsonObject,
        claims: list[JsonObject],
        wanted: dict[str, Fraction],
    ) -> tuple[str | None, Fraction]:
        """Why the node does not fit (None if it does) and its load after placing the pod."""
        spec = pod.get("spec") or {}
        if (node.get("spec") or {}).get("unschedulable") and untolerated_taint(
            pod, {"spec": {"taints": [{"key": _UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}]}}
        ):
            return "node(s) were unschedulable", Fraction(0)
        if not node_labels_match(node, spec.get("nodeSelector") or {}) or not (
            node_selector_matches(node, required_node_affinity(pod))
        ):
            return "node(s) didn't match Pod's node affinity/selector", Fraction(0)
        taint = untolerated_taint(pod, node)
        if taint is not None:
            return (
                f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}",
                Fraction(0),
            )
        for claim in claims:
            selector = (allocation(claim) or {}).get("nodeSelector")
            if not node_selector_matches(node, selector):
                return "resourceclaim not available on the node", Fraction(0)
        return self._fit(node, wanted)

    def _fit(self, node: JsonObject, wanted: dict[str, Fraction]) -> tuple[str | None, Fraction]:
        allocatable = node_allocatable(node)
        used: dict[str, Fraction] = {}
        pods = [p for p in self._pods.by_index(BY_NODE, name_of(node)) if not is_terminal(p)]
        with self._lock:
            bound_uids = {uid_of(p) for p in pods}
            pods += [
                p
                for n, p in self._assumed.values()
                if n == name_of(node) and uid_of(p) not in bound_uids
            ]
        scoring: dict[str, Fraction] = dict(_non_zero(wanted))
        for other in pods:
            requests = self._requests(other)
            for resource, value in requests.items():
                used[resource] = used.get(resource, Fraction(0)) + value
            for resource, value in _non_zero(requests).items():
                scoring[resource] = scoring.get(resource, Fraction(0)) + value
        if "pods" in allocatable and len(pods) + 1 > allocatable["pods"]:
            return "Too many pods", Fraction(0)
        for resource in sorted(wanted):
            need = wanted[resource]
            if need <= 0:
                continue
            have = allocatable.get(resource, Fraction(0)) - used.get(resource, Fraction(0))
            if need > have:
                return f"Insufficient {resource}", Fraction(0)
        fractions = [scoring[r] / allocatable[r] for r in ("cpu", "memory") if allocatable.get(r)]
        return None, sum(fractions, Fraction(0)) / max(1, len(fractions))

    def _requests(self, pod: JsonObject) -> dict[str, Fraction]:
        uid = uid_of(pod)
        with self._lock:
            cached = self._requests_by_uid.get(uid)
        if cached is None:
            cached = pod_requests(pod)
            with self._lock:
                self._requests_by_uid[uid] = cached
        return cached

    # --- PreBind / Unreserve --------------------------------------------------------------------

    def _reserve_claims(self, pod: JsonObject, claims: list[JsonObject]) -> list[JsonObject]:
        reserved: list[JsonObject] = []
        for claim in claims:
            current = claim
            for attempt in range(_ATTEMPTS):
                if is_reserved_for(current, pod):
                    break
                updated = copy.deepcopy(current)
                status = updated.setdefault("status", {})
                status["reservedFor"] = [*(status.get("reservedFor") or []), pod_reference(pod)]
                alloc = status.get("allocation")
                if isinstance(alloc, dict) and not alloc.get("allocationTimestamp"):
                    # kube-scheduler 1.36 fills it in; the API server refuses (docs/design.md F2).
                    alloc["allocationTimestamp"] = format_time(self._clock.now())
                try:
                    self._api.update_status(RESOURCE_CLAIMS, updated)
                    reserved.append(updated)
                    break
                except ConflictError:
                    if attempt == _ATTEMPTS - 1:
                        self._unreserve_claims(pod, reserved)
                        raise
                    current = self._api.get(
                        RESOURCE_CLAIMS, name=name_of(claim), namespace=namespace_of(claim)
                    )
                except DriverError:
                    self._unreserve_claims(pod, reserved)
                    raise
        return reserved

    def _unreserve_claims(self, pod: JsonObject, claims: list[JsonObject]) -> None:
        for claim in claims:
            for _ in range(_ATTEMPTS):
                try:
                    current = self._api.get(
                        RESOURCE_CLAIMS, name=name_of(claim), namespace=namespace_of(claim)
                    )
                    updated = copy.deepcopy(current)
                    status = updated.setdefault("status", {})
                    status["reservedFor"] = [
                        r for r in status.get("reservedFor") or [] if r.get("uid") != uid_of(pod)
                    ]
                    self._api.update_status(RESOURCE_CLAIMS, updated)
                    break
                except ConflictError:
                    continue
                except DriverError as exc:
                    log.warning("cannot unreserve claim %s: %s", name_of(claim), exc)
                    break

    def _mark_unschedulable(self, pod: JsonObject, reason: str, message: str) -> None:
        existing = next(
            (
                c
                for c in (pod.get("status") or {}).get("conditions") or []
                if c.get("type") == "PodScheduled"
            ),
            None,
        )
        if existing is not None and (existing.get("reason"), existing.get("message")) == (
            reason,
            message,
        ):
            return
        log.info("pod %s: %s: %s", object_key(pod), reason, message)
        try:
            set_pod_condition(
                self._api,
                pod=pod,
                condition_type="PodScheduled",
                status="False",
                reason=reason,
                message=message,
                now=self._clock.now(),
            )
        except (ApiNotFoundError, ConflictError):
            return
        self._events.record(pod, event_type=WARNING, reason="FailedScheduling", message=message)
