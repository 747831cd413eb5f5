"""A PodDisruptionBudget's numbers, as kube-controller-manager's disruption controller computes
them (``pkg/controller/disruption``). Pure functions over wire JSON; the controller and the
eviction subresource are the callers.

* The pods of a budget: pods of its namespace that its selector matches. A missing selector matches
  none, an empty one (``{}``) every pod (``policy/v1``).
* ``expectedPods`` and ``desiredHealthy``: an integer ``minAvailable`` counts the matching pods
  and asks for that many healthy; a percentage of ``minAvailable`` and any ``maxUnavailable`` are
  taken of the replicas of the pods' controllers (Deployment, ReplicaSet, StatefulSet), rounded
  up; pods without a controller do not count there. Neither set: nothing is expected.
* ``currentHealthy``: matching pods that are Ready, not terminal, not being deleted and not
  listed in ``disruptedPods`` (an eviction in flight) within the deletion timeout.
* ``disruptionsAllowed``: ``currentHealthy - desiredHealthy``, never below 0, and 0 while no pod
  is expected (a budget whose pods have not appeared yet protects them when they do).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from localcluster.errors import ApiError
from localcluster.selectors import LabelSelector, label_selector_from_object

JsonObj = dict[str, Any]

DELETION_TIMEOUT = timedelta(minutes=2)
"""How long an eviction's entry in ``disruptedPods`` holds before the pod must be seen deleting."""
DISRUPTION_ALLOWED = "DisruptionAllowed"
SUFFICIENT_PODS = "SufficientPods"
INSUFFICIENT_PODS = "InsufficientPods"
SYNC_FAILED = "SyncFailed"
ALWAYS_ALLOW = "AlwaysAllow"
TERMINAL_PHASES = ("Succeeded", "Failed")

ControllerScale = Callable[[JsonObj, str], tuple[str, int] | None]
"""``(controllerRef, namespace)`` → the controller's ``(uid, replicas)``, None when it is not
found; raises :class:`BudgetSyncError` for a kind without a scale."""


class BudgetSyncError(Exception):
    """The numbers cannot be computed (a pod's controller is unknown): the budget fails safe."""


@dataclass(frozen=True, slots=True)
class Expectation:
    expected_pods: int
    desired_healthy: int
    unmanaged_pods: tuple[str, ...] = ()


def _meta(obj: JsonObj) -> JsonObj:
    value = obj.get("metadata")
    return value if isinstance(value, dict) else {}


def budget_selector(pdb: JsonObj) -> LabelSelector | None:
    """The budget's selector; None when it selects nothing (absent or unusable)."""
    selector = (pdb.get("spec") or {}).get("selector")
    if not isinstance(selector, dict):
        return None
    try:
        return label_selector_from_object(selector) if selector else LabelSelector()
    except ApiError:
        return None


def selects(pdb: JsonObj, pod: JsonObj) -> bool:
    """Same namespace and the selector matches the pod's labels."""
    if _meta(pdb).get("namespace") != _meta(pod).get("namespace"):
        return False
    selector = budget_selector(pdb)
    return selector is not None and selector.matches(_meta(pod).get("labels"))


def is_pod_ready(pod: JsonObj) -> bool:
    """``podutil.IsPodReady``: the ``Ready`` condition is ``True``."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def is_terminal(pod: JsonObj) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def scaled_value(value: int | str, total: int) -> int:
    """``intstr.GetScaledValueFromIntOrPercent`` rounding up: an int as is, ``"N%"`` of total."""
    if isinstance(value, str):
        return math.ceil(int(value.rstrip("%")) * total / 100)
    return int(value)


def expectation(pdb: JsonObj, pods: list[JsonObj], scale_of: ControllerScale) -> Expectation:
    """``getExpectedPodCount``."""
    spec = pdb.get("spec") or {}
    max_unavailable, min_available = spec.get("maxUnavailable"), spec.get("minAvailable")
    if max_unavailable is not None:
        expected, unmanaged = _expected_scale(pods, scale_of)
        desired = max(0, expected - scaled_value(max_unavailable, expected))
        return Expectation(expected, desired, unmanaged)
    if isinstance(min_available, str):
        expected, unmanaged = _expected_scale(pods, scale_of)
        return Expectation(expected, scaled_value(min_available, expected), unmanaged)
    if min_available is not None:
        return Expectation(len(pods), int(min_available))
    return Expectation(0, 0)


def controller_ref(obj: JsonObj) -> JsonObj | None:
    """``metav1.GetControllerOf``: the owner reference with ``controller: true``."""
    for ref in _meta(obj).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller") is True:
            return ref
    return None


def _expected_scale(pods: list[JsonObj], scale_of: ControllerScale) -> tuple[int, tuple[str, ...]]:
    """``getExpectedScale``: the replicas of every distinct controller of the pods."""
    scales: dict[str, int] = {}
    unmanaged: list[str] = []
    for pod in pods:
        ref = controller_ref(pod)
        if ref is None:
            unmanaged.append(str(_meta(pod).get("name")))
            continue
        if str(ref.get("uid")) in scales:
            continue
        found = scale_of(ref, str(_meta(pod).get("namespace") or ""))
        if found is None:
            raise BudgetSyncError(f'found no controllers for pod "{_meta(pod).get("name")}"')
        uid, replicas = found
        scales[uid] = replicas
    return sum(scales.values()), tuple(unmanaged)


def parse_time(text: Any) -> datetime | None:
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def disrupted_pods(
    pdb: JsonObj, pods: list[JsonObj], now: datetime, timeout: timedelta
) -> tuple[dict[str, str], datetime | None]:
    """``buildDisruptedPodMap``: the entries still pending (pod present, not yet deleting, within
    the timeout) and when the earliest of them runs out."""
    recorded = (pdb.get("status") or {}).get("disruptedPods") or {}
    kept: dict[str, str] = {}
    recheck: datetime | None = None
    for pod in pods:
        name = str(_meta(pod).get("name"))
        if "deletionTimestamp" in _meta(pod) or name not in recorded:
            continue
        since = parse_time(recorded[name])
        if since is None or since + timeout < now:
            continue
        kept[name] = recorded[name]
        if recheck is None or since + timeout < recheck:
            recheck = since + timeout
    return kept, recheck


def current_healthy(pods: Iterable[JsonObj], disrupted: dict[str, str]) -> int:
    """``countHealthyPods`` (``disrupted`` already holds only unexpired entries). Terminal pods
    never count: their kubelet has turned them not Ready."""
    return sum(
        1
        for pod in pods
        if "deletionTimestamp" not in _meta(pod)
        and str(_meta(pod).get("name")) not in disrupted
        and not is_terminal(pod)
        and is_pod_ready(pod)
    )


def set_condition(conditions: list[JsonObj], condition: JsonObj, now: datetime) -> list[JsonObj]:
    """``meta.SetStatusCondition``: a new list; the transition time moves only with the status."""
    result: list[JsonObj] = []
    found = False
    for existing in conditions:
        if isinstance(existing, dict) and existing.get("type") == condition["type"]:
            found = True
            moved = existing.get("status") != condition["status"]
            since = format_time(now) if moved else existing.get("lastTransitionTime")
            result.append({**condition, "lastTransitionTime": since or format_time(now)})
        else:
            result.append(existing)
    if not found:
        result.append({**condition, "lastTransitionTime": format_time(now)})
    return result


def allowed_condition(status: JsonObj) -> JsonObj:
    """``UpdateDisruptionAllowedCondition``'s condition for the status's ``disruptionsAllowed``."""
    allowed = int(status.get("disruptionsAllowed") or 0) > 0
    return _condition(
        status,
        allowed=allowed,
        reason=SUFFICIENT_PODS if allowed else INSUFFICIENT_PODS,
        message="",
    )


def _condition(status: JsonObj, *, allowed: bool, reason: str, message: str) -> JsonObj:
    condition: JsonObj = {
        "type": DISRUPTION_ALLOWED,
        "status": "True" if allowed else "False",
        "reason": reason,
        "message": message,
    }
    generation = int(status.get("observedGeneration") or 0)
    if generation:  # omitempty, as the wire has it
        condition["observedGeneration"] = generation
    return condition


def synced_status(
    pdb: JsonObj,
    *,
    expected: Expectation,
    healthy: int,
    disrupted: dict[str, str],
    now: datetime,
) -> JsonObj:
    """``updatePdbStatus``: the status the controller writes after a successful sync."""
    allowed = healthy - expected.desired_healthy
    if expected.expected_pods <= 0 or allowed <= 0:
        allowed = 0
    status: JsonObj = {
        "currentHealthy": healthy,
        "desiredHealthy": expected.desired_healthy,
        "expectedPods": expected.expected_pods,
        "disruptionsAllowed": allowed,
    }
    if disrupted:
        status["disruptedPods"] = dict(disrupted)
    generation = int(_meta(pdb).get("generation") or 0)
    if generation:
        status["observedGeneration"] = generation
    old_conditions = list((pdb.get("status") or {}).get("conditions") or [])
    status["conditions"] = set_condition(old_conditions, allowed_condition(status), now)
    return status


def failed_status(pdb: JsonObj, message: str, now: datetime) -> JsonObj:
    """``failSafe``: no disruption allowed, the rest of the status kept, the reason recorded."""
    status = {**(pdb.get("status") or {}), "disruptionsAllowed": 0}
    condition = _condition(status, allowed=False, reason=SYNC_FAILED, message=message)
    status["conditions"] = set_condition(list(status.get("conditions") or []), condition, now)
    return status
