"""What every top-level view shares: ``of`` (parsed once per cached object version) and the
object's identity.

``View`` answers the identity every kind has (``name``, ``namespace``, ``uid``, ``key``,
``labels``) from its ``meta``, once for all kinds; the rest of the metadata is read through ``meta``
itself (``view.meta.finalizers``, ``view.meta.owners``, ``view.meta.deleting``...). ``LazyView`` is
the base of the views read on every event (Pod, ResourceClaim): constructing one costs nothing,
each part is parsed on its first read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

from driver.cluster.port import JsonObject
from driver.cluster.views.memo import lazy, memoized
from driver.cluster.views.meta import Meta
from driver.cluster.views.readers import mapping, text


class View:
    """Base of the top-level views: ``of`` parses (memoized for adopted objects); the object's
    identity is read from its ``meta``, here once for every kind."""

    __slots__ = ()
    KIND: ClassVar[str] = ""
    raw: JsonObject
    meta: Meta

    @classmethod
    def parse(cls, obj: JsonObject) -> Self:
        raise NotImplementedError(f"{cls.__name__} does not define parse")

    @classmethod
    def of(cls, obj: JsonObject) -> Self:
        return memoized(cls.KIND, obj, cls.parse)

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def namespace(self) -> str:
        """``""`` for a cluster-scoped object."""
        return self.meta.namespace or ""

    @property
    def uid(self) -> str:
        return self.meta.uid

    @property
    def key(self) -> str:
        """The informer cache key: ``namespace/name``, or ``name`` when cluster-scoped."""
        return self.meta.key

    @property
    def labels(self) -> Mapping[str, str]:
        return self.meta.labels


class LazyView(View):
    """A top-level view over ``raw`` whose parts are ``lazy`` fields: constructing one costs
    nothing, each part is parsed on its first read. Read-only, compared by type and raw object."""

    __slots__ = ("__dict__", "raw")
    raw: JsonObject

    def __init__(self, raw: JsonObject) -> None:
        object.__setattr__(self, "raw", raw)

    @classmethod
    def parse(cls, obj: JsonObject) -> Self:
        return cls(obj)

    @lazy
    def meta(self) -> Meta:
        return Meta.parse(self.raw.get("metadata"))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"views are read-only: cannot set {name}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LazyView) and type(other) is type(self) and other.raw == self.raw

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        meta = mapping(self.raw.get("metadata"))
        return f"{type(self).__name__}({text(meta.get('namespace'))}/{text(meta.get('name'))})"
