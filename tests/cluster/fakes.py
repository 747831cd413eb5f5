"""Small fakes for the cluster layer's seams (clock, lister-watcher)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

from driver.closing import ClosedOnExit
from driver.cluster.port import JsonObject, ObjectList, ObjectTransform, WatchEvent


class FakeClock:
    """Time that moves only when told to."""

    def __init__(self, *, start: float = 1000.0) -> None:
        self._mono = start
        self._wall = datetime(2026, 1, 1, tzinfo=UTC)
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def now(self) -> datetime:
        with self._lock:
            return self._wall

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._mono += seconds
            self._wall += timedelta(seconds=seconds)


class ScriptedStream(ClosedOnExit):
    """A watch stream that yields given events then ends (or raises ``error`` at the end)."""

    def __init__(self, events: list[WatchEvent], *, error: Exception | None = None) -> None:
        self._events = events
        self._error = error
        self.closed = False

    def __iter__(self) -> Iterator[WatchEvent]:
        yield from self._events
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        self.closed = True


class ScriptedListerWatcher:
    """Answers list/watch calls from scripted callables; records each call."""

    def __init__(
        self,
        *,
        lists: Callable[[int], ObjectList],
        watches: Callable[[int, str], ScriptedStream],
    ) -> None:
        self._lists = lists
        self._watches = watches
        self.list_calls = 0
        self.watch_calls: list[str] = []
        self.call_times: list[float] = []
        self._lock = threading.Lock()

    def list_objects(self, *, transform: ObjectTransform | None = None) -> ObjectList:
        with self._lock:
            self.list_calls += 1
            n = self.list_calls
            self.call_times.append(time.monotonic())
        listed = self._lists(n)
        if transform is None:
            return listed
        return ObjectList(
            items=[transform(o) for o in listed.items], resource_version=listed.resource_version
        )

    def watch(self, *, resource_version: str, timeout_seconds: int) -> ScriptedStream:
        with self._lock:
            self.watch_calls.append(resource_version)
            n = len(self.watch_calls)
            self.call_times.append(time.monotonic())
        return self._watches(n, resource_version)


def obj(name: str, rv: str, *, namespace: str | None = "ns", **extra: object) -> JsonObject:
    meta: JsonObject = {"name": name, "resourceVersion": rv, "uid": f"uid-{name}"}
    if namespace is not None:
        meta["namespace"] = namespace
    return {"metadata": meta, **extra}
