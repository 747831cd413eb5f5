"""Watch fan-out: one queue per open watch, fed by the store under its lock.

A watcher sees events through its filter the way kube's watch cache reports them: an object that
stops matching a selector arrives as ``DELETED``, one that starts matching as ``ADDED``. The HTTP
thread serving the watch drains the queue without holding the store lock.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from localcluster.resources import ResourceType
from localcluster.selectors import ObjectFilter

JsonObj = dict[str, Any]

INITIAL_EVENTS_END = "k8s.io/initial-events-end"


@dataclass(frozen=True, slots=True)
class StoreEvent:
    """A committed change: ``obj`` is the new state (the final one for DELETED), ``old`` the
    state it replaced (None for ADDED)."""

    type: str
    resource: ResourceType
    rv: int
    obj: JsonObj
    old: JsonObj | None


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # ADDED | MODIFIED | DELETED | BOOKMARK | ERROR
    obj: JsonObj


class Watcher:
    """The queue of one watch stream. ``offer`` is called with the store lock held."""

    def __init__(self, resource: ResourceType, selection: ObjectFilter, *, capacity: int) -> None:
        self.resource = resource
        self.selection = selection
        self._capacity = capacity
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[WatchEvent] = deque()
        self._closed = False

    def offer(self, event: StoreEvent) -> None:
        was = event.old is not None and self.selection.matches(event.old)
        now = self.selection.matches(event.obj)
        if event.type == "DELETED":
            kind = "DELETED" if (was or now) else None
        elif event.type == "ADDED" or not was:
            kind = "ADDED" if now else None
        else:
            kind = "MODIFIED" if now else "DELETED"
        if kind is not None:
            self.push(WatchEvent(kind, event.obj))

    def push(self, event: WatchEvent) -> None:
        with self._cond:
            if self._closed:
                return
            if len(self._queue) >= self._capacity:
                # A consumer this far behind is cut off, as kube-apiserver does; it re-lists.
                self._closed = True
            else:
                self._queue.append(event)
            self._cond.notify()

    def is_idle(self) -> bool:
        with self._cond:
            return not self._queue

    def take(self, timeout: float) -> list[WatchEvent] | None:
        """Everything queued, waiting up to ``timeout``; [] when idle, None once closed and empty."""
        with self._cond:
            if not self._queue and not self._closed:
                self._cond.wait(timeout)
            if self._queue:
                events = list(self._queue)
                self._queue.clear()
                return events
            return None if self._closed else []

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed
