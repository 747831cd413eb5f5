"""``meta/v1``: the metadata every object carries and the API's own envelopes (lists, watch events,
``Status``, delete options), plus the RFC 6902 JSON patch we send as a patch body."""

from __future__ import annotations

from typing import Any, Literal, Required, TypedDict


class OwnerReference(TypedDict, total=False):
    apiVersion: Required[str]
    kind: Required[str]
    name: Required[str]
    uid: Required[str]
    controller: bool
    blockOwnerDeletion: bool


class ObjectMeta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    resourceVersion: str
    labels: dict[str, str]
    annotations: dict[str, str]
    finalizers: list[str]
    ownerReferences: list[OwnerReference]


class ObjectStub(TypedDict, total=False):
    """An object known by its identity only: what an Event's ``involvedObject`` is made from."""

    apiVersion: Required[str]
    kind: Required[str]
    metadata: Required[ObjectMeta]


ListMeta = TypedDict(
    "ListMeta",
    {"resourceVersion": str, "continue": str},
    total=False,
)
"""``metadata`` of a list (``continue`` is a Python keyword, hence this spelling)."""


class ObjectListBody(TypedDict, total=False):
    """A page of a list: its objects stay ``JsonObject``s, read through the views."""

    apiVersion: str
    kind: str
    metadata: ListMeta
    items: list[dict[str, Any]]


class WatchEventBody(TypedDict):
    """One line of a watch stream; ``object`` is a ``Status`` when ``type`` is ``ERROR``."""

    type: str
    object: dict[str, Any]


class Status(TypedDict, total=False):
    """The API's answer to a failed request (and the webhook's to a request it cannot read)."""

    apiVersion: str
    kind: str
    status: Literal["Success", "Failure"]
    message: str
    reason: str
    code: int


class Preconditions(TypedDict, total=False):
    uid: str
    resourceVersion: str


class DeleteOptions(TypedDict, total=False):
    apiVersion: str
    kind: str
    preconditions: Preconditions
    propagationPolicy: str
    """``Orphan``, ``Background`` or ``Foreground``."""


class LabelSelector(TypedDict, total=False):
    matchLabels: dict[str, str]
    matchExpressions: list[dict[str, Any]]


JsonPatchOperation = TypedDict(
    "JsonPatchOperation",
    {
        "op": Required[Literal["add", "remove", "replace", "move", "copy", "test"]],
        "path": Required[str],
        "value": Any,
        "from": str,
    },
    total=False,
)
"""One operation of an RFC 6902 JSON patch (``from`` is a Python keyword, hence this spelling)."""
