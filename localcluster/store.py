"""In-memory storage with kube-apiserver's write semantics and a bounded watch history.

One lock guards everything: the objects (indexed by resource, then namespace, then name), a uid
index, one global resourceVersion counter, the event history and the open watchers. Stored objects
are never mutated after they are stored: every write builds a new dict, so readers may serialize a
stored object without the lock. Validation and strategy run under the lock, so a write is checked
against exactly the state it replaces (stale ``resourceVersion`` → 409).
"""

from __future__ import annotations

import copy
import logging
import secrets
import threading
import uuid
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from localcluster import errors, strategy, validation
from localcluster.resources import NAMESPACES, PODS, RESOURCES, ResourceType
from localcluster.selectors import ObjectFilter
from localcluster.watch import INITIAL_EVENTS_END, StoreEvent, Watcher, WatchEvent

JsonObj = dict[str, Any]
CommitHook = Callable[[StoreEvent], None]

log = logging.getLogger(__name__)

ORPHAN_FINALIZER = "orphan"
FOREGROUND_FINALIZER = "foregroundDeletion"
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # kube's utilrand alphabet: no vowels, no 0/1/3
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def now_rfc3339(offset_s: float = 0) -> str:
    moment = datetime.now(UTC) + timedelta(seconds=offset_s)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def meta(obj: JsonObj) -> JsonObj:
    value = obj.get("metadata")
    return value if isinstance(value, dict) else {}


def _deletion_complete(resource: ResourceType, obj: JsonObj) -> bool:
    """kube's ShouldDeleteDuringUpdate: marked for deletion, no finalizers, no grace period left
    (a bound pod in its grace period waits for its kubelet's delete instead)."""
    metadata = meta(obj)
    if "deletionTimestamp" not in metadata or metadata.get("finalizers"):
        return False
    return resource is not NAMESPACES and not metadata.get("deletionGracePeriodSeconds")


class Store:
    """The API server's state; every public method is thread-safe."""

    def __init__(
        self,
        *,
        watch_history: int = 10_000,
        require_namespaces: bool = False,
        graceful_pod_deletion: bool = False,
    ) -> None:
        self._lock = threading.Lock()
        self._objects: dict[ResourceType, dict[str, dict[str, JsonObj]]] = {
            r: {} for r in RESOURCES
        }
        self._by_uid: dict[str, tuple[ResourceType, str, str]] = {}
        self._rv = 0
        self._history: deque[StoreEvent] = deque(maxlen=max(1, watch_history))
        self._compacted = 0
        self._watchers: dict[ResourceType, set[Watcher]] = {r: set() for r in RESOURCES}
        self._watch_capacity = max(1000, watch_history)
        self._hooks: list[CommitHook] = []
        self._require_namespaces = require_namespaces
        self._graceful_pods = graceful_pod_deletion
        for name in DEFAULT_NAMESPACES:
            self.create(NAMESPACES, "", {"metadata": {"name": name}})

    def add_hook(self, hook: CommitHook) -> None:
        """Called under the lock after every commit: must only enqueue, never call back."""
        with self._lock:
            self._hooks.append(hook)

    # --- reads ----------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    def get(self, resource: ResourceType, namespace: str, name: str) -> JsonObj:
        with self._lock:
            obj = self._objects[resource].get(namespace, {}).get(name)
        if obj is None:
            raise errors.not_found(resource, name)
        return obj

    def get_by_uid(self, uid: str) -> tuple[ResourceType, JsonObj] | None:
        with self._lock:
            where = self._by_uid.get(uid)
            if where is None:
                return None
            resource, namespace, name = where
            return resource, self._objects[resource][namespace][name]

    def list_objects(
        self, resource: ResourceType, selection: ObjectFilter
    ) -> tuple[list[JsonObj], int]:
        with self._lock:
            spaces = self._objects[resource]
            if selection.namespace is not None:
                names = spaces.get(selection.namespace, {})
                candidates = [names[n] for n in sorted(names)]
            else:
                candidates = [spaces[ns][n] for ns in sorted(spaces) for n in sorted(spaces[ns])]
            rv = self._rv
        return [obj for obj in candidates if selection.matches(obj)], rv

    # --- writes ---------------------------------------------------------------------------------

    def create(self, resource: ResourceType, namespace: str, obj: JsonObj) -> JsonObj:
        obj = copy.deepcopy(obj)
        obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        metadata = obj.setdefault("metadata", {})
        if not isinstance(metadata, dict):
            raise errors.bad_request("metadata must be an object")
        for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"):
            metadata.pop(key, None)
        if resource.namespaced:
            metadata["namespace"] = namespace
        else:
            metadata.pop("namespace", None)
        strategy.prepare_create(resource, obj)
        with self._lock:
            if not metadata.get("name") and metadata.get("generateName"):
                metadata["name"] = self._generate_name(resource, namespace, metadata)
            problems = validation.validate_create(resource, obj)
            name = str(metadata.get("name") or "")
            if problems:
                raise errors.invalid(resource, name, problems)
            if resource.namespaced:
                self._check_namespace(namespace)
            existing = self._objects[resource].get(namespace, {}).get(name)
            if existing is not None:
                raise errors.already_exists(
                    resource, name, being_deleted="deletionTimestamp" in meta(existing)
                )
            metadata["uid"] = str(uuid.uuid4())
            metadata["creationTimestamp"] = now_rfc3339()
            self._commit(resource, "ADDED", obj, None)
        return obj

    def _generate_name(self, resource: ResourceType, namespace: str, metadata: JsonObj) -> str:
        base = str(metadata["generateName"])[:58]
        names = self._objects[resource].get(namespace, {})
        for _ in range(8):
            candidate = base + "".join(secrets.choice(_NAME_CHARS) for _ in range(5))
            if candidate not in names:
                return candidate
        return candidate  # eight collisions in a row: let create report AlreadyExists

    def _check_namespace(self, namespace: str) -> None:
        ns = self._objects[NAMESPACES].get("", {}).get(namespace)
        if ns is None:
            if self._require_namespaces:
                raise errors.namespace_not_found(namespace)
            return
        if "deletionTimestamp" in meta(ns):
            raise errors.ApiError(
                403,
                "Forbidden",
                f"unable to create new content in namespace {namespace} because it is being "
                "terminated",
            )

    def update(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        obj: JsonObj,
        *,
        subresource: str | None = None,
        expect_rv: str | None = None,
    ) -> JsonObj:
        """Replace an object (or its status). ``expect_rv`` (or the body's resourceVersion)
        must match the stored one, else 409."""
        new = copy.deepcopy(obj)
        new["apiVersion"], new["kind"] = resource.api_version, resource.kind
        new_meta = new.setdefault("metadata", {})
        if not isinstance(new_meta, dict):
            raise errors.bad_request("metadata must be an object")
        wanted_rv = expect_rv or new_meta.get("resourceVersion") or None
        with self._lock:
            old = self._objects[resource].get(namespace, {}).get(name)
            if old is None:
                raise errors.not_found(resource, name)
            if wanted_rv is not None and str(wanted_rv) != meta(old).get("resourceVersion"):
                raise errors.conflict(resource, name, errors.STALE)
            new = strategy.prepare_update(resource, old, new, subresource=subresource)
            problems = validation.validate_update(resource, old, new, subresource=subresource)
            if problems:
                raise errors.invalid(resource, name, problems)
            new["metadata"]["resourceVersion"] = meta(old).get("resourceVersion")
            if new == old:
                return old  # kube skips writes that change nothing: same resourceVersion, no event
            if _deletion_complete(resource, new):
                return self._remove(resource, namespace, name, new)
            self._commit(resource, "MODIFIED", new, old)
        return new

    def delete(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        *,
        propagation: str | None = None,
        precondition_uid: str | None = None,
        precondition_rv: str | None = None,
        grace_seconds: int | None = None,
    ) -> JsonObj:
        """Delete now, or mark with ``deletionTimestamp`` while finalizers remain."""
        with self._lock:
            old = self._objects[resource].get(namespace, {}).get(name)
            if old is None:
                raise errors.not_found(resource, name)
            old_meta = meta(old)
            if precondition_uid and precondition_uid != old_meta.get("uid"):
                raise errors.conflict(
                    resource,
                    name,
                    f"Precondition failed: UID in precondition: "
                    f"{precondition_uid}, UID in object meta: {old_meta.get('uid')}",
                )
            if precondition_rv and precondition_rv != old_meta.get("resourceVersion"):
                raise errors.conflict(
                    resource,
                    name,
                    f"Precondition failed: ResourceVersion in "
                    f"precondition: {precondition_rv}, ResourceVersion in object "
                    f"meta: {old_meta.get('resourceVersion')}",
                )
            finalizers = list(old_meta.get("finalizers") or [])
            if "deletionTimestamp" in old_meta:
                if (
                    resource is PODS
                    and grace_seconds == 0
                    and old_meta.get("deletionGracePeriodSeconds")
                ):
                    if not finalizers:
                        return self._remove(resource, namespace, name, old)
                    now = {**old, "metadata": {**old_meta, "deletionGracePeriodSeconds": 0}}
                    self._commit(resource, "MODIFIED", now, old)
                    return now
                return old
            extra = {"Orphan": ORPHAN_FINALIZER, "Foreground": FOREGROUND_FINALIZER}
            if propagation in extra and extra[propagation] not in finalizers:
                finalizers.append(extra[propagation])
            grace = self._pod_grace(resource, old, grace_seconds)
            if not finalizers and not grace and resource is not NAMESPACES:
                return self._remove(resource, namespace, name, old)
            new = {**old, "metadata": {**old_meta, "finalizers": finalizers}}
            if not finalizers:
                del new["metadata"]["finalizers"]
            new["metadata"]["deletionTimestamp"] = now_rfc3339(grace)
            new["metadata"]["deletionGracePeriodSeconds"] = grace
            if resource is NAMESPACES:
                new["status"] = {**(old.get("status") or {}), "phase": "Terminating"}
            self._commit(resource, "MODIFIED", new, old)
        return new

    def mutate(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        change: Callable[[JsonObj], JsonObj],
    ) -> JsonObj:
        """An internal write (binding, garbage collection): ``change`` gets the stored object and
        returns the new one (a new dict, the stored one is left alone) or raises ApiError. No
        validation; finalizer removal completes a pending deletion."""
        with self._lock:
            old = self._objects[resource].get(namespace, {}).get(name)
            if old is None:
                raise errors.not_found(resource, name)
            new = change(old)
            if new is old or new == old:
                return old
            new = {**new, "metadata": dict(meta(new))}  # never touch the stored metadata dict
            if _deletion_complete(resource, new):
                return self._remove(resource, namespace, name, new)
            self._commit(resource, "MODIFIED", new, old)
        return new

    def namespace_contents(self, namespace: str) -> list[tuple[ResourceType, str]]:
        with self._lock:
            return [
                (r, name)
                for r in RESOURCES
                if r.namespaced
                for name in self._objects[r].get(namespace, {})
            ]

    def finalize_namespace(self, name: str) -> bool:
        """Remove a terminating namespace once nothing is left in it."""
        with self._lock:
            ns = self._objects[NAMESPACES].get("", {}).get(name)
            if ns is None or "deletionTimestamp" not in meta(ns) or meta(ns).get("finalizers"):
                return False
            if any(self._objects[r].get(name) for r in RESOURCES if r.namespaced):
                return False
            self._remove(NAMESPACES, "", name, ns)
            return True

    def _pod_grace(self, resource: ResourceType, pod: JsonObj, grace_seconds: int | None) -> int:
        """Bound pods wait for their kubelet (grace period), unbound ones go at once."""
        if resource is not PODS or not self._graceful_pods:
            return 0
        if not (pod.get("spec") or {}).get("nodeName"):
            return 0
        if grace_seconds is None:
            return int((pod.get("spec") or {}).get("terminationGracePeriodSeconds") or 30)
        return max(0, grace_seconds)

    def _remove(self, resource: ResourceType, namespace: str, name: str, last: JsonObj) -> JsonObj:
        final = {**last, "metadata": dict(meta(last))}
        self._commit(resource, "DELETED", final, self._objects[resource][namespace][name])
        return final

    def _commit(self, resource: ResourceType, kind: str, obj: JsonObj, old: JsonObj | None) -> None:
        """Assign the next resourceVersion, store, index, record and fan out. Lock held."""
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        metadata = obj["metadata"]
        namespace = metadata.get("namespace", "") if resource.namespaced else ""
        name = metadata["name"]
        if kind == "DELETED":
            spaces = self._objects[resource]
            del spaces[namespace][name]
            if not spaces[namespace]:
                del spaces[namespace]
            self._by_uid.pop(metadata.get("uid", ""), None)
        else:
            self._objects[resource].setdefault(namespace, {})[name] = obj
            self._by_uid[metadata["uid"]] = (resource, namespace, name)
        event = StoreEvent(kind, resource, self._rv, obj, old)
        if len(self._history) == self._history.maxlen:
            self._compacted = self._history[0].rv
        self._history.append(event)
        for watcher in self._watchers[resource]:
            watcher.offer(event)
        for hook in self._hooks:
            hook(event)

    # --- watch ----------------------------------------------------------------------------------

    def watch(
        self,
        resource: ResourceType,
        selection: ObjectFilter,
        *,
        since: int | None,
        initial_events_end: bool = False,
    ) -> Watcher:
        """Open a watch: from ``since`` (410 if the history no longer reaches back that far), or
        with synthetic ADDED events for the current state when ``since`` is None."""
        watcher = Watcher(resource, selection, capacity=self._watch_capacity)
        with self._lock:
            if since is None:
                spaces = self._objects[resource]
                for ns in sorted(spaces) if selection.namespace is None else [selection.namespace]:
                    for name in sorted(spaces.get(ns, {})):
                        obj = spaces[ns][name]
                        if selection.matches(obj):
                            watcher.push(WatchEvent("ADDED", obj))
                if initial_events_end:
                    watcher.push(WatchEvent("BOOKMARK", self._bookmark(resource, end=True)))
            else:
                if since < self._compacted:
                    oldest = self._history[0].rv if self._history else self._rv
                    raise errors.expired(since, oldest)
                replay: list[StoreEvent] = []
                for event in reversed(self._history):
                    if event.rv <= since:
                        break
                    if event.resource is resource:
                        replay.append(event)
                for event in reversed(replay):
                    watcher.offer(event)
            self._watchers[resource].add(watcher)
        return watcher

    def _bookmark(self, resource: ResourceType, *, end: bool = False) -> JsonObj:
        metadata: JsonObj = {"resourceVersion": str(self._rv)}
        if end:
            metadata["annotations"] = {INITIAL_EVENTS_END: "true"}
        return {"kind": resource.kind, "apiVersion": resource.api_version, "metadata": metadata}

    def bookmark(self, watcher: Watcher) -> JsonObj | None:
        """A BOOKMARK at the current resourceVersion, if nothing is pending for ``watcher``."""
        with self._lock:
            if not watcher.is_idle():
                return None
            return self._bookmark(watcher.resource)

    def unwatch(self, watcher: Watcher) -> None:
        watcher.close()
        with self._lock:
            self._watchers[watcher.resource].discard(watcher)

    def close_watches(self) -> None:
        with self._lock:
            watchers = [w for group in self._watchers.values() for w in group]
            for group in self._watchers.values():
                group.clear()
        for watcher in watchers:
            watcher.close()

    def compact(self) -> None:
        """Forget the history: a watch from any older resourceVersion now gets 410 Expired."""
        with self._lock:
            self._history.clear()
            self._compacted = self._rv
