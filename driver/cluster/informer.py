"""List + watch informers: a local, indexed, always-converging copy of one kind of object.

The loop is client-go's reflector: list once, then watch from the list's resourceVersion, resuming
each new watch from the last resourceVersion seen (an event's or a bookmark's) so that a dropped
connection or a restarted API server loses no event; a 410 Gone (history compacted past our
version) re-lists and reconciles the cache against the fresh list, telling handlers what was added,
changed or deleted meanwhile. Errors back off exponentially with jitter. Handlers run on the
informer's thread and should only enqueue keys on a ``WorkQueue``.
"""

from __future__ import annotations

import builtins
import logging
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from driver.cluster.cache import IndexedCache, IndexFunc, IndexInputs
from driver.cluster.port import (
    ClusterApi,
    JsonObject,
    ObjectList,
    ObjectTransform,
    Resource,
    WatchEvent,
    WatchEventType,
    WatchStream,
    object_key,
    resource_version_of,
)
from driver.errors import GoneError

logger = logging.getLogger(__name__)

Transform = ObjectTransform
"""Applied to every listed or watched object before it is cached (client-go's ``SetTransform``)."""
AddHandler = Callable[[JsonObject], None]
UpdateHandler = Callable[[JsonObject, JsonObject], None]
DeleteHandler = Callable[[JsonObject], None]


class ListerWatcher(Protocol):
    """The informer's seam: one kind of object, already narrowed by namespace/selectors."""

    def list_objects(self, *, transform: Transform | None = None) -> ObjectList:
        """Every object, each passed through ``transform`` (when given) as it arrives."""
        ...

    def watch(self, *, resource_version: str, timeout_seconds: int) -> WatchStream: ...


@dataclass(frozen=True, slots=True)
class ListWatch:
    """``ListerWatcher`` over a ``ClusterApi``."""

    api: ClusterApi
    resource: Resource
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None
    page_size: int | None = None
    """Objects per list request (None: the client's ``page_size``); smaller for a kind of large
    objects bounds what one page holds before the informer's transform shrinks it."""

    def list_objects(self, *, transform: Transform | None = None) -> ObjectList:
        return self.api.list_objects(
            self.resource,
            namespace=self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            page_size=self.page_size,
            transform=transform,
        )

    def watch(self, *, resource_version: str, timeout_seconds: int) -> WatchStream:
        return self.api.watch(
            self.resource,
            resource_version=resource_version,
            namespace=self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            timeout_seconds=timeout_seconds,
            allow_bookmarks=True,
        )


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before the n-th consecutive retry: ``initial * factor**(n-1)``, capped, plus up to
    ``jitter`` of itself at random so that many informers do not retry in step."""

    initial: float = 0.2
    maximum: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2

    def delay(self, failures: int, rng: random.Random) -> float:
        base = min(self.maximum, self.initial * self.factor ** max(0, failures - 1))
        return base * (1.0 + self.jitter * rng.random())


@dataclass(frozen=True, slots=True)
class _Handlers:
    on_add: AddHandler | None
    on_update: UpdateHandler | None
    on_delete: DeleteHandler | None


_QUICK_WATCH_S = 1.0


class Informer:
    def __init__(
        self,
        *,
        source: ListerWatcher,
        name: str,
        backoff: Backoff | None = None,
        watch_timeout_seconds: int = 300,
        rng: random.Random | None = None,
        transform: Transform | None = None,
    ) -> None:
        self.name = name
        self._transform = transform
        self._source = source
        self._backoff = backoff or Backoff()
        self._watch_timeout = watch_timeout_seconds
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not security
        self._cache = IndexedCache()
        self._handlers: list[_Handlers] = []
        self._dispatch = threading.RLock()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._stream_lock = threading.Lock()
        self._stream: WatchStream | None = None
        self._thread: threading.Thread | None = None
        self._resource_version = ""
        self.relists = 0
        """Lists done so far (the first one included); for tests and metrics."""
        self.watches = 0
        self.failures = 0
        """Consecutive failed attempts; 0 while healthy."""

    # -- reading the cache ------------------------------------------------------------------

    def get(self, name: str, *, namespace: str | None = None) -> JsonObject | None:
        return self._cache.get(name, namespace=namespace)

    def get_by_key(self, key: str) -> JsonObject | None:
        return self._cache.get_by_key(key)

    def list(self) -> builtins.list[JsonObject]:
        return self._cache.list()

    def add_index(self, name: str, func: IndexFunc, *, inputs: IndexInputs | None = None) -> None:
        self._cache.add_index(name, func, inputs=inputs)

    def by_index(self, name: str, value: str) -> builtins.list[JsonObject]:
        return self._cache.by_index(name, value)

    @property
    def cache(self) -> IndexedCache:
        return self._cache

    @property
    def last_resource_version(self) -> str:
        return self._resource_version

    def has_synced(self) -> bool:
        """True once the first list is in the cache."""
        return self._synced.is_set()

    def wait_for_sync(self, *, timeout: float) -> bool:
        return self._synced.wait(timeout)

    # -- handlers and lifecycle -------------------------------------------------------------

    def add_handler(
        self,
        *,
        on_add: AddHandler | None = None,
        on_update: UpdateHandler | None = None,
        on_delete: DeleteHandler | None = None,
    ) -> None:
        """Register callbacks; objects already cached are replayed to ``on_add`` first."""
        handlers = _Handlers(on_add=on_add, on_update=on_update, on_delete=on_delete)
        with self._dispatch:
            if on_add is not None:
                for obj in self._cache.list():
                    self._call(on_add, obj)
            self._handlers.append(handlers)

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"informer {self.name} already started")
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, *, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._stream_lock:
            stream = self._stream
        if stream is not None:
            stream.close()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("informer %s did not stop within %.1fs", self.name, timeout)

    # -- the loop ---------------------------------------------------------------------------

    def _run(self) -> None:
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    self._relist()
                    need_list = False
                if self._watch_once() or self._stop.is_set():
                    self.failures = 0
                    continue
                self.failures += 1
                logger.debug("informer %s: watch ended at once, backing off", self.name)
            except GoneError as exc:
                logger.info("informer %s: %s; re-listing", self.name, exc)
                need_list = True
                self.failures += 1
                if self.failures == 1:
                    continue  # the first 410 re-lists at once, repeated ones back off
            except Exception as exc:
                self.failures += 1
                logger.log(
                    logging.INFO if self.failures == 1 else logging.WARNING,
                    "informer %s: %s (attempt %d)",
                    self.name,
                    exc,
                    self.failures,
                )
            self._stop.wait(self._backoff.delay(self.failures, self._rng))

    def _relist(self) -> None:
        listed = self._source.list_objects(transform=self._transform)
        with self._dispatch:
            fresh = {object_key(obj): obj for obj in listed.items}
            for obj in self._cache.list():
                if object_key(obj) not in fresh:
                    self._cache.remove(obj)
                    self._notify_delete(obj)
            for obj in fresh.values():
                old = self._cache.upsert(obj)
                if old is None:
                    self._notify_add(obj)
                elif resource_version_of(old) != resource_version_of(obj):
                    self._notify_update(old, obj)
            self._resource_version = listed.resource_version
        self.relists += 1
        self.failures = 0
        self._synced.set()
        logger.debug("informer %s: listed %d at %s", self.name, len(fresh), self._resource_version)

    def _watch_once(self) -> bool:
        """Watch until the stream ends; True if it was healthy (lived or delivered events)."""
        started = time.monotonic()
        timeout = self._rng.randint(self._watch_timeout, 2 * self._watch_timeout)
        stream = self._source.watch(
            resource_version=self._resource_version, timeout_seconds=timeout
        )
        with self._stream_lock:
            self._stream = stream
        delivered = False
        try:
            with stream:  # closed even when stop() came while it was being opened
                if self._stop.is_set():
                    return True
                for event in stream:
                    self._apply(event)
                    delivered = True
                    if self._stop.is_set():
                        break
        finally:
            with self._stream_lock:
                self._stream = None
        self.watches += 1
        return delivered or time.monotonic() - started >= _QUICK_WATCH_S

    def _apply(self, event: WatchEvent) -> None:
        kind, obj = event.type, event.object
        version = resource_version_of(obj)
        if self._transform is not None and kind is not WatchEventType.BOOKMARK:
            obj = self._transform(obj)
        with self._dispatch:
            if kind is WatchEventType.DELETED:
                old = self._cache.remove(obj)
                self._notify_delete(old if old is not None else obj)
            elif kind is not WatchEventType.BOOKMARK:
                old = self._cache.upsert(obj)
                if old is None:
                    self._notify_add(obj)
                else:
                    self._notify_update(old, obj)
            if version:
                self._resource_version = version

    def _notify_add(self, obj: JsonObject) -> None:
        for handlers in self._handlers:
            if handlers.on_add is not None:
                self._call(handlers.on_add, obj)

    def _notify_update(self, old: JsonObject, new: JsonObject) -> None:
        for handlers in self._handlers:
            if handlers.on_update is None:
                continue
            try:
                handlers.on_update(old, new)
            except Exception:
                logger.exception("informer %s: handler failed for %s", self.name, object_key(new))

    def _notify_delete(self, obj: JsonObject) -> None:
        for handlers in self._handlers:
            if handlers.on_delete is not None:
                self._call(handlers.on_delete, obj)

    def _call(self, handler: Callable[[JsonObject], None], obj: JsonObject) -> None:
        try:
            handler(obj)
        except Exception:
            logger.exception("informer %s: handler failed for %s", self.name, object_key(obj))


def strip_managed_fields(obj: JsonObject) -> JsonObject:
    """The object without ``metadata.managedFields`` (server-side apply bookkeeping, often a third
    of an object, never read by us): less memory per cached object and less for the collector to
    scan. Updates built from such a copy keep the server's managedFields (an update that omits the
    field leaves it as it is)."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict) or "managedFields" not in metadata:
        return obj
    return {**obj, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}


_Key = object
"""What an interned value is known by: a scalar's (type, value), a string itself, an interned
container's ``id``; ``None`` for a container that is not interned (so neither is its parent)."""


class JsonInterner:
    """A transform that makes equal small parts of cached objects one object (hash-consing).

    A node's ResourceSlices repeat the same small JSON objects hundreds of times — ``{"int": 0}``,
    ``{"string": "1g.5gb"}``, a placement's capacity and counters — and every node repeats them
    again: parsed, one node of 8 A100s takes ~0.85 MiB, most of it such duplicates (docs/design.md,
    "Memory"). Here every object or array of at most ``max_width`` entries whose entries are all
    interned is replaced by the one equal object seen before, and strings of up to 64 characters by
    the interpreter's interned copy; wider containers (a device, its attributes, a slice) stay
    distinct but hold shared parts. The result equals the input (``==``) and is read-only like
    every cached object: a caller that changed a shared part would change it everywhere.

    The table holds each interned container once (with a key of its entries' keys) and starts
    afresh past ``max_entries``, so it stays bounded however objects change; parts shared before
    stay shared. Calls come from one informer's thread; the table is not locked.
    """

    __slots__ = ("_max_entries", "_max_width", "_table")

    def __init__(self, *, max_width: int = 4, max_entries: int = 100_000) -> None:
        self._table: dict[tuple[object, ...], JsonObject | list[object]] = {}
        self._max_width = max_width
        self._max_entries = max_entries

    def __call__(self, obj: JsonObject) -> JsonObject:
        if len(self._table) > self._max_entries:
            self._table.clear()
        interned = self._intern(obj)[1]
        return interned if isinstance(interned, dict) else obj

    def __len__(self) -> int:
        return len(self._table)

    def _intern(self, value: object) -> tuple[_Key | None, object]:
        if isinstance(value, str):
            return value, (sys.intern(value) if len(value) <= 64 else value)
        if isinstance(value, dict):
            shared = len(value) <= self._max_width
            entries: dict[str, object] = {}
            keys: list[object] = ["d"]
            for name, item in value.items():
                key, entries[name] = self._intern(item)
                if key is None:
                    shared = False
                elif shared:
                    keys += (name, key)
            return self._shared(tuple(keys), entries) if shared else (None, entries)
        if isinstance(value, list):
            shared = len(value) <= self._max_width
            items: list[object] = []
            keys = ["l"]
            for item in value:
                key, interned = self._intern(item)
                items.append(interned)
                if key is None:
                    shared = False
                elif shared:
                    keys.append(key)
            return self._shared(tuple(keys), items) if shared else (None, items)
        return (type(value), value), value

    def _shared(
        self, key: tuple[object, ...], fresh: JsonObject | list[object]
    ) -> tuple[_Key, object]:
        found = self._table.setdefault(key, fresh)
        return id(found), found


def chain(*transforms: Transform) -> Transform:
    """One transform applying ``transforms`` in order."""

    def applied(obj: JsonObject) -> JsonObject:
        for transform in transforms:
            obj = transform(obj)
        return obj

    return applied
