"""Typed, read-only views of the Kubernetes objects the product reads.

Objects cross the cluster port as their wire JSON (``JsonObject``) and are written back as such;
every *read* of a field goes through a view here: ``PodView.of(pod)``, ``ClaimView.of(claim)``,
``SliceView.of(slice)``, ``DeviceClassView.of(cls)``, ``NodeView.of(node)``. A view is a frozen
dataclass parsed in one pass, keeping the raw object (``.raw``) for writes, so mypy sees every field
the product reads and every reader agrees on one parse (one parser of allocation results, one walker
of container resources, one reading of node selectors).

Parsing is lenient in the way the API server's own defaulting is: a missing or mistyped field reads
as its zero value (an empty map, list or string), never raises. Admission sees objects before
validation, and caches may hold objects written by other clients; a view never fails to build.

Views of objects held by an informer cache are parsed once per object version: the cache *adopts*
each object it stores (``adopt``) and *releases* the one it replaces or drops (``release``), and
``X.of(obj)`` memoizes only adopted objects, so the memo holds exactly the cached versions and no
more. Any other object (an API response, an admission request) is parsed on each call. Cached
objects are read-only by contract (``copy.deepcopy`` before changing one), which is what makes the
memo exact.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Generic, Self, TypeVar, overload

from driver.cluster.port import JsonObject

HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
NAME_FIELD: Final = "metadata.name"

_EMPTY: Mapping[str, Any] = {}

# ---------------------------------------------------------------------------------------------
# lenient readers of wire JSON


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


# ---------------------------------------------------------------------------------------------
# parse once per cached object version

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


def _memoized(kind: str, obj: JsonObject, parse: Callable[[JsonObject], _V]) -> _V:
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


class _View:
    """Base of the top-level views: ``of`` parses (memoized for adopted objects)."""

    __slots__ = ()
    KIND: ClassVar[str] = ""

    @classmethod
    def parse(cls, obj: JsonObject) -> Self:
        raise NotImplementedError(f"{cls.__name__} does not define parse")

    @classmethod
    def of(cls, obj: JsonObject) -> Self:
        return _memoized(cls.KIND, obj, cls.parse)


class _LazyView(_View):
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
        return isinstance(other, _LazyView) and type(other) is type(self) and other.raw == self.raw

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        meta = mapping(self.raw.get("metadata"))
        return f"{type(self).__name__}({text(meta.get('namespace'))}/{text(meta.get('name'))})"


# ---------------------------------------------------------------------------------------------
# metadata


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


# ---------------------------------------------------------------------------------------------
# node selectors (claim allocations, pod affinity)


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Requirement:
        return cls(
            key=text(raw.get("key")),
            operator=text(raw.get("operator")),
            values=strings(raw.get("values")),
        )


@dataclass(frozen=True, slots=True)
class SelectorTerm:
    match_expressions: tuple[Requirement, ...]
    match_fields: tuple[Requirement, ...]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> SelectorTerm:
        return cls(
            match_expressions=tuple(
                Requirement.parse(r) for r in items(raw.get("matchExpressions"))
            ),
            match_fields=tuple(Requirement.parse(r) for r in items(raw.get("matchFields"))),
        )

    def pinned_names(self) -> frozenset[str] | None:
        """Node names this term admits through ``metadata.name In`` / hostname ``In`` (their
        intersection); ``None`` when the term names no node that way."""
        names: frozenset[str] | None = None
        for requirement, key in (
            *((r, NAME_FIELD) for r in self.match_fields),
            *((r, HOSTNAME_LABEL) for r in self.match_expressions),
        ):
            if requirement.key == key and requirement.operator == "In":
                values = frozenset(requirement.values)
                names = values if names is None else names & values
        return names


@dataclass(frozen=True, slots=True)
class NodeSelector:
    terms: tuple[SelectorTerm, ...]

    @classmethod
    def parse(cls, raw: Any) -> NodeSelector | None:
        if not isinstance(raw, Mapping):
            return None
        return cls(terms=tuple(SelectorTerm.parse(t) for t in items(raw.get("nodeSelectorTerms"))))

    def node_names(self) -> tuple[str, ...]:
        """Every node named by an ``In`` requirement on ``metadata.name`` or the hostname label,
        in order (what allocators write; the informer's by-node index)."""
        found: list[str] = []
        for term in self.terms:
            for requirement in term.match_fields:
                if requirement.key == NAME_FIELD and requirement.operator == "In":
                    found.extend(requirement.values)
            for requirement in term.match_expressions:
                if requirement.key == HOSTNAME_LABEL and requirement.operator == "In":
                    found.extend(requirement.values)
        return tuple(dict.fromkeys(found))

    def pinned_names(self) -> frozenset[str] | None:
        """The nodes the selector admits when every term pins names (union over the terms);
        ``None`` when some term does not pin (the selector may admit other nodes)."""
        names: set[str] = set()
        for term in self.terms:
            term_names = term.pinned_names()
            if term_names is None:
                return None
            names |= term_names
        return frozenset(names)


# ---------------------------------------------------------------------------------------------
# ResourceClaim


@dataclass(frozen=True, slots=True)
class DeviceResult:
    """One ``status.allocation.devices.results`` entry."""

    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> DeviceResult:
        return cls(
            request=text(raw.get("request")),
            driver=text(raw.get("driver")),
            pool=text(raw.get("pool")),
            device=text(raw.get("device")),
            admin_access=raw.get("adminAccess") is True,
        )

    @property
    def key(self) -> tuple[str, str]:
        """(pool, device): a device's identity within one driver."""
        return (self.pool, self.device)


@dataclass(frozen=True, slots=True)
class DeviceConfigEntry:
    """One device configuration (claim spec or allocation): opaque parameters for a driver."""

    source: str
    """``FromClass`` / ``FromClaim`` in an allocation; ``""`` in a claim spec."""
    requests: tuple[str, ...]
    driver: str
    parameters: Any
    raw: Mapping[str, Any]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> DeviceConfigEntry:
        opaque = mapping(raw.get("opaque"))
        return cls(
            source=text(raw.get("source")),
            requests=strings(raw.get("requests")),
            driver=text(opaque.get("driver")),
            parameters=opaque.get("parameters"),
            raw=raw,
        )

    @property
    def opaque(self) -> bool:
        return isinstance(self.raw.get("opaque"), Mapping)


@dataclass(frozen=True)
class Allocation:
    results: tuple[DeviceResult, ...]
    config: tuple[DeviceConfigEntry, ...]
    raw: Mapping[str, Any]

    @classmethod
    def parse(cls, raw: Any) -> Allocation | None:
        if not isinstance(raw, Mapping) or not raw:
            return None
        devices = mapping(raw.get("devices"))
        return cls(
            results=tuple(DeviceResult.parse(r) for r in items(devices.get("results"))),
            config=tuple(DeviceConfigEntry.parse(c) for c in items(devices.get("config"))),
            raw=raw,
        )

    @lazy
    def node_selector(self) -> NodeSelector | None:
        """``nodeSelector``, parsed on first read: the allocator's hot readers (occupancy, its
        post-write check) want only the results, and an allocation is parsed per claim event."""
        return NodeSelector.parse(self.raw.get("nodeSelector"))

    def results_of(self, driver: str) -> tuple[DeviceResult, ...]:
        return tuple(r for r in self.results if r.driver == driver)

    def devices_of(self, driver: str) -> tuple[tuple[str, str], ...]:
        """(pool, device) of every result of ``driver``."""
        return tuple(r.key for r in self.results if r.driver == driver)

    def node_names(self) -> tuple[str, ...]:
        return self.node_selector.node_names() if self.node_selector else ()


@dataclass(frozen=True, slots=True)
class Consumer:
    """One ``status.reservedFor`` entry."""

    api_group: str
    resource: str
    name: str
    uid: str
    raw: Mapping[str, Any]
    """The entry as written (to write the others back when one consumer leaves)."""

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Consumer:
        return cls(
            api_group=text(raw.get("apiGroup")),
            resource=text(raw.get("resource")),
            name=text(raw.get("name")),
            uid=text(raw.get("uid")),
            raw=raw,
        )

    @property
    def is_pod(self) -> bool:
        return self.resource == "pods" and not self.api_group


@dataclass(frozen=True, slots=True)
class DeviceSubRequest:
    """``exactly`` of a request, or one ``firstAvailable`` alternative."""

    name: str
    device_class_name: str
    selectors: tuple[str, ...]
    """The CEL expressions of ``selectors[].cel``."""
    allocation_mode: str
    count: int
    admin_access: bool
    tolerations: Any
    """``tolerations`` as written: validated by its reader (``driver.taints.parse_tolerations``)."""
    capacity_requests: Mapping[str, str]
    """``capacity.requests`` (consumable capacity)."""

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, name: str = "") -> DeviceSubRequest:
        return cls(
            name=text(raw.get("name")) or name,
            device_class_name=text(raw.get("deviceClassName")),
            selectors=tuple(
                text(path(s, "cel", "expression")) for s in items(raw.get("selectors"))
            ),
            allocation_mode=text(raw.get("allocationMode")) or "ExactCount",
            count=integer(raw.get("count"), 1),
            admin_access=raw.get("adminAccess") is True,
            tolerations=raw.get("tolerations"),
            capacity_requests=string_map(path(raw, "capacity", "requests")),
        )


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """One ``spec.devices.requests`` entry: ``exactly`` or ``firstAvailable``."""

    name: str
    exactly: DeviceSubRequest | None
    first_available: tuple[DeviceSubRequest, ...]
    raw: Mapping[str, Any]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> DeviceRequest:
        name = text(raw.get("name"))
        exactly = raw.get("exactly")
        if isinstance(exactly, Mapping):
            one: DeviceSubRequest | None = DeviceSubRequest.parse(exactly, name=name)
        elif isinstance(raw.get("deviceClassName"), str):  # v1beta1's flat request
            one = DeviceSubRequest.parse(raw, name=name)
        else:
            one = None
        return cls(
            name=name,
            exactly=one,
            first_available=tuple(
                DeviceSubRequest.parse(s) for s in items(raw.get("firstAvailable"))
            ),
            raw=raw,
        )

    @property
    def alternatives(self) -> tuple[DeviceSubRequest, ...]:
        """``(exactly,)`` or the ``firstAvailable`` list, in preference order."""
        return (self.exactly,) if self.exactly is not None else self.first_available

    def device_class_names(self) -> tuple[str, ...]:
        return tuple(a.device_class_name for a in self.alternatives if a.device_class_name)


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    """One ``status.devices`` entry (what a driver reports about an allocated device)."""

    driver: str
    pool: str
    device: str
    data: Mapping[str, Any]
    raw: Mapping[str, Any]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> DeviceStatus:
        return cls(
            driver=text(raw.get("driver")),
            pool=text(raw.get("pool")),
            device=text(raw.get("device")),
            data=mapping(raw.get("data")),
            raw=raw,
        )


@dataclass(frozen=True, slots=True)
class ClaimSpecView:
    """A ``ResourceClaimSpec`` (of a claim, or of a template's ``spec.spec``)."""

    requests: tuple[DeviceRequest, ...]
    config: tuple[DeviceConfigEntry, ...]
    constraints: tuple[Mapping[str, Any], ...]

    @classmethod
    def parse(cls, raw: Any) -> ClaimSpecView:
        devices = mapping(mapping(raw).get("devices"))
        return cls(
            requests=tuple(DeviceRequest.parse(r) for r in items(devices.get("requests"))),
            config=tuple(DeviceConfigEntry.parse(c) for c in items(devices.get("config"))),
            constraints=tuple(items(devices.get("constraints"))),
        )

    def device_class_names(self) -> tuple[str, ...]:
        """Every DeviceClass the spec names (``exactly`` and ``firstAvailable``), in order."""
        return tuple(n for r in self.requests for n in r.device_class_names())

    def device_constraints(self) -> tuple[DeviceConstraint, ...]:
        """``constraints`` parsed (``matchAttribute`` / ``distinctAttribute`` over requests)."""
        return tuple(DeviceConstraint.parse(c) for c in self.constraints)


class ClaimView(_LazyView):
    """A ResourceClaim; each part is parsed on first read."""

    KIND: ClassVar[str] = "ResourceClaim"

    @lazy
    def spec(self) -> ClaimSpecView:
        return ClaimSpecView.parse(self.raw.get("spec"))

    @lazy
    def _status(self) -> Mapping[str, Any]:
        return mapping(self.raw.get("status"))

    @lazy
    def allocation(self) -> Allocation | None:
        return Allocation.parse(self._status.get("allocation"))

    @lazy
    def reserved_for(self) -> tuple[Consumer, ...]:
        return tuple(Consumer.parse(c) for c in items(self._status.get("reservedFor")))

    @lazy
    def devices(self) -> tuple[DeviceStatus, ...]:
        return tuple(DeviceStatus.parse(d) for d in items(self._status.get("devices")))

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def namespace(self) -> str:
        return self.meta.namespace or ""

    @property
    def uid(self) -> str:
        return self.meta.uid

    @property
    def key(self) -> str:
        return self.meta.key

    @property
    def allocated(self) -> bool:
        return self.allocation is not None

    def results_of(self, driver: str) -> tuple[DeviceResult, ...]:
        return self.allocation.results_of(driver) if self.allocation else ()

    def devices_of(self, driver: str) -> tuple[tuple[str, str], ...]:
        return self.allocation.devices_of(driver) if self.allocation else ()

    def node_names(self) -> tuple[str, ...]:
        """Nodes the allocation pins the claim to (empty when unallocated or unpinned)."""
        return self.allocation.node_names() if self.allocation else ()

    def reserved_pod_uids(self) -> tuple[str, ...]:
        return tuple(c.uid for c in self.reserved_for if c.is_pod)

    def device_status(self, driver: str, pool: str, device: str) -> DeviceStatus | None:
        for entry in self.devices:
            if (entry.driver, entry.pool, entry.device) == (driver, pool, device):
                return entry
        return None


@dataclass(frozen=True, slots=True)
class ClaimTemplateView(_View):
    KIND: ClassVar[str] = "ResourceClaimTemplate"

    raw: JsonObject = field(repr=False)
    meta: Meta
    spec: ClaimSpecView

    @classmethod
    def parse(cls, obj: JsonObject) -> ClaimTemplateView:
        return cls(
            raw=obj,
            meta=Meta.parse(obj.get("metadata")),
            spec=ClaimSpecView.parse(path(obj, "spec", "spec")),
        )


# ---------------------------------------------------------------------------------------------
# Pod


@dataclass(frozen=True, slots=True)
class ContainerView:
    name: str
    init: bool
    """An init container (``spec.initContainers``)."""
    restart_policy: str
    """``Always`` on an init container makes it a sidecar."""
    requests: Mapping[str, str]
    limits: Mapping[str, str]
    claims: tuple[str, ...]
    """Names of the pod claims the container uses (``resources.claims[].name``)."""
    raw: Mapping[str, Any]

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, init: bool) -> ContainerView:
        resources = mapping(raw.get("resources"))
        return cls(
            name=text(raw.get("name")),
            init=init,
            restart_policy=text(raw.get("restartPolicy")),
            requests=string_map(resources.get("requests")),
            limits=string_map(resources.get("limits")),
            claims=tuple(text(c.get("name")) for c in items(resources.get("claims"))),
            raw=raw,
        )

    @property
    def sidecar(self) -> bool:
        return self.init and self.restart_policy == "Always"

    def amounts(self) -> Mapping[str, str]:
        """Requests overlaid by limits (a limit wins: for extended resources they must match)."""
        if not self.requests:
            return self.limits
        if not self.limits:
            return self.requests
        return {**self.requests, **self.limits}

    def resource_names(self) -> frozenset[str]:
        return frozenset((*self.requests, *self.limits))


@dataclass(frozen=True, slots=True)
class PodClaimRef:
    """One ``spec.resourceClaims`` entry."""

    name: str
    claim_name: str | None
    template_name: str | None

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> PodClaimRef:
        return cls(
            name=text(raw.get("name")),
            claim_name=optional_text(raw.get("resourceClaimName")),
            template_name=optional_text(raw.get("resourceClaimTemplateName")),
        )


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str
    last_transition_time: str
    raw: Mapping[str, Any]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Condition:
        return cls(
            type=text(raw.get("type")),
            status=text(raw.get("status")),
            reason=text(raw.get("reason")),
            message=text(raw.get("message")),
            last_transition_time=text(raw.get("lastTransitionTime")),
            raw=raw,
        )

    @property
    def true(self) -> bool:
        return self.status == "True"


def _condition(conditions: tuple[Condition, ...], kind: str) -> Condition | None:
    for condition in conditions:
        if condition.type == kind:
            return condition
    return None


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Toleration:
        return cls(
            key=text(raw.get("key")),
            operator=text(raw.get("operator")) or "Equal",
            value=text(raw.get("value")),
            effect=text(raw.get("effect")),
        )

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes' rule: empty effect matches every effect; empty key with ``Exists``
        matches every taint; otherwise keys match and ``Exists`` or equal values."""
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


class PodView(_LazyView):
    """A Pod; each part is parsed on first read."""

    KIND: ClassVar[str] = "Pod"

    @lazy
    def _spec(self) -> Mapping[str, Any]:
        return mapping(self.raw.get("spec"))

    @lazy
    def _status(self) -> Mapping[str, Any]:
        return mapping(self.raw.get("status"))

    @lazy
    def node_name(self) -> str:
        return text(self._spec.get("nodeName"))

    @lazy
    def scheduling_gates(self) -> tuple[str, ...]:
        return tuple(text(g.get("name")) for g in items(self._spec.get("schedulingGates")))

    @lazy
    def init_containers(self) -> tuple[ContainerView, ...]:
        return tuple(
            ContainerView.parse(c, init=True) for c in items(self._spec.get("initContainers"))
        )

    @lazy
    def containers(self) -> tuple[ContainerView, ...]:
        return tuple(
            ContainerView.parse(c, init=False) for c in items(self._spec.get("containers"))
        )

    @lazy
    def overhead(self) -> Mapping[str, str]:
        return string_map(self._spec.get("overhead"))

    @lazy
    def claim_refs(self) -> tuple[PodClaimRef, ...]:
        return tuple(PodClaimRef.parse(r) for r in items(self._spec.get("resourceClaims")))

    @lazy
    def node_selector(self) -> Mapping[str, str]:
        return string_map(self._spec.get("nodeSelector"))

    @lazy
    def required_affinity(self) -> NodeSelector | None:
        """``affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution``."""
        return NodeSelector.parse(
            path(
                self._spec,
                "affinity",
                "nodeAffinity",
                "requiredDuringSchedulingIgnoredDuringExecution",
            )
        )

    @lazy
    def tolerations(self) -> tuple[Toleration, ...]:
        return tuple(Toleration.parse(t) for t in items(self._spec.get("tolerations")))

    @lazy
    def scheduler_name(self) -> str:
        return text(self._spec.get("schedulerName"))

    @lazy
    def phase(self) -> str:
        return text(self._status.get("phase"))

    @lazy
    def conditions(self) -> tuple[Condition, ...]:
        return tuple(Condition.parse(c) for c in items(self._status.get("conditions")))

    @lazy
    def claim_statuses(self) -> Mapping[str, str | None]:
        """``status.resourceClaimStatuses``: pod claim name → generated claim name (None: not
        needed)."""
        return {
            text(s.get("name")): optional_text(s.get("resourceClaimName"))
            for s in items(self._status.get("resourceClaimStatuses"))
        }

    @lazy
    def reason(self) -> str:
        """``status.reason`` (e.g. the kubelet's ``UnexpectedAdmissionError``)."""
        return text(self._status.get("reason"))

    @lazy
    def message(self) -> str:
        """``status.message``."""
        return text(self._status.get("message"))

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def namespace(self) -> str:
        return self.meta.namespace or ""

    @property
    def uid(self) -> str:
        return self.meta.uid

    @property
    def key(self) -> str:
        return self.meta.key

    @property
    def all_containers(self) -> tuple[ContainerView, ...]:
        """Init containers, then app containers: the one walk over a pod's resources."""
        return (*self.init_containers, *self.containers)

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def bound(self) -> bool:
        return bool(self.node_name)

    def gated_by(self, gate: str) -> bool:
        return gate in self.scheduling_gates

    def condition(self, kind: str) -> Condition | None:
        return _condition(self.conditions, kind)

    def requests_resource(self, predicate: Callable[[str], bool]) -> bool:
        """Whether some container requests or limits a resource whose name ``predicate`` takes."""
        return any(predicate(name) for c in self.all_containers for name in c.resource_names())

    def claim_name_of(self, ref: PodClaimRef) -> str | None:
        """The ResourceClaim a pod claim resolves to: its ``resourceClaimName``, or for a
        template the generated claim recorded in ``status.resourceClaimStatuses`` (``None``:
        not generated yet, or not needed)."""
        if ref.claim_name:
            return ref.claim_name
        if ref.template_name:
            return self.claim_statuses.get(ref.name)
        return None

    def claim_keys(self) -> tuple[str, ...]:
        """``namespace/name`` of every ResourceClaim the pod uses (named or generated)."""
        names = [r.claim_name for r in self.claim_refs if r.claim_name]
        names.extend(n for n in self.claim_statuses.values() if n)
        prefix = f"{self.meta.namespace}/" if self.meta.namespace else ""
        return tuple(dict.fromkeys(prefix + n for n in names))


# ---------------------------------------------------------------------------------------------
# ResourceSlice


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str
    time_added: str

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Taint:
        return cls(
            key=text(raw.get("key")),
            value=text(raw.get("value")),
            effect=text(raw.get("effect")),
            time_added=text(raw.get("timeAdded")),
        )


AttributeValue = str | int | bool


def _attribute(raw: Any) -> AttributeValue | None:
    value = mapping(raw)
    for key in ("string", "version"):
        if isinstance(value.get(key), str):
            return str(value[key])
    if isinstance(value.get("bool"), bool):
        return bool(value["bool"])
    if isinstance(value.get("int"), int):
        return int(value["int"])
    return None


@dataclass(frozen=True, slots=True)
class CounterConsumption:
    counter_set: str
    counters: Mapping[str, str]
    """counter name → quantity string (``value`` of each counter)."""

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> CounterConsumption:
        return cls(
            counter_set=text(raw.get("counterSet")),
            counters=quantities(raw.get("counters")),
        )


@dataclass(frozen=True, slots=True)
class SliceDevice:
    name: str
    attributes: Mapping[str, AttributeValue]
    capacity: Mapping[str, str]
    """capacity name → quantity string (``value``)."""
    consumes: tuple[CounterConsumption, ...]
    taints: tuple[Taint, ...]
    raw: Mapping[str, Any]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> SliceDevice:
        attributes: dict[str, AttributeValue] = {}
        for key, value in mapping(raw.get("attributes")).items():
            parsed = _attribute(value)
            if parsed is not None:
                attributes[str(key)] = parsed
        return cls(
            name=text(raw.get("name")),
            attributes=attributes,
            capacity=quantities(raw.get("capacity")),
            consumes=tuple(CounterConsumption.parse(c) for c in items(raw.get("consumesCounters"))),
            taints=tuple(Taint.parse(t) for t in items(raw.get("taints"))),
            raw=raw,
        )


@dataclass(frozen=True, slots=True)
class CounterSet:
    name: str
    counters: Mapping[str, str]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> CounterSet:
        return cls(
            name=text(raw.get("name")),
            counters=quantities(raw.get("counters")),
        )


@dataclass(frozen=True, slots=True)
class SliceView(_View):
    KIND: ClassVar[str] = "ResourceSlice"

    raw: JsonObject = field(repr=False)
    meta: Meta
    driver: str
    pool: str
    pool_generation: int
    pool_slice_count: int
    node_name: str
    all_nodes: bool
    devices: tuple[SliceDevice, ...]
    shared_counters: tuple[CounterSet, ...]

    @classmethod
    def parse(cls, obj: JsonObject) -> SliceView:
        spec = mapping(obj.get("spec"))
        pool = mapping(spec.get("pool"))
        return cls(
            raw=obj,
            meta=Meta.parse(obj.get("metadata")),
            driver=text(spec.get("driver")),
            pool=text(pool.get("name")),
            pool_generation=integer(pool.get("generation")),
            pool_slice_count=integer(pool.get("resourceSliceCount"), 1),
            node_name=text(spec.get("nodeName")),
            all_nodes=spec.get("allNodes") is True,
            devices=tuple(SliceDevice.parse(d) for d in items(spec.get("devices"))),
            shared_counters=tuple(CounterSet.parse(c) for c in items(spec.get("sharedCounters"))),
        )

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def node(self) -> str:
        """The node the slice's devices are on: ``nodeName``, else the pool name."""
        return self.node_name or self.pool


# ---------------------------------------------------------------------------------------------
# DeviceClass and Node


@dataclass(frozen=True, slots=True)
class DeviceClassView(_View):
    KIND: ClassVar[str] = "DeviceClass"

    raw: JsonObject = field(repr=False)
    meta: Meta
    selectors: tuple[str, ...]
    """The CEL expressions of ``spec.selectors[].cel``."""
    config: tuple[DeviceConfigEntry, ...]
    extended_resource_name: str | None

    @classmethod
    def parse(cls, obj: JsonObject) -> DeviceClassView:
        spec = mapping(obj.get("spec"))
        return cls(
            raw=obj,
            meta=Meta.parse(obj.get("metadata")),
            selectors=tuple(
                text(path(s, "cel", "expression")) for s in items(spec.get("selectors"))
            ),
            config=tuple(DeviceConfigEntry.parse(c) for c in items(spec.get("config"))),
            extended_resource_name=optional_text(spec.get("extendedResourceName")),
        )

    @property
    def name(self) -> str:
        return self.meta.name


@dataclass(frozen=True, slots=True)
class NodeView(_View):
    KIND: ClassVar[str] = "Node"

    raw: JsonObject = field(repr=False)
    meta: Meta
    unschedulable: bool
    taints: tuple[Taint, ...]
    capacity: Mapping[str, str]
    allocatable: Mapping[str, str]
    conditions: tuple[Condition, ...]

    @classmethod
    def parse(cls, obj: JsonObject) -> NodeView:
        spec = mapping(obj.get("spec"))
        status = mapping(obj.get("status"))
        return cls(
            raw=obj,
            meta=Meta.parse(obj.get("metadata")),
            unschedulable=spec.get("unschedulable") is True,
            taints=tuple(Taint.parse(t) for t in items(spec.get("taints"))),
            capacity=string_map(status.get("capacity")),
            allocatable=string_map(status.get("allocatable")),
            conditions=tuple(Condition.parse(c) for c in items(status.get("conditions"))),
        )

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def labels(self) -> Mapping[str, str]:
        return self.meta.labels

    def condition(self, kind: str) -> Condition | None:
        return _condition(self.conditions, kind)

    @property
    def ready(self) -> bool:
        ready = self.condition("Ready")
        return ready is not None and ready.true


# ---------------------------------------------------------------------------------------------
# Lease (coordination.k8s.io/v1: leader election, the device-plugin shim's node lease)


@dataclass(frozen=True, slots=True)
class LeaseView(_View):
    """A ``coordination.k8s.io/v1`` Lease (leader election, the device-plugin shim's lease)."""

    KIND: ClassVar[str] = "Lease"

    raw: JsonObject = field(repr=False)
    meta: Meta
    spec: Mapping[str, Any]
    """``spec`` as sent (``{}`` when absent), for writers that keep the fields they do not set."""
    holder_identity: str
    lease_duration_seconds: int
    """0 when absent (the reader supplies its own default)."""
    acquire_time: str
    renew_time: str
    lease_transitions: int

    @classmethod
    def parse(cls, obj: JsonObject) -> LeaseView:
        spec = mapping(obj.get("spec"))
        return cls(
            raw=obj,
            meta=Meta.parse(obj.get("metadata")),
            spec=spec,
            holder_identity=text(spec.get("holderIdentity")),
            lease_duration_seconds=integer(spec.get("leaseDurationSeconds")),
            acquire_time=text(spec.get("acquireTime")),
            renew_time=text(spec.get("renewTime")),
            lease_transitions=integer(spec.get("leaseTransitions")),
        )


# ---------------------------------------------------------------------------------------------
# claim constraints


@dataclass(frozen=True, slots=True)
class DeviceConstraint:
    """One ``spec.devices.constraints`` entry of a ResourceClaim."""

    requests: tuple[str, ...]
    """Request (or ``request/subrequest``) names it covers; empty: every request."""
    match_attribute: str
    distinct_attribute: str

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> DeviceConstraint:
        return cls(
            requests=strings(raw.get("requests")),
            match_attribute=text(raw.get("matchAttribute")),
            distinct_attribute=text(raw.get("distinctAttribute")),
        )

    @property
    def attribute(self) -> str:
        return self.match_attribute or self.distinct_attribute

    @property
    def distinct(self) -> bool:
        return bool(self.distinct_attribute)
