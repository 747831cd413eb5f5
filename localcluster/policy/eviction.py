"""``pods/eviction`` as kube-apiserver's eviction REST (``pkg/registry/core/pod/storage``) decides
it: delete the pod unless its PodDisruptionBudget allows no disruption now.

* A pod that is ``Pending``, terminal or already being deleted goes at once: evicting it disrupts
  nothing (a ``Pending`` one under a resourceVersion precondition, so it cannot turn Ready first).
* More than one budget selecting the pod: 500, the subresource does not support that.
* A pod that is not Ready goes without using up the budget when the budget says
  ``unhealthyPodEvictionPolicy: AlwaysAllow``, or when its healthy pods already reach the desired
  number (``IfHealthyBudget``, the default); otherwise the budget decides as for a Ready one.
* Otherwise the budget must be current (``observedGeneration``) and allow a disruption: its
  ``disruptionsAllowed`` is decremented and the pod recorded in ``disruptedPods`` (the disruption
  controller drops it once it sees the pod deleting), else 429 ``TooManyRequests`` with a
  ``DisruptionBudget`` cause saying why.

The pod then gets the ``DisruptionTarget`` condition and is deleted with the eviction's
``deleteOptions`` (preconditions, grace period, propagation). Writes race as in kube: budget and
pod are written with resourceVersion preconditions and retried on conflict.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from localcluster import errors
from localcluster.errors import ApiError
from localcluster.policy import budgets
from localcluster.resources import POD_DISRUPTION_BUDGETS, PODS
from localcluster.selectors import ObjectFilter
from localcluster.store import Store, meta, now_rfc3339

JsonObj = dict[str, Any]

log = logging.getLogger(__name__)

VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."
MULTIPLE_BUDGETS = (
    "This pod has more than one PodDisruptionBudget, "
    "which the eviction subresource does not support."
)
DISRUPTION_BUDGET_CAUSE = "DisruptionBudget"
MAX_DISRUPTED_PODS = 2000
_RETRIES = 20  # kube's EvictionsRetry steps
_SUCCESS: JsonObj = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Success",
    "code": 201,
}


@dataclass(frozen=True, slots=True)
class EvictionOptions:
    """What of the eviction's ``deleteOptions`` this server honours."""

    uid: str | None = None
    resource_version: str | None = None
    grace_seconds: int | None = None
    propagation: str | None = None

    @classmethod
    def from_delete_options(cls, options: Any) -> EvictionOptions:
        if options is None:
            return cls()
        if not isinstance(options, dict):
            raise errors.bad_request("deleteOptions must be a JSON object")
        if options.get("dryRun"):
            raise errors.bad_request("dryRun is not supported by the local API server")
        preconditions = options.get("preconditions") or {}
        grace = options.get("gracePeriodSeconds")
        return cls(
            uid=preconditions.get("uid") or None,
            resource_version=preconditions.get("resourceVersion") or None,
            grace_seconds=int(grace) if grace is not None else None,
            propagation=options.get("propagationPolicy"),
        )


def evict_pod(store: Store, *, namespace: str, name: str, options: EvictionOptions) -> JsonObj:
    """Evict or refuse (``ApiError``); returns the ``Status`` to answer, which is a failure with
    code 500 when several budgets select the pod (kube answers that one as a result, not an
    error)."""
    pod = _evict_if_undisruptive(store, namespace, name, options)
    if pod is None:
        return dict(_SUCCESS)
    matching = [
        pdb
        for pdb in store.list_objects(POD_DISRUPTION_BUDGETS, ObjectFilter(namespace=namespace))[0]
        if budgets.selects(pdb, pod)
    ]
    if len(matching) > 1:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": MULTIPLE_BUDGETS,
            "code": 500,
        }
    unhealthy_goes = bool(matching) and _unhealthy_may_go(matching[0], pod)
    if matching and not unhealthy_goes:
        _check_and_decrement(store, matching[0], pod_name=name)
    delete_options = options
    if unhealthy_goes and options.resource_version is None:
        # the pod must not have turned Ready since the budget was read
        delete_options = replace(options, resource_version=_rv(pod))
    try:
        _mark_and_delete(store, namespace, name, delete_options)
    except ApiError as exc:
        if exc.code == 409 and unhealthy_goes and options.resource_version is None:
            raise _still_processing(str(meta(matching[0]).get("name"))) from exc
        raise
    log.debug("evicted pod %s/%s", namespace, name)
    return dict(_SUCCESS)


def _evict_if_undisruptive(
    store: Store, namespace: str, name: str, options: EvictionOptions
) -> JsonObj | None:
    """Delete a pod whose eviction disrupts nothing (None); else the pod, for the budget check."""
    conflict: ApiError | None = None
    for _ in range(_RETRIES):
        pod = store.get(PODS, namespace, name)
        deleting = "deletionTimestamp" in meta(pod)
        phase = (pod.get("status") or {}).get("phase")
        if not (deleting or phase == "Pending" or budgets.is_terminal(pod)):
            return pod
        delete_options = options
        if options.resource_version is None and not (deleting or budgets.is_terminal(pod)):
            delete_options = replace(options, resource_version=_rv(pod))
        try:
            _mark_and_delete(store, namespace, name, delete_options)
        except ApiError as exc:
            if exc.code != 409 or options.resource_version is not None:
                raise
            conflict = exc  # the pod changed meanwhile: decide again on its new state
            continue
        return None
    assert conflict is not None
    raise conflict


def _unhealthy_may_go(pdb: JsonObj, pod: JsonObj) -> bool:
    """A pod that is not Ready may go without using the budget up, when the budget allows."""
    if budgets.is_pod_ready(pod):
        return False
    if (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") == budgets.ALWAYS_ALLOW:
        return True
    status = pdb.get("status") or {}
    desired = int(status.get("desiredHealthy") or 0)
    return int(status.get("currentHealthy") or 0) >= desired > 0


def _check_and_decrement(store: Store, pdb: JsonObj, *, pod_name: str) -> None:
    """Take one disruption from the budget, or refuse; retried on a budget written meanwhile."""
    namespace, name = str(meta(pdb).get("namespace")), str(meta(pdb)["name"])
    for _ in range(_RETRIES):
        status = dict(pdb.get("status") or {})
        _refuse_unless_allowed(pdb, status)
        now = datetime.now(UTC)
        status["disruptionsAllowed"] = int(status.get("disruptionsAllowed") or 0) - 1
        if status["disruptionsAllowed"] == 0:
            status["conditions"] = budgets.set_condition(
                list(status.get("conditions") or []), budgets.allowed_condition(status), now
            )
        disrupted = dict(status.get("disruptedPods") or {})
        disrupted[pod_name] = budgets.format_time(now)
        status["disruptedPods"] = disrupted
        try:
            store.update(
                POD_DISRUPTION_BUDGETS,
                namespace,
                name,
                {**pdb, "status": status},
                subresource="status",
                expect_rv=str(meta(pdb).get("resourceVersion")),
            )
        except ApiError as exc:
            if exc.code != 409:
                raise
            pdb = store.get(POD_DISRUPTION_BUDGETS, namespace, name)
            continue
        return
    raise ApiError(
        504,
        "Timeout",
        f'Timeout: couldn\'t update PodDisruptionBudget "{name}" due to conflicts',
        {"retryAfterSeconds": 10},
    )


def _refuse_unless_allowed(pdb: JsonObj, status: JsonObj) -> None:
    """``checkAndDecrement``'s refusals, in its order."""
    name = str(meta(pdb)["name"])
    if int(status.get("observedGeneration") or 0) < int(meta(pdb).get("generation") or 0):
        raise _still_processing(name)
    allowed = int(status.get("disruptionsAllowed") or 0)
    if allowed < 0:
        raise _forbidden(name, "pdb disruptions allowed is negative")
    if len(status.get("disruptedPods") or {}) > MAX_DISRUPTED_PODS:
        raise _forbidden(
            name, "DisruptedPods map too big - too many evictions not confirmed by PDB controller"
        )
    if allowed == 0:
        raise _too_many_requests(_refusal_reason(name, status), retry_after=0)


def _refusal_reason(name: str, status: JsonObj) -> str:
    condition = next(
        (
            c
            for c in status.get("conditions") or []
            if isinstance(c, dict) and c.get("type") == budgets.DISRUPTION_ALLOWED
        ),
        None,
    )
    blocked = condition is not None and condition.get("status") == "False"
    message = str((condition or {}).get("message") or "")
    reason = str((condition or {}).get("reason") or "")
    healthy = int(status.get("currentHealthy") or 0)
    desired = int(status.get("desiredHealthy") or 0)
    if blocked and message and reason == budgets.SYNC_FAILED:
        return (
            f"The disruption budget {name} does not allow evicting pods currently because it "
            f"failed sync: {message}"
        )
    if healthy <= desired:
        return (
            f"The disruption budget {name} needs {desired} healthy pods and has {healthy} currently"
        )
    if blocked and message:
        return (
            f"The disruption budget {name} does not allow evicting pods currently "
            f"({reason}): {message}"
        )
    return f"The disruption budget {name} does not allow evicting pods currently"


def _mark_and_delete(store: Store, namespace: str, name: str, options: EvictionOptions) -> None:
    """``addConditionAndDeletePod``: preconditions checked against the latest pod, the
    ``DisruptionTarget`` condition added, then the delete (a resourceVersion precondition moves
    to the version the condition wrote)."""

    def mark(pod: JsonObj) -> JsonObj:
        uid, rv = meta(pod).get("uid"), _rv(pod)
        if options.uid and options.uid != uid:
            raise _pod_conflict(
                name,
                f"the UID in the precondition ({options.uid}) does not match the UID in record "
                f"({uid}). The object might have been deleted and then recreated",
            )
        if options.resource_version and options.resource_version != rv:
            raise _pod_conflict(
                name,
                f"the ResourceVersion in the precondition ({options.resource_version}) does not "
                f"match the ResourceVersion in record ({rv}). The object might have been modified",
            )
        return _with_disruption_target(pod)

    marked = store.mutate(PODS, namespace, name, mark)
    store.delete(
        PODS,
        namespace,
        name,
        propagation=options.propagation,
        precondition_uid=options.uid,
        precondition_rv=_rv(marked) if options.resource_version else None,
        grace_seconds=options.grace_seconds,
    )


def _with_disruption_target(pod: JsonObj) -> JsonObj:
    status = dict(pod.get("status") or {})
    conditions = list(status.get("conditions") or [])
    for i, condition in enumerate(conditions):
        if isinstance(condition, dict) and condition.get("type") == "DisruptionTarget":
            since = condition.get("lastTransitionTime")
            if condition.get("status") != "True" or not since:
                since = now_rfc3339()
            conditions[i] = {**_DISRUPTION_TARGET, "lastTransitionTime": since}
            break
    else:
        conditions.append({**_DISRUPTION_TARGET, "lastTransitionTime": now_rfc3339()})
    status["conditions"] = conditions
    return {**pod, "status": status}


_DISRUPTION_TARGET: JsonObj = {
    "type": "DisruptionTarget",
    "status": "True",
    "lastProbeTime": None,
    "reason": "EvictionByEvictionAPI",
    "message": "Eviction API: evicting",
}


def _rv(obj: JsonObj) -> str:
    return str(meta(obj).get("resourceVersion") or "")


def _too_many_requests(cause: str, *, retry_after: int) -> ApiError:
    details: JsonObj = {"causes": [{"reason": DISRUPTION_BUDGET_CAUSE, "message": cause}]}
    if retry_after:
        details["retryAfterSeconds"] = retry_after
    return ApiError(429, "TooManyRequests", VIOLATION, details)


def _still_processing(name: str) -> ApiError:
    return _too_many_requests(
        f"The disruption budget {name} is still being processed by the server.", retry_after=10
    )


def _forbidden(name: str, why: str) -> ApiError:
    return ApiError(
        403,
        "Forbidden",
        f'poddisruptionbudget.policy "{name}" is forbidden: {why}',
        {"name": name, "group": "policy", "kind": "poddisruptionbudget"},
    )


def _pod_conflict(name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on Pod "{name}": {why}',
        {"name": name, "kind": "Pod"},
    )
