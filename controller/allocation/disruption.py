"""PodDisruptionBudgets as preemption must respect them: which budgets a pod counts against, and
how many more evictions each one allows now.

A victim is evicted through the Eviction API, which refuses (HTTP 429) an eviction that its
budget does not allow; so the victims are chosen to violate no budget, counted the way
kube-scheduler's preemption counts them (``filterPodsWithPDBViolation``): victims are taken one
after another, each decrementing ``status.disruptionsAllowed`` of every budget that selects it; a
victim that finds a budget at zero violates it. A pod that is not Ready never counts against a
budget (the disruption controller does not count it as healthy).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from api import wire
from driver.cluster.port import JsonObject
from driver.cluster.views import PodView


def _matches_expression(labels: Mapping[str, str], expression: Mapping[str, Any]) -> bool:
    key = str(expression.get("key", ""))
    operator = expression.get("operator")
    values = {str(v) for v in expression.get("values") or ()}
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    return False  # an operator the API would have refused: select nothing


def selects(selector: Any, labels: Mapping[str, str]) -> bool:
    """``metav1.LabelSelector`` as policy/v1 reads it: null selects nothing, empty everything."""
    if not isinstance(selector, Mapping):
        return False
    match_labels = selector.get("matchLabels") or {}
    if any(labels.get(str(k)) != str(v) for k, v in match_labels.items()):
        return False
    expressions = selector.get("matchExpressions") or ()
    return all(isinstance(e, Mapping) and _matches_expression(labels, e) for e in expressions)


@dataclass(frozen=True, slots=True)
class Budget:
    key: str
    """``namespace/name``."""
    namespace: str
    selector: Any
    allowed: int

    @classmethod
    def of(cls, obj: JsonObject) -> Budget:
        pdb = cast(wire.PodDisruptionBudget, obj)  # as the API server validated it
        meta = pdb.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        status = pdb.get("status") or {}
        allowed = status.get("disruptionsAllowed")
        return cls(
            key=f"{namespace}/{meta.get('name', '')}",
            namespace=namespace,
            selector=(pdb.get("spec") or {}).get("selector"),
            # no status yet: the disruption controller has not counted it, so allow nothing
            allowed=allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0,
        )


def _ready(pod: PodView) -> bool:
    condition = pod.condition("Ready")
    return condition is not None and condition.status == "True"


class Budgets:
    """The budgets of the cluster, for one preemption decision."""

    def __init__(self, pdbs: Iterable[JsonObject]) -> None:
        self._by_namespace: dict[str, list[Budget]] = {}
        for pdb in pdbs:
            budget = Budget.of(pdb)
            self._by_namespace.setdefault(budget.namespace, []).append(budget)

    def of(self, pod: PodView) -> tuple[Budget, ...]:
        """The budgets a pod counts against (none when it is not Ready)."""
        if not _ready(pod):
            return ()
        namespace = pod.namespace or "default"
        labels = pod.meta.labels
        return tuple(
            b for b in self._by_namespace.get(namespace, ()) if selects(b.selector, labels)
        )

    @staticmethod
    def violations(victims: Sequence[tuple[Budget, ...]]) -> tuple[int, tuple[str, ...]]:
        """How many of ``victims`` (each given by its budgets) an eviction would refuse, and the
        budgets that refuse them."""
        left: dict[str, int] = {}
        count = 0
        refusing: list[str] = []
        for budgets in victims:
            violated = False
            for budget in budgets:
                remaining = left.get(budget.key, budget.allowed)
                if remaining <= 0:
                    violated = True
                    if budget.key not in refusing:
                        refusing.append(budget.key)
                left[budget.key] = remaining - 1
            count += violated
        return count, tuple(refusing)
