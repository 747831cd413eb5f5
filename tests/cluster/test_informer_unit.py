"""Informer loop against a scripted lister-watcher: backoff, resume, re-list on 410."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable

import pytest

from driver.cluster.informer import Backoff, Informer, strip_managed_fields
from driver.cluster.port import JsonObject, ObjectList, WatchEvent, WatchEventType
from driver.errors import ClusterError, GoneError
from tests.cluster.fakes import ScriptedListerWatcher, ScriptedStream, obj


def wait_until(predicate: Callable[[], bool], *, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()

    def on_add(self, o: JsonObject) -> None:
        self._log("add", o)

    def on_update(self, old: JsonObject, new: JsonObject) -> None:
        self._log("update", new)

    def on_delete(self, o: JsonObject) -> None:
        self._log("delete", o)

    def _log(self, what: str, o: JsonObject) -> None:
        with self._lock:
            self.events.append((what, o["metadata"]["name"], o["metadata"]["resourceVersion"]))


def idle_stream() -> ScriptedStream:
    """A watch that blocks until closed, like a quiet server."""

    class Idle(ScriptedStream):
        def __init__(self) -> None:
            super().__init__([])
            self._closed = threading.Event()

        def __iter__(self):  # type: ignore[no-untyped-def]
            self._closed.wait(10)
            return iter(())

        def close(self) -> None:
            super().close()
            self._closed.set()

    return Idle()


def test_backs_off_exponentially_while_listing_fails_then_recovers() -> None:
    def lists(n: int) -> ObjectList:
        if n <= 3:
            raise ClusterError("connection refused")
        return ObjectList(items=[obj("a", "5")], resource_version="5")

    source = ScriptedListerWatcher(lists=lists, watches=lambda n, rv: idle_stream())
    informer = Informer(
        source=source,
        name="t",
        backoff=Backoff(initial=0.05, factor=2.0, maximum=1.0, jitter=0.0),
        rng=random.Random(1),
    )
    informer.start()
    try:
        assert informer.wait_for_sync(timeout=5)
        times = source.call_times[:4]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert [gap >= expected for gap, expected in zip(gaps, [0.05, 0.1, 0.2], strict=True)] == [
            True,
            True,
            True,
        ]
        assert informer.failures == 0
        assert informer.get("a", namespace="ns") is not None
    finally:
        informer.stop()


def test_watch_errors_resume_from_last_version_and_410_relists() -> None:
    def lists(n: int) -> ObjectList:
        if n == 1:
            return ObjectList(items=[obj("a", "1"), obj("b", "2")], resource_version="2")
        # after the 410: a changed, b deleted, c created while we were away
        return ObjectList(items=[obj("a", "7"), obj("c", "8")], resource_version="9")

    def watches(n: int, rv: str) -> ScriptedStream:
        if n == 1:
            return ScriptedStream(
                [
                    WatchEvent(WatchEventType.MODIFIED, obj("a", "3")),
                    WatchEvent(WatchEventType.BOOKMARK, {"metadata": {"resourceVersion": "4"}}),
                ],
                error=ClusterError("connection reset"),
            )
        if n == 2:
            return ScriptedStream([], error=GoneError("too old resource version: 4"))
        return idle_stream()

    source = ScriptedListerWatcher(lists=lists, watches=watches)
    informer = Informer(
        source=source, name="t", backoff=Backoff(initial=0.01, jitter=0.0), watch_timeout_seconds=60
    )
    recorder = Recorder()
    informer.add_handler(
        on_add=recorder.on_add, on_update=recorder.on_update, on_delete=recorder.on_delete
    )
    informer.start()
    try:
        assert wait_until(lambda: len(source.watch_calls) >= 3)
        assert source.watch_calls == ["2", "4", "9"]  # resumed from the bookmark, then re-listed
        assert source.list_calls == 2
        assert recorder.events == [
            ("add", "a", "1"),
            ("add", "b", "2"),
            ("update", "a", "3"),
            ("delete", "b", "2"),
            ("update", "a", "7"),
            ("add", "c", "8"),
        ]
        assert sorted(o["metadata"]["name"] for o in informer.list()) == ["a", "c"]
    finally:
        informer.stop()


@pytest.mark.parametrize("failures", [1, 3, 20], ids=["first", "third", "capped"])
def test_backoff_delay_grows_and_caps(failures: int) -> None:
    backoff = Backoff(initial=0.2, factor=2.0, maximum=1.0, jitter=0.5)
    base = min(1.0, 0.2 * 2 ** (failures - 1))
    delays = [backoff.delay(failures, random.Random(seed)) for seed in range(20)]
    assert all(base <= d <= base * 1.5 for d in delays)
    assert len(set(delays)) > 1  # jittered


def test_handler_added_late_gets_existing_objects_and_a_failing_handler_is_contained() -> None:
    source = ScriptedListerWatcher(
        lists=lambda n: ObjectList(items=[obj("a", "1")], resource_version="1"),
        watches=lambda n, rv: idle_stream(),
    )
    informer = Informer(source=source, name="t")

    def failing(o: JsonObject) -> None:
        raise RuntimeError("handler bug")

    informer.add_handler(on_add=failing)
    informer.start()
    try:
        assert informer.wait_for_sync(timeout=5)
        recorder = Recorder()
        informer.add_handler(on_add=recorder.on_add)
        assert recorder.events == [("add", "a", "1")]
    finally:
        informer.stop()


def test_a_transform_applies_to_listed_and_watched_objects_before_caching() -> None:
    def with_fields(name: str, rv: str) -> JsonObject:
        o = obj(name, rv)
        o["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Update"}]
        return o

    def lists(n: int) -> ObjectList:
        return ObjectList(items=[with_fields("a", "1")], resource_version="1")

    def watches(n: int, rv: str) -> ScriptedStream:
        if n == 1:
            return ScriptedStream(
                [
                    WatchEvent(WatchEventType.ADDED, with_fields("b", "2")),
                    WatchEvent(WatchEventType.MODIFIED, with_fields("a", "3")),
                    WatchEvent(WatchEventType.BOOKMARK, {"metadata": {"resourceVersion": "4"}}),
                ]
            )
        return idle_stream()

    source = ScriptedListerWatcher(lists=lists, watches=watches)
    informer = Informer(
        source=source,
        name="t",
        backoff=Backoff(initial=0.01, jitter=0.0),
        transform=strip_managed_fields,
    )
    handed: list[JsonObject] = []
    informer.add_handler(on_add=handed.append, on_update=lambda old, new: handed.append(new))
    informer.start()
    try:
        assert wait_until(lambda: informer.last_resource_version == "4")
        cached = {o["metadata"]["name"]: o for o in informer.list()}
        assert cached["a"]["metadata"] == {
            "name": "a",
            "namespace": "ns",
            "resourceVersion": "3",
            "uid": "uid-a",
        }
        assert "managedFields" not in cached["b"]["metadata"]
        assert [o["metadata"]["resourceVersion"] for o in handed] == ["1", "2", "3"]
        assert all("managedFields" not in o["metadata"] for o in handed)
    finally:
        informer.stop()


def test_strip_managed_fields_leaves_the_input_and_objects_without_them_alone() -> None:
    plain = obj("a", "1")
    assert strip_managed_fields(plain) is plain
    full = obj("b", "2")
    full["metadata"]["managedFields"] = [{"manager": "m"}]
    stripped = strip_managed_fields(full)
    assert "managedFields" not in stripped["metadata"]
    assert full["metadata"]["managedFields"] == [{"manager": "m"}]  # the input is not mutated
