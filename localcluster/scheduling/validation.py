"""kube-apiserver's validation of a PriorityClass (``pkg/apis/scheduling/validation``).

On create: a ``system-`` name only for a system class with its own value and ``globalDefault``
false, any other class at most one billion, ``preemptionPolicy`` ``PreemptLowerPriority`` or
``Never``. On update only ``value`` and ``preemptionPolicy`` are checked, both immutable: kube's
``ValidatePriorityClassUpdate`` does not repeat the create rules (metadata is checked for every
kind). At most one ``globalDefault`` is the ``Priority`` admission plugin's rule, not this one's.
"""

from __future__ import annotations

from typing import Any

from localcluster.errors import FieldError
from localcluster.scheduling.api import (
    HIGHEST_USER_DEFINABLE_PRIORITY,
    PREEMPTION_POLICIES,
    SYSTEM_PREFIX,
    system_class,
)

JsonObj = dict[str, Any]


def priority_class(pc: JsonObj) -> list[FieldError]:
    """``ValidatePriorityClass``."""
    name = str((pc.get("metadata") or {}).get("name") or "")
    value = pc.get("value")
    errors: list[FieldError] = []
    if name.startswith(SYSTEM_PREFIX):
        why = _not_system_class(name, value, global_default=pc.get("globalDefault") is True)
        if why:
            errors.append(
                FieldError(
                    "Forbidden",
                    "metadata.name",
                    f"priority class names with '{SYSTEM_PREFIX}' prefix are reserved for "
                    f"system use only. error: {why}",
                )
            )
    elif isinstance(value, int) and value > HIGHEST_USER_DEFINABLE_PRIORITY:
        errors.append(
            FieldError(
                "Forbidden",
                "value",
                "maximum allowed value of a user defined priority is "
                f"{HIGHEST_USER_DEFINABLE_PRIORITY}",
            )
        )
    policy = pc.get("preemptionPolicy")
    if policy is not None:
        errors += preemption_policy_errors("preemptionPolicy", policy)
    return errors


def priority_class_update(old: JsonObj, new: JsonObj) -> list[FieldError]:
    """``ValidatePriorityClassUpdate``: ``value`` and ``preemptionPolicy`` immutable."""
    errors: list[FieldError] = []
    if new.get("value") != old.get("value"):
        errors.append(FieldError("Forbidden", "value", "may not be changed in an update."))
    if new.get("preemptionPolicy") != old.get("preemptionPolicy"):
        errors.append(
            FieldError(
                "Invalid", "preemptionPolicy", "field is immutable", new.get("preemptionPolicy")
            )
        )
    return errors


def preemption_policy_errors(field: str, policy: Any) -> list[FieldError]:
    """``ValidatePreemptionPolicy``, for a class and for a pod."""
    if policy in PREEMPTION_POLICIES:
        return []
    if policy == "":
        return [FieldError("Required", field)]
    supported = ", ".join(f'"{p}"' for p in PREEMPTION_POLICIES)
    return [FieldError("NotSupported", field, f"supported values: {supported}", policy)]


def _not_system_class(name: str, value: Any, *, global_default: bool) -> str:
    """Why a ``system-`` class is not a known system class (``IsKnownSystemPriorityClass``);
    empty when it is one."""
    system = system_class(name)
    if system is None:
        return f"{name} is not a known system priority class"
    if value != system.value:
        return f"value of {name} PriorityClass must be {system.value}"
    if global_default:
        return f"globalDefault of {name} PriorityClass must be false"
    return ""
