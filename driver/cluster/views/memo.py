"""Parse once: views of cached objects kept per object version, view parts kept on first read.

Views of objects held by an informer cache are parsed once per object version: the cache *adopts*
each object it stores (``adopt``) and *releases* the one it replaces or drops (``release``), and
``X.of(obj)`` memoizes only adopted objects, so the memo holds exactly the cached versions and no
more. Any other object (an API response, an admission request) is parsed on each call. Cached
objects are read-only by contract (``copy.deepcopy`` before changing one), which is what makes the
memo exact.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

from driver.cluster.port import JsonObject

_V = TypeVar("_V")


_memo_lock = threading.Lock()


_adopted: dict[int, tuple[JsonObject, dict[str, Any]]] = {}
"""id → (object, its views by view kind), for every object an informer cache holds now: releasing
an object forgets its views in one step."""


def adopt(obj: JsonObject) -> None:
    """An informer cache now holds ``obj`` (read-only from here on): views of it may be kept."""
    key = id(obj)
    with _memo_lock:
        held = _adopted.get(key)
        if held is None or held[0] is not obj:
            _adopted[key] = (obj, {})


def release(obj: JsonObject | None) -> None:
    """An informer cache no longer holds ``obj``: forget it and its views."""
    if obj is None:
        return
    key = id(obj)
    with _memo_lock:
        held = _adopted.get(key)
        if held is not None and held[0] is obj:
            del _adopted[key]


def memo_size() -> int:
    """Views kept (for tests and metrics: bounded by the objects the caches hold)."""
    with _memo_lock:
        return sum(len(kept) for _, kept in _adopted.values())


def memoized(kind: str, obj: JsonObject, parse: Callable[[JsonObject], _V]) -> _V:
    held = _adopted.get(id(obj))
    if held is None or held[0] is not obj:
        return parse(obj)  # not in a cache (an API response, an admission request)
    kept = held[1]
    view: _V | None = kept.get(kind)
    if view is None:
        # two threads may both parse a first read: equal views, either may stay; a view kept
        # after a concurrent release goes with the forgotten entry
        view = kept[kind] = parse(obj)
    return view


class lazy(Generic[_V]):  # noqa: N801 - used as a decorator, like property
    """A view field parsed on first read and then kept on the instance.

    A non-data descriptor: the first read calls the parser and stores the value in the instance's
    ``__dict__``, which later reads find before the descriptor (plain attribute reads from then
    on). Views are immutable functions of their raw object, so two threads racing on a first read
    compute equal values and either may win.
    """

    def __init__(self, parse: Callable[[Any], _V]) -> None:
        self._parse = parse
        self._name = parse.__name__
        self.__doc__ = parse.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, instance: None, owner: type) -> lazy[_V]: ...

    @overload
    def __get__(self, instance: object, owner: type) -> _V: ...

    def __get__(self, instance: object | None, owner: type) -> lazy[_V] | _V:
        if instance is None:
            return self
        value = self._parse(instance)
        instance.__dict__[self._name] = value
        return value
