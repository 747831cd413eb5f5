"""``metadata``: the one parse of an object's name, namespace, uid, labels, owners and deletion."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from driver.cluster.views.memo import lazy
from driver.cluster.views.readers import (
    integer,
    items,
    mapping,
    optional_text,
    string_map,
    strings,
    text,
)


@dataclass(frozen=True, slots=True)
class OwnerRef:
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> OwnerRef:
        return cls(
            api_version=text(raw.get("apiVersion")),
            kind=text(raw.get("kind")),
            name=text(raw.get("name")),
            uid=text(raw.get("uid")),
            controller=raw.get("controller") is True,
        )

    @property
    def is_pod(self) -> bool:
        return self.kind == "Pod" and self.api_version == "v1"


class Meta:
    """``metadata``: identity read at once; labels, annotations, finalizers and owners parsed on
    first read (most readers need only the identity)."""

    __slots__ = ("__dict__", "_raw", "name", "namespace", "resource_version", "uid")

    _raw: Mapping[str, Any]
    name: str
    namespace: str | None
    uid: str
    resource_version: str

    def __init__(self, raw: Mapping[str, Any]) -> None:
        set_ = object.__setattr__
        set_(self, "_raw", raw)
        set_(self, "name", text(raw.get("name")))
        set_(self, "namespace", optional_text(raw.get("namespace")))
        set_(self, "uid", text(raw.get("uid")))
        set_(self, "resource_version", text(raw.get("resourceVersion")))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"views are read-only: cannot set {name}")

    def __repr__(self) -> str:
        return f"Meta(name={self.name!r}, namespace={self.namespace!r}, uid={self.uid!r})"

    @classmethod
    def parse(cls, raw: Any) -> Meta:
        return cls(mapping(raw))

    @lazy
    def generation(self) -> int:
        return integer(self._raw.get("generation"))

    @lazy
    def labels(self) -> Mapping[str, str]:
        return string_map(self._raw.get("labels"))

    @lazy
    def annotations(self) -> Mapping[str, str]:
        return string_map(self._raw.get("annotations"))

    @lazy
    def finalizers(self) -> tuple[str, ...]:
        return strings(self._raw.get("finalizers"))

    @lazy
    def owners(self) -> tuple[OwnerRef, ...]:
        return tuple(OwnerRef.parse(o) for o in items(self._raw.get("ownerReferences")))

    @lazy
    def creation_timestamp(self) -> str:
        return text(self._raw.get("creationTimestamp"))

    @lazy
    def deletion_timestamp(self) -> str | None:
        return optional_text(self._raw.get("deletionTimestamp"))

    @property
    def key(self) -> str:
        """The informer cache key: ``namespace/name``, or ``name`` when cluster-scoped."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @property
    def deleting(self) -> bool:
        return self.deletion_timestamp is not None

    def owned_by(self, uid: str) -> bool:
        return any(o.uid == uid for o in self.owners)

    def owner_pod_uids(self) -> tuple[str, ...]:
        return tuple(o.uid for o in self.owners if o.is_pod)
