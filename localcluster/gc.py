"""Garbage collection and namespace cleanup, as kube-controller-manager does them, in-process.

A background thread follows every committed change (the store's commit hook only enqueues):
* an object whose every owner (``ownerReferences`` by uid) is gone is deleted — also one created
  with an owner that never existed or is already deleted; with some owners left, the dangling
  references are removed instead;
* an owner being deleted with ``propagationPolicy=Orphan`` (finalizer ``orphan``) has its
  dependents' references removed, then the finalizer; with ``Foreground`` (finalizer
  ``foregroundDeletion``) its dependents are deleted first, then the finalizer removed;
* a terminating namespace has its contents deleted, then is removed once empty.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from localcluster.errors import ApiError
from localcluster.resources import NAMESPACES, ResourceType
from localcluster.store import FOREGROUND_FINALIZER, ORPHAN_FINALIZER, Store, meta
from localcluster.watch import StoreEvent

JsonObj = dict[str, Any]

log = logging.getLogger(__name__)


def _owner_uids(obj: JsonObj | None) -> set[str]:
    if obj is None:
        return set()
    return {
        str(ref.get("uid"))
        for ref in meta(obj).get("ownerReferences") or []
        if isinstance(ref, dict) and ref.get("uid")
    }


def _where(obj: JsonObj) -> tuple[str, str]:
    metadata = meta(obj)
    return str(metadata.get("namespace") or ""), str(metadata["name"])


class GarbageCollector:
    """Owns one thread; ``start`` after the store exists, ``stop`` before dropping it."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._queue: queue.SimpleQueue[StoreEvent | None] = queue.SimpleQueue()
        self._dependents: dict[str, set[str]] = {}  # owner uid -> dependent uids
        self._idle = threading.Condition(threading.Lock())
        self._pending = 0
        self._thread: threading.Thread | None = None
        store.add_hook(self._enqueue)

    def _enqueue(self, event: StoreEvent) -> None:
        with self._idle:
            self._pending += 1
        self._queue.put(event)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="localcluster-gc", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def wait_idle(self, timeout: float) -> bool:
        """True once every change committed so far has been processed (for tests)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def _run(self) -> None:
        while (event := self._queue.get()) is not None:
            try:
                self._process(event)
            except Exception:
                log.exception(
                    "garbage collector failed on %s %s", event.type, event.resource.plural
                )
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _process(self, event: StoreEvent) -> None:
        uid = str(meta(event.obj).get("uid") or "")
        before, after = _owner_uids(event.old), _owner_uids(event.obj)
        for owner in before - after:
            self._dependents.get(owner, set()).discard(uid)
        if event.type == "DELETED":
            for owner in after:
                self._dependents.get(owner, set()).discard(uid)
            for dependent in sorted(self._dependents.pop(uid, set())):
                self._check_dependent(dependent)
            for owner in after:  # a foreground-deleting owner may be waiting for this one
                self._check_owner(owner)
            self._finalize_namespace(event)
            return
        for owner in after:
            self._dependents.setdefault(owner, set()).add(uid)
        if after:
            self._check_dependent(uid)
        if "deletionTimestamp" in meta(event.obj):
            self._check_owner(uid)
            if event.resource is NAMESPACES:
                self._empty_namespace(str(meta(event.obj)["name"]))

    def _check_dependent(self, uid: str) -> None:
        found = self._store.get_by_uid(uid)
        if found is None:
            return
        resource, obj = found
        owners = _owner_uids(obj)
        alive = {o for o in owners if self._store.get_by_uid(o) is not None}
        if alive == owners:
            return
        if not alive:
            self._delete(resource, obj)
        else:
            self._mutate(resource, obj, lambda o: _without_owners(o, owners - alive))

    def _check_owner(self, uid: str) -> None:
        found = self._store.get_by_uid(uid)
        if found is None or "deletionTimestamp" not in meta(found[1]):
            return
        resource, owner = found
        finalizers = meta(owner).get("finalizers") or []
        dependents = sorted(self._dependents.get(uid, set()))
        if ORPHAN_FINALIZER in finalizers:
            for dependent in dependents:
                got = self._store.get_by_uid(dependent)
                if got is not None:
                    self._mutate(got[0], got[1], lambda o: _without_owners(o, {uid}))
            self._mutate(resource, owner, lambda o: _without_finalizer(o, ORPHAN_FINALIZER))
        elif FOREGROUND_FINALIZER in finalizers:
            remaining = [d for d in dependents if self._store.get_by_uid(d) is not None]
            for dependent in remaining:
                got = self._store.get_by_uid(dependent)
                if got is not None and "deletionTimestamp" not in meta(got[1]):
                    self._delete(got[0], got[1])
            if not any(self._store.get_by_uid(d) is not None for d in remaining):
                self._mutate(resource, owner, lambda o: _without_finalizer(o, FOREGROUND_FINALIZER))

    def _empty_namespace(self, namespace: str) -> None:
        for resource, name in self._store.namespace_contents(namespace):
            try:
                self._store.delete(resource, namespace, name)
            except ApiError as exc:
                if exc.code != 404:
                    raise
        self._store.finalize_namespace(namespace)

    def _finalize_namespace(self, event: StoreEvent) -> None:
        namespace = meta(event.obj).get("namespace")
        if event.resource.namespaced and namespace:
            self._store.finalize_namespace(str(namespace))

    def _delete(self, resource: ResourceType, obj: JsonObj) -> None:
        namespace, name = _where(obj)
        try:
            self._store.delete(
                resource, namespace, name, precondition_uid=str(meta(obj).get("uid"))
            )
            log.debug("garbage-collected %s %s/%s", resource.plural, namespace, name)
        except ApiError as exc:
            if exc.code not in (404, 409):
                raise

    def _mutate(
        self, resource: ResourceType, obj: JsonObj, change: Callable[[JsonObj], JsonObj]
    ) -> None:
        namespace, name = _where(obj)
        uid = meta(obj).get("uid")

        def guarded(current: JsonObj) -> JsonObj:
            return change(current) if meta(current).get("uid") == uid else current

        try:
            self._store.mutate(resource, namespace, name, guarded)
        except ApiError as exc:
            if exc.code != 404:
                raise


def _without_owners(obj: JsonObj, gone: set[str]) -> JsonObj:
    refs = [r for r in meta(obj).get("ownerReferences") or [] if str(r.get("uid")) not in gone]
    metadata = {**meta(obj), "ownerReferences": refs}
    if not refs:
        del metadata["ownerReferences"]
    return {**obj, "metadata": metadata}


def _without_finalizer(obj: JsonObj, finalizer: str) -> JsonObj:
    finalizers = [f for f in meta(obj).get("finalizers") or [] if f != finalizer]
    metadata = {**meta(obj), "finalizers": finalizers}
    if not finalizers:
        del metadata["finalizers"]
    return {**obj, "metadata": metadata}
