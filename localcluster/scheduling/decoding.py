"""Fields of the wrong JSON type, refused as kube-apiserver's decoder refuses them: 400
BadRequest, before any admission plugin or webhook sees the object.

Only the fields this package reads are checked: a PriorityClass's four, a pod's ``priority``,
``priorityClassName`` and ``preemptionPolicy``. ``null`` is a Go zero value or nil pointer, never an
error. A PATCH that gives a field the wrong type is a 400 here too (kube answers 422 there).
"""

from __future__ import annotations

from typing import Any

from localcluster import errors

JsonObj = dict[str, Any]

_INT32 = (-(2**31), 2**31 - 1)
_PRIORITY_CLASS_FIELDS = (
    ("value", "int32"),
    ("globalDefault", "bool"),
    ("description", "string"),
    ("preemptionPolicy", "v1.PreemptionPolicy"),
)
_POD_SPEC_FIELDS = (
    ("priority", "int32"),
    ("priorityClassName", "string"),
    ("preemptionPolicy", "v1.PreemptionPolicy"),
)


def check_priority_class(pc: JsonObj) -> None:
    for key, go_type in _PRIORITY_CLASS_FIELDS:
        if not _fits(pc.get(key), go_type):
            raise _cannot_unmarshal("PriorityClass", f"PriorityClass.{key}", pc[key], go_type)


def check_pod(pod: JsonObj) -> None:
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return
    for key, go_type in _POD_SPEC_FIELDS:
        if not _fits(spec.get(key), go_type):
            raise _cannot_unmarshal("Pod", f"PodSpec.spec.{key}", spec[key], go_type)


def _fits(value: Any, go_type: str) -> bool:
    if value is None:
        return True
    if go_type == "int32":
        return (
            isinstance(value, int)
            and not isinstance(value, bool)
            and _INT32[0] <= value <= _INT32[1]
        )
    if go_type == "bool":
        return isinstance(value, bool)
    return isinstance(value, str)


def _cannot_unmarshal(kind: str, field: str, value: Any, go_type: str) -> errors.ApiError:
    """``transformDecodeError`` around Go's ``json.UnmarshalTypeError``."""
    return errors.bad_request(
        f'{kind} in version "v1" cannot be handled as a {kind}: json: cannot unmarshal '
        f"{_json_type(value)} into Go struct field {field} of type {go_type}"
    )


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return f"number {value}"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"
