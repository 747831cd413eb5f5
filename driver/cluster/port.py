"""The ``ClusterApi`` port: how InstaSlice talks to the Kubernetes API server.

Objects cross the port as ``JsonObject`` — exactly the wire JSON (camelCase keys), the same dicts the
informers cache — so no layer converts between typed models and the API's own shape. What we send is
a ``Body``: one of ``api.wire``'s ``TypedDict``s (plain dicts whose keys mypy checks where they are
built), or a cached object changed for a write. The port is generic over a ``Resource`` (group,
version, plural): eight operations cover every kind our daemons touch, a fake is one small class,
and the domain operations (lift a gate, write an allocation, post an event) are functions over the
port in ``ops`` and ``events`` with the same wire semantics for every adapter.

Errors are ``driver.errors``: 409 → ``ConflictError`` (create of an existing name →
``AlreadyExistsError``), 404 → ``ApiNotFoundError``, 400/422 → ``InvalidError``, 410 → ``GoneError``,
anything else (5xx, 429, network) → a retryable ``ClusterError``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Protocol, Self, TypeAlias, cast

from api import wire

JsonObject: TypeAlias = dict[str, Any]
"""A Kubernetes object (or part of one) as its wire JSON: camelCase keys, RFC 3339 strings."""
Body: TypeAlias = Mapping[str, Any]
"""An object or merge patch to send: an ``api.wire`` ``TypedDict`` or a ``JsonObject``."""
ObjectTransform: TypeAlias = Callable[[JsonObject], JsonObject]
"""What an informer keeps of each object it lists or watches (client-go's ``SetTransform``)."""


@dataclass(frozen=True, slots=True)
class Resource:
    """One REST resource of the API: where its objects live and what they are called."""

    group: str
    """API group; ``""`` for the core group (``/api/v1``)."""
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        """The ``apiVersion`` field of objects of this resource, e.g. ``resource.k8s.io/v1``."""
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self,
        *,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> str:
        """URL path of the collection, of one object, or of one object's subresource."""
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            root += f"/namespaces/{namespace}"
        elif not self.namespaced and namespace is not None:
            raise ValueError(f"{self.plural} are cluster-scoped; got namespace {namespace!r}")
        path = f"{root}/{self.plural}"
        if name is not None:
            path += f"/{name}"
            if subresource is not None:
                path += f"/{subresource}"
        elif subresource is not None:
            raise ValueError("a subresource needs an object name")
        return path


PODS = Resource(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
NODES = Resource(group="", version="v1", plural="nodes", kind="Node", namespaced=False)
EVENTS = Resource(group="", version="v1", plural="events", kind="Event", namespaced=True)
RESOURCE_CLAIMS = Resource(
    group="resource.k8s.io",
    version="v1",
    plural="resourceclaims",
    kind="ResourceClaim",
    namespaced=True,
)
RESOURCE_CLAIM_TEMPLATES = Resource(
    group="resource.k8s.io",
    version="v1",
    plural="resourceclaimtemplates",
    kind="ResourceClaimTemplate",
    namespaced=True,
)
RESOURCE_SLICES = Resource(
    group="resource.k8s.io",
    version="v1",
    plural="resourceslices",
    kind="ResourceSlice",
    namespaced=False,
)
DEVICE_CLASSES = Resource(
    group="resource.k8s.io",
    version="v1",
    plural="deviceclasses",
    kind="DeviceClass",
    namespaced=False,
)
LEASES = Resource(
    group="coordination.k8s.io", version="v1", plural="leases", kind="Lease", namespaced=True
)
POD_DISRUPTION_BUDGETS = Resource(
    group="policy",
    version="v1",
    plural="poddisruptionbudgets",
    kind="PodDisruptionBudget",
    namespaced=True,
)
PRIORITY_CLASSES = Resource(
    group="scheduling.k8s.io",
    version="v1",
    plural="priorityclasses",
    kind="PriorityClass",
    namespaced=False,
)


class PatchType(enum.Enum):
    """Patch formats the API server accepts; the value is the request's ``Content-Type``."""

    JSON = "application/json-patch+json"
    """RFC 6902 list of operations; a ``test`` operation makes the patch conditional."""
    MERGE = "application/merge-patch+json"
    """RFC 7386: maps merge, lists are replaced whole, ``null`` deletes a key."""
    STRATEGIC_MERGE = "application/strategic-merge-patch+json"
    """Kubernetes' own: lists with a merge key (conditions by ``type``) merge item by item."""


@dataclass(frozen=True, slots=True)
class ObjectList:
    """The result of a list: every object and the resourceVersion to watch from."""

    items: list[JsonObject]
    resource_version: str


class WatchEventType(enum.Enum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    BOOKMARK = "BOOKMARK"
    """Only ``metadata.resourceVersion`` is meaningful: progress to resume from."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: WatchEventType
    object: JsonObject = field(repr=False)


class WatchStream(Protocol):
    """An open watch. Iterating yields events until the server ends the watch (normal: resume from
    the last resourceVersion seen); a too-old resourceVersion raises ``GoneError``, other failures
    ``ClusterError``. ``close`` may be called from another thread to end a blocked iteration."""

    def __iter__(self) -> Iterator[WatchEvent]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class ClusterApi(Protocol):
    """What InstaSlice does with the API server. Every write is optimistic: ``update`` sends the
    object's ``metadata.resourceVersion`` and a stale one raises ``ConflictError``."""

    def get(self, resource: Resource, *, name: str, namespace: str | None = None) -> JsonObject: ...

    def list_objects(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int | None = None,
        transform: ObjectTransform | None = None,
    ) -> ObjectList:
        """All matching objects (paged under the hood: ``page_size`` per request, else the
        client's setting) and the list's resourceVersion; ``transform``, when given, is applied
        to each object as its page arrives, so a page's objects as sent are dropped before the
        next page is read (what an informer keeps of a large kind never exists twice in full)."""
        ...

    def watch(
        self,
        resource: Resource,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int | None = None,
        allow_bookmarks: bool = True,
    ) -> WatchStream:
        """Changes after ``resource_version`` (from a list, the last event, or a bookmark)."""
        ...

    def create(self, resource: Resource, obj: Body, *, namespace: str | None = None) -> JsonObject:
        """Create ``obj``; the namespace defaults to ``obj``'s ``metadata.namespace``."""
        ...

    def update(self, resource: Resource, obj: Body) -> JsonObject:
        """Replace the object (PUT) if its ``metadata.resourceVersion`` is still current."""
        ...

    def update_status(self, resource: Resource, obj: Body) -> JsonObject:
        """Replace the ``status`` subresource (PUT ``…/status``), resourceVersion-checked."""
        ...

    def patch(
        self,
        resource: Resource,
        *,
        name: str,
        namespace: str | None = None,
        patch: Body | list[wire.JsonPatchOperation],
        patch_type: PatchType,
        subresource: str | None = None,
    ) -> JsonObject:
        """Patch the object: a merge patch is a ``Body``, a JSON patch a list of operations."""
        ...

    def delete(
        self,
        resource: Resource,
        *,
        name: str,
        namespace: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation_policy: str | None = None,
    ) -> None:
        """Delete; ``uid``/``resource_version`` are preconditions (mismatch → ``ConflictError``)."""
        ...

    def evict(self, *, name: str, namespace: str, uid: str | None = None) -> None:
        """Evict a pod through the Eviction API (``policy/v1``), so PodDisruptionBudgets hold.
        A budget that allows no disruption now raises ``TooManyRequestsError`` (HTTP 429);
        ``uid`` is a precondition (mismatch → ``ConflictError``)."""
        ...


def metadata(obj: Body) -> JsonObject:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _metadata_text(obj: Body, key: str) -> str:
    """A string field of ``metadata``, read as ``views.text`` reads one (``""`` when absent)."""
    value = metadata(obj).get(key)
    if type(value) is str:  # the common case, without the other checks
        return value
    return "" if value is None or isinstance(value, dict | list) else str(value)


def name_of(obj: Body) -> str:
    return _metadata_text(obj, "name")


def namespace_of(obj: Body) -> str | None:
    return _metadata_text(obj, "namespace") or None


def uid_of(obj: Body) -> str:
    return _metadata_text(obj, "uid")


def resource_version_of(obj: Body) -> str:
    return _metadata_text(obj, "resourceVersion")


def as_json(body: Body) -> JsonObject:
    """A body we built, seen as the wire JSON the views and caches read: the same dict, untyped
    (a ``TypedDict`` is a ``dict`` at run time; mypy alone tells the two apart)."""
    return cast(JsonObject, body)


def object_key(obj: Body) -> str:
    """Cache key: ``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones."""
    return key_for(name=name_of(obj), namespace=namespace_of(obj))


def key_for(*, name: str, namespace: str | None) -> str:
    return f"{namespace}/{name}" if namespace else name


def gate_names(pod: JsonObject) -> list[str]:
    """Names of the pod's scheduling gates, in order (the API server validated the pod)."""
    gates = cast(wire.Pod, pod).get("spec", {}).get("schedulingGates") or []
    return [str(gate.get("name", "")) for gate in gates]


def format_time(moment: datetime) -> str:
    """``metav1.Time``: RFC 3339 in UTC, whole seconds (``2026-05-09T07:35:25Z``)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(moment: datetime) -> str:
    """``metav1.MicroTime`` (Lease times, Event series): RFC 3339 in UTC with microseconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    """Parse a ``Time`` or ``MicroTime`` string (RFC 3339, ``Z`` or an offset, any fraction of a
    second) to an aware datetime; ``ValueError`` if it is not one."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise ValueError(f"{text!r} is not an RFC 3339 time with a zone")
    return moment
