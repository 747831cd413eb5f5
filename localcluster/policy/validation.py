"""kube-apiserver's validation of a PodDisruptionBudget (``pkg/apis/policy/validation``).

At most one of ``minAvailable`` and ``maxUnavailable``, each a non-negative integer or a percent
string up to 100%; neither is valid too (the budget then expects no pods and allows no disruption
of healthy ones). The selector is a ``metav1.LabelSelector`` checked as ``ValidateLabelSelector``
does; ``unhealthyPodEvictionPolicy`` is ``IfHealthyBudget`` or ``AlwaysAllow``. A status write
keeps its counts non-negative and its conditions well formed.
"""

from __future__ import annotations

import re
from typing import Any

from localcluster.errors import FieldError
from localcluster.names import label_value_errors, qualified_name_errors

JsonObj = dict[str, Any]

UNHEALTHY_POD_EVICTION_POLICIES = ("AlwaysAllow", "IfHealthyBudget")
_PERCENT = re.compile(r"^[0-9]+%$")
_PERCENT_DETAIL = (
    "a valid percent string must be a numeric string followed by an ending '%' "
    "(e.g. '1%' or '93%', regex used for validation is '[0-9]+%')"
)
_NON_NEGATIVE = "must be greater than or equal to 0"
_STATUS_COUNTS = ("disruptionsAllowed", "currentHealthy", "desiredHealthy", "expectedPods")
_CONDITION_STATUSES = ("True", "False", "Unknown")
_CONDITION_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_MAX_CONDITION_MESSAGE = 32768


def budget(pdb: JsonObj) -> list[FieldError]:
    """``ValidatePodDisruptionBudget``: the spec (metadata is checked for every kind)."""
    spec = pdb.get("spec") or {}
    if not isinstance(spec, dict):
        return [FieldError("Invalid", "spec", "must be an object", spec)]
    errors: list[FieldError] = []
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        errors.append(
            FieldError(
                "Invalid", "spec", "minAvailable and maxUnavailable cannot be both set", spec
            )
        )
    for key in ("minAvailable", "maxUnavailable"):
        if spec.get(key) is not None:
            errors += int_or_percent_errors(f"spec.{key}", spec[key])
    errors += label_selector_errors("spec.selector", spec.get("selector"))
    policy = spec.get("unhealthyPodEvictionPolicy")
    if policy is not None and policy not in UNHEALTHY_POD_EVICTION_POLICIES:
        supported = ", ".join(f'"{p}"' for p in UNHEALTHY_POD_EVICTION_POLICIES)
        errors.append(
            FieldError(
                "NotSupported",
                "spec.unhealthyPodEvictionPolicy",
                f"supported values: {supported}",
                policy,
            )
        )
    return errors


def int_or_percent_errors(path: str, value: Any) -> list[FieldError]:
    """``ValidatePositiveIntOrPercent`` and ``IsNotMoreThan100Percent``."""
    if isinstance(value, str):
        if not _PERCENT.match(value):
            return [FieldError("Invalid", path, _PERCENT_DETAIL, value)]
        if int(value[:-1]) > 100:
            return [FieldError("Invalid", path, "must not be greater than 100%", value)]
        return []
    if isinstance(value, int) and not isinstance(value, bool):
        return [FieldError("Invalid", path, _NON_NEGATIVE, value)] if value < 0 else []
    return [FieldError("Invalid", path, "must be an integer or percentage (e.g '5%')", value)]


def label_selector_errors(path: str, selector: Any) -> list[FieldError]:
    """``ValidateLabelSelector``: label keys and values, and each expression's operator with
    the values it needs (In/NotIn some, Exists/DoesNotExist none)."""
    if selector is None:
        return []
    if not isinstance(selector, dict):
        return [FieldError("Invalid", path, "must be a label selector object", selector)]
    errors: list[FieldError] = []
    match_labels = selector.get("matchLabels") or {}
    if not isinstance(match_labels, dict):
        return [FieldError("Invalid", f"{path}.matchLabels", "must be a map", match_labels)]
    for key, value in match_labels.items():
        errors += qualified_name_errors(f"{path}.matchLabels", str(key))
        errors += label_value_errors(f"{path}.matchLabels", str(value))
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, list):
        return [FieldError("Invalid", f"{path}.matchExpressions", "must be a list", expressions)]
    for i, expression in enumerate(expressions):
        errors += _requirement_errors(f"{path}.matchExpressions[{i}]", expression)
    return errors


def _requirement_errors(path: str, requirement: Any) -> list[FieldError]:
    if not isinstance(requirement, dict):
        return [FieldError("Invalid", path, "must be an object", requirement)]
    errors: list[FieldError] = []
    operator = requirement.get("operator")
    values = requirement.get("values") or []
    if operator in ("In", "NotIn"):
        if not values:
            errors.append(
                FieldError(
                    "Required",
                    f"{path}.values",
                    "must be specified when `operator` is 'In' or 'NotIn'",
                )
            )
    elif operator in ("Exists", "DoesNotExist"):
        if values:
            errors.append(
                FieldError(
                    "Forbidden",
                    f"{path}.values",
                    "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                )
            )
    else:
        errors.append(
            FieldError("Invalid", f"{path}.operator", "not a valid selector operator", operator)
        )
    errors += qualified_name_errors(f"{path}.key", str(requirement.get("key") or ""))
    for j, value in enumerate(values):
        errors += label_value_errors(f"{path}.values[{j}]", str(value))
    return errors


def status_update(_old: JsonObj, new: JsonObj) -> list[FieldError]:
    """``ValidatePodDisruptionBudgetStatusUpdate`` for ``policy/v1``."""
    status = new.get("status") or {}
    errors: list[FieldError] = []
    for key in _STATUS_COUNTS:
        value = status.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool):
            errors.append(FieldError("Invalid", f"status.{key}", "must be an integer", value))
        elif value < 0:
            errors.append(FieldError("Invalid", f"status.{key}", _NON_NEGATIVE, value))
    for i, condition in enumerate(status.get("conditions") or []):
        errors += _condition_errors(f"status.conditions[{i}]", condition)
    return errors


def _condition_errors(path: str, condition: Any) -> list[FieldError]:
    """``metav1validation.ValidateCondition``."""
    if not isinstance(condition, dict):
        return [FieldError("Invalid", path, "must be an object", condition)]
    errors = qualified_name_errors(f"{path}.type", str(condition.get("type") or ""))
    status = condition.get("status")
    if status not in _CONDITION_STATUSES:
        supported = ", ".join(f'"{s}"' for s in _CONDITION_STATUSES)
        errors.append(
            FieldError("NotSupported", f"{path}.status", f"supported values: {supported}", status)
        )
    if int(condition.get("observedGeneration") or 0) < 0:
        errors.append(
            FieldError(
                "Invalid",
                f"{path}.observedGeneration",
                _NON_NEGATIVE,
                condition.get("observedGeneration"),
            )
        )
    if not condition.get("lastTransitionTime"):
        errors.append(FieldError("Required", f"{path}.lastTransitionTime", "must be set"))
    reason = str(condition.get("reason") or "")
    if not reason:
        errors.append(FieldError("Required", f"{path}.reason", "reason must be specified"))
    elif len(reason) > 1024 or not _CONDITION_REASON.match(reason):
        errors.append(
            FieldError(
                "Invalid",
                f"{path}.reason",
                "a condition reason must start with alphabetic character, optionally followed by "
                "a string of alphanumeric characters or '_,:', and must end with an alphanumeric "
                "character or '_'",
                reason,
            )
        )
    if len(str(condition.get("message") or "")) > _MAX_CONDITION_MESSAGE:
        errors.append(FieldError("TooLong", f"{path}.message"))
    return errors
