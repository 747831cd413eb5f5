"""kube-controller-manager's disruption controller, in-process: keeps every PodDisruptionBudget's
status current, so the eviction subresource reads the numbers a real control plane would hold.

A background thread follows committed changes of pods and budgets (the store's commit hook only
enqueues). A budget is synced when it changes and when a pod it selects (before or after the
change) changes; changes that arrive together are synced once per budget. A sync lists the
budget's pods, computes its status (``budgets``) and writes it through ``/status`` with the
budget's resourceVersion as precondition: an eviction that wrote in between wins, and its own
change brings the budget back here. An entry of ``disruptedPods`` is dropped once its pod is seen
deleting, or when it runs out; the budget is synced again then.

Left out: the Warning events the real controller records (``NoPods``, ``UnmanagedPods``, …) and
its clearing of stale ``DisruptionTarget`` pod conditions.
"""

from __future__ import annotations

import logging
import queue
import threading
from datetime import datetime, timedelta
from typing import Any

from driver.cluster.clock import Clock, SystemClock
from localcluster.errors import ApiError, qualified
from localcluster.policy import budgets
from localcluster.resources import (
    DEPLOYMENTS,
    POD_DISRUPTION_BUDGETS,
    PODS,
    REPLICA_SETS,
    RESOURCES,
    STATEFUL_SETS,
    ResourceType,
)
from localcluster.selectors import ObjectFilter
from localcluster.store import Store, meta
from localcluster.watch import StoreEvent

JsonObj = dict[str, Any]
BudgetKey = tuple[str, str]

log = logging.getLogger(__name__)

_APPS_GROUPS = ("apps", "extensions")
_SCALABLE = (DEPLOYMENTS, REPLICA_SETS, STATEFUL_SETS)


class DisruptionController:
    """Owns one thread; ``start`` after the store exists, ``stop`` before dropping it."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock | None = None,
        deletion_timeout: timedelta = budgets.DELETION_TIMEOUT,
    ) -> None:
        self._store = store
        self._clock: Clock = clock or SystemClock()
        self._deletion_timeout = deletion_timeout
        self._queue: queue.SimpleQueue[StoreEvent | None] = queue.SimpleQueue()
        self._rechecks: dict[BudgetKey, datetime] = {}
        self._idle = threading.Condition(threading.Lock())
        self._pending = 0
        self._thread: threading.Thread | None = None
        store.add_hook(self._enqueue)

    def _enqueue(self, event: StoreEvent) -> None:
        if event.resource is not PODS and event.resource is not POD_DISRUPTION_BUDGETS:
            return
        with self._idle:
            self._pending += 1
        self._queue.put(event)

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name="localcluster-disruption", daemon=True
        )
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
        while True:
            try:
                first = self._queue.get(timeout=self._until_recheck())
            except queue.Empty:
                self._sync_all(self._due_rechecks())
                continue
            batch = [first]
            while batch[-1] is not None:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            events = [e for e in batch if e is not None]
            try:
                self._sync_all(self._budgets_touched(events) | self._due_rechecks())
            finally:
                with self._idle:
                    self._pending -= len(events)
                    self._idle.notify_all()
            if len(events) < len(batch):
                return

    def _until_recheck(self) -> float | None:
        if not self._rechecks:
            return None
        earliest = min(self._rechecks.values())
        return max(0.0, (earliest - self._clock.now()).total_seconds()) + 0.01

    def _due_rechecks(self) -> set[BudgetKey]:
        now = self._clock.now()
        due = {key for key, when in self._rechecks.items() if when <= now}
        for key in due:
            del self._rechecks[key]
        return due

    def _budgets_touched(self, events: list[StoreEvent]) -> set[BudgetKey]:
        touched: set[BudgetKey] = set()
        for event in events:
            namespace = str(meta(event.obj).get("namespace") or "")
            if event.resource is POD_DISRUPTION_BUDGETS:
                key = (namespace, str(meta(event.obj)["name"]))
                if event.type == "DELETED":
                    self._rechecks.pop(key, None)
                    touched.discard(key)
                else:
                    touched.add(key)
                continue
            pods = [p for p in (event.old, event.obj) if p is not None]
            for pdb in self._store.list_objects(
                POD_DISRUPTION_BUDGETS, ObjectFilter(namespace=namespace)
            )[0]:
                if any(budgets.selects(pdb, pod) for pod in pods):
                    touched.add((namespace, str(meta(pdb)["name"])))
        return touched

    def _sync_all(self, keys: set[BudgetKey]) -> None:
        for key in sorted(keys):
            try:
                self.sync(*key)
            except Exception:
                log.exception("disruption controller failed on budget %s/%s", *key)

    def sync(self, namespace: str, name: str) -> None:
        """Compute and write one budget's status: on the controller's thread, or on a test's
        while the thread is not started."""
        try:
            pdb = self._store.get(POD_DISRUPTION_BUDGETS, namespace, name)
        except ApiError as exc:
            if exc.code == 404:
                return
            raise
        pods = [
            pod
            for pod in self._store.list_objects(PODS, ObjectFilter(namespace=namespace))[0]
            if budgets.selects(pdb, pod)
        ]
        now = self._clock.now()
        try:
            expected = budgets.expectation(pdb, pods, self._controller_scale)
        except budgets.BudgetSyncError as exc:
            log.debug("budget %s/%s fails safe: %s", namespace, name, exc)
            self._write(pdb, budgets.failed_status(pdb, str(exc), now))
            return
        disrupted, recheck = budgets.disrupted_pods(pdb, pods, now, self._deletion_timeout)
        healthy = budgets.current_healthy(pods, disrupted)
        status = budgets.synced_status(
            pdb, expected=expected, healthy=healthy, disrupted=disrupted, now=now
        )
        if self._write(pdb, status) and recheck is not None:
            self._rechecks[(namespace, name)] = recheck

    def _write(self, pdb: JsonObj, status: JsonObj) -> bool:
        """Write the status unless someone wrote the budget meanwhile (their event comes here)."""
        metadata = meta(pdb)
        try:
            self._store.update(
                POD_DISRUPTION_BUDGETS,
                str(metadata.get("namespace") or ""),
                str(metadata["name"]),
                {**pdb, "status": status},
                subresource="status",
                expect_rv=str(metadata.get("resourceVersion")),
            )
        except ApiError as exc:
            if exc.code in (404, 409):
                return False
            raise
        return True

    def _controller_scale(self, ref: JsonObj, namespace: str) -> tuple[str, int] | None:
        """The real controller's finders: a ReplicaSet's Deployment (else the ReplicaSet itself),
        then any kind with a ``scale`` subresource (Deployment, ReplicaSet, StatefulSet)."""
        group, kind = _group_of(ref), str(ref.get("kind") or "")
        if group in _APPS_GROUPS and kind == "ReplicaSet":
            replica_set = self._owned(REPLICA_SETS, namespace, ref)
            if replica_set is None:
                return None
            owner = budgets.controller_ref(replica_set)
            if owner is not None and owner.get("kind") == "Deployment":
                deployment = (
                    self._owned(DEPLOYMENTS, namespace, owner)
                    if _group_of(owner) in _APPS_GROUPS
                    else None
                )
                if deployment is not None:
                    return _scale(deployment)
            return _scale(replica_set)
        resource = _served(group, kind)
        if resource is None:
            raise budgets.BudgetSyncError(
                f'no matches for kind "{kind}" in version "{ref.get("apiVersion")}"'
            )
        if resource not in _SCALABLE:
            raise budgets.BudgetSyncError(
                f"{qualified(resource)} does not implement the scale subresource"
            )
        target = self._owned(resource, namespace, ref)
        return _scale(target) if target is not None else None

    def _owned(self, resource: ResourceType, namespace: str, ref: JsonObj) -> JsonObj | None:
        """The object a reference names, if it is still the one (same uid)."""
        try:
            found = self._store.get(resource, namespace, str(ref.get("name") or ""))
        except ApiError:
            return None
        return found if meta(found).get("uid") == ref.get("uid") else None


def _group_of(ref: JsonObj) -> str:
    return str(ref.get("apiVersion") or "").rpartition("/")[0]


def _served(group: str, kind: str) -> ResourceType | None:
    for resource in RESOURCES:
        if resource.group == group and resource.kind == kind:
            return resource
    return None


def _scale(obj: JsonObj) -> tuple[str, int]:
    replicas = (obj.get("spec") or {}).get("replicas")
    return str(meta(obj).get("uid")), 1 if replicas is None else int(replicas)
