"""Lenient readers of wire JSON: a missing or mistyped field reads as its zero value.

Parsing is lenient in the way the API server's own defaulting is: an empty map, list or string,
never an exception. Admission sees objects before validation, and caches may hold objects written
by other clients; a view never fails to build.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

_EMPTY: Mapping[str, Any] = {}


def mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a JSON object, else an empty one."""
    if type(value) is dict:  # the common case, without the ABC check (views are parsed per event)
        return value
    return value if isinstance(value, Mapping) else _EMPTY


def items(value: Any) -> Iterator[Mapping[str, Any]]:
    """The JSON objects of a JSON array (other entries and non-arrays read as nothing)."""
    if isinstance(value, list | tuple):
        for item in value:
            if type(item) is dict or isinstance(item, Mapping):
                yield item


def text(value: Any) -> str:
    """A string field: ``""`` when absent, null or not a scalar."""
    if type(value) is str:
        return value
    if value is None or isinstance(value, Mapping | list):
        return ""
    return value if isinstance(value, str) else str(value)


def optional_text(value: Any) -> str | None:
    """A string field that may be null; empty strings read as ``None`` too."""
    return text(value) or None


def strings(value: Any) -> tuple[str, ...]:
    """A JSON array of strings (non-strings dropped)."""
    if isinstance(value, list | tuple):
        return tuple(str(v) for v in value if isinstance(v, str | int | float) and v is not None)
    return ()


def string_map(value: Any) -> Mapping[str, str]:
    """A ``map[string]string`` (labels, annotations, node selectors, resource quantities)."""
    if type(value) is not dict and not isinstance(value, Mapping):
        return _EMPTY
    return {str(k): text(v) for k, v in value.items() if v is not None}


def quantities(value: Any) -> Mapping[str, str]:
    """A map of ``{"value": <quantity>}`` entries (device capacity, counters) → name → quantity."""
    return {str(k): text(mapping(v).get("value")) for k, v in mapping(value).items()}


def integer(value: Any, default: int = 0) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return default
    return default


def path(obj: Any, *keys: str) -> Any:
    """``obj[k1][k2]...`` through JSON objects; ``None`` as soon as one is missing."""
    for key in keys:
        if type(obj) is not dict and not isinstance(obj, Mapping):  # dict: no ABC check
            return None
        obj = obj.get(key)
    return obj
