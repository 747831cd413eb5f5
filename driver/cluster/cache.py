"""The informer's local cache: objects by key, plus the secondary indexes callers look up by.

An index maps an index value (a node name, a ``namespace/claim`` key) to the keys of the objects
that produce it. Entries are removed with their object and empty buckets are dropped, so the cache
holds exactly the live objects whatever the churn. Objects handed out are the cached dicts
themselves: read-only by contract — ``copy.deepcopy`` before changing one for a write. The cache
adopts each object it stores (``views.adopt``), so the typed view of a cached object version is
parsed once; it releases the versions it replaces or drops.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable, Iterable

from driver.cluster import views
from driver.cluster.port import JsonObject, key_for, object_key

IndexFunc = Callable[[JsonObject], Iterable[str]]
IndexInputs = Callable[[JsonObject], object]
"""What an index function reads of an object besides its key (``IndexedCache.add_index``)."""


_UNSEEN = object()


class IndexedCache:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._items: dict[str, JsonObject] = {}
        self._index_funcs: dict[str, IndexFunc] = {}
        # index name -> index value -> object keys; and object key -> its values, to unindex
        self._indexes: dict[str, dict[str, set[str]]] = {}
        self._values: dict[str, dict[str, tuple[str, ...]]] = {}
        self._inputs: dict[str, IndexInputs] = {}
        # index name -> object key -> what ``inputs`` gave for the cached version
        self._seen: dict[str, dict[str, object]] = {}

    def add_index(self, name: str, func: IndexFunc, *, inputs: IndexInputs | None = None) -> None:
        """Register an index; objects already cached are indexed at once.

        ``inputs``, when given, returns what ``func`` reads of an object besides its key (compared
        with ``==``, so it must tell apart whatever ``func`` tells apart: bytes such as
        ``orjson.dumps`` of the fields). An update whose ``inputs`` equal the replaced version's
        keeps its index entries without calling ``func``: an object's status changes a few times
        in its life, the fields an index reads seldom.
        """
        with self._lock:
            if name in self._index_funcs:
                raise ValueError(f"index {name!r} already exists")
            self._index_funcs[name] = func
            self._indexes[name] = {}
            self._values[name] = {}
            if inputs is not None:
                self._inputs[name] = inputs
                self._seen[name] = {}
            for key, obj in self._items.items():
                self._index_one(name, key, obj)

    def upsert(self, obj: JsonObject) -> JsonObject | None:
        """Store ``obj``; return the object it replaced, if any."""
        key = object_key(obj)
        with self._lock:
            old = self._items.get(key)
            self._items[key] = obj
            views.adopt(obj)
            if old is not obj:
                views.release(old)
            for name in self._index_funcs:
                probe: object = _UNSEEN
                inputs = self._inputs.get(name)
                if inputs is not None:
                    probe = inputs(obj)
                    if old is not None and self._seen[name].get(key, _UNSEEN) == probe:
                        continue  # what the index function reads is unchanged: so are its values
                self._unindex_one(name, key)
                self._index_one(name, key, obj, probe)
            return old

    def remove(self, obj: JsonObject) -> JsonObject | None:
        """Drop the object with ``obj``'s key; return what was cached, if anything."""
        key = object_key(obj)
        with self._lock:
            old = self._items.pop(key, None)
            views.release(old)
            for name in self._index_funcs:
                self._unindex_one(name, key)
            for seen in self._seen.values():
                seen.pop(key, None)
            return old

    def get(self, name: str, *, namespace: str | None = None) -> JsonObject | None:
        with self._lock:
            return self._items.get(key_for(name=name, namespace=namespace))

    def get_by_key(self, key: str) -> JsonObject | None:
        with self._lock:
            return self._items.get(key)

    def list(self) -> list[JsonObject]:
        with self._lock:
            return list(self._items.values())

    def keys(self) -> builtins.list[str]:
        with self._lock:
            return list(self._items)

    def by_index(self, name: str, value: str) -> builtins.list[JsonObject]:
        with self._lock:
            if name not in self._indexes:
                raise KeyError(f"no index {name!r}")
            keys = self._indexes[name].get(value, ())
            return [self._items[key] for key in sorted(keys)]

    def index_values(self, name: str) -> builtins.list[str]:
        with self._lock:
            return sorted(self._indexes[name])

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def footprint(self) -> int:
        """Entries held across items and every index: stays proportional to the live objects."""
        with self._lock:
            index_entries = sum(
                len(keys) + 1 for buckets in self._indexes.values() for keys in buckets.values()
            )
            back_refs = sum(len(values) for values in self._values.values())
            return len(self._items) + index_entries + back_refs

    def _index_one(self, name: str, key: str, obj: JsonObject, probe: object = _UNSEEN) -> None:
        inputs = self._inputs.get(name)
        if inputs is not None:
            self._seen[name][key] = inputs(obj) if probe is _UNSEEN else probe
        values = tuple(dict.fromkeys(self._index_funcs[name](obj)))
        if not values:
            return
        self._values[name][key] = values
        buckets = self._indexes[name]
        for value in values:
            buckets.setdefault(value, set()).add(key)

    def _unindex_one(self, name: str, key: str) -> None:
        values = self._values[name].pop(key, ())
        buckets = self._indexes[name]
        for value in values:
            bucket = buckets.get(value)
            if bucket is None:
                continue
            bucket.discard(key)
            if not bucket:
                del buckets[value]
