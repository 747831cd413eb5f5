"""The PriorityClass API as Kubernetes defines it (``pkg/apis/scheduling``): its numbers, the two
system classes, and the defaults a body gets when it is decoded.

Pure data and functions, no store: validation and the strategy read them under the store's lock.
User classes go up to one billion; the ``system-`` prefix is reserved for the system classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

JsonObj = dict[str, Any]

GROUP: Final = "scheduling.k8s.io"
HIGHEST_USER_DEFINABLE_PRIORITY: Final = 1_000_000_000
SYSTEM_CRITICAL_PRIORITY: Final = 2 * HIGHEST_USER_DEFINABLE_PRIORITY
SYSTEM_PREFIX: Final = "system-"
PREEMPT_LOWER_PRIORITY: Final = "PreemptLowerPriority"
PREEMPT_NEVER: Final = "Never"
PREEMPTION_POLICIES: Final = (PREEMPT_LOWER_PRIORITY, PREEMPT_NEVER)
"""In the order kube lists them in a ``NotSupported`` error."""
DEFAULT_PRIORITY: Final = 0
"""A pod's priority when it names no class and no class is the global default."""


@dataclass(frozen=True, slots=True)
class SystemPriorityClass:
    """One of the classes kube-apiserver creates at start; only these may be named ``system-*``,
    and only with this value and ``globalDefault`` false."""

    name: str
    value: int
    description: str

    def body(self) -> JsonObj:
        return {
            "apiVersion": f"{GROUP}/v1",
            "kind": "PriorityClass",
            "metadata": {"name": self.name},
            "value": self.value,
            "description": self.description,
        }


SYSTEM_PRIORITY_CLASSES: Final = (
    SystemPriorityClass(
        "system-node-critical",
        SYSTEM_CRITICAL_PRIORITY + 1000,
        "Used for system critical pods that must not be moved from their current node.",
    ),
    SystemPriorityClass(
        "system-cluster-critical",
        SYSTEM_CRITICAL_PRIORITY,
        "Used for system critical pods that must run in the cluster, but can be moved to "
        "another node if necessary.",
    ),
)


def system_class(name: str) -> SystemPriorityClass | None:
    return next((c for c in SYSTEM_PRIORITY_CLASSES if c.name == name), None)


def apply_priority_class_defaults(obj: JsonObj) -> None:
    """What decoding a ``v1.PriorityClass`` gives a body: ``value`` always present (a Go int32,
    not ``omitempty``), ``preemptionPolicy`` defaulted, a false ``globalDefault`` and an empty
    ``description`` left out (both ``omitempty``)."""
    if obj.get("value") is None:
        obj["value"] = DEFAULT_PRIORITY
    if obj.get("preemptionPolicy") is None:
        obj["preemptionPolicy"] = PREEMPT_LOWER_PRIORITY
    for key in ("globalDefault", "description"):
        if key in obj and not obj[key]:
            del obj[key]
