"""The informers' figures on /metrics: objects cached follow the objects that exist (deletes
included), and a 410 Gone shows as one more list."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from driver.cluster.informer import Informer
from driver.cluster.informer_metrics import InformerCollector
from driver.cluster.port import ObjectList, WatchEvent, WatchEventType
from driver.errors import GoneError
from tests.cluster.fakes import ScriptedListerWatcher, ScriptedStream, obj
from tests.cluster.test_informer_unit import idle_stream, wait_until


def _figures(registry: CollectorRegistry) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_objects_follow_the_cache_and_a_410_counts_one_more_list() -> None:
    def lists(n: int) -> ObjectList:
        items = [obj("a", "1"), obj("b", "2"), obj("c", "3")] if n == 1 else [obj("a", "9")]
        return ObjectList(items=items, resource_version="3" if n == 1 else "9")

    def watches(n: int, rv: str) -> ScriptedStream:
        if n == 1:
            return ScriptedStream([WatchEvent(type=WatchEventType.DELETED, object=obj("c", "4"))])
        if n == 2:
            return ScriptedStream([], error=GoneError("too old resource version: 4"))
        return idle_stream()

    informer = Informer(source=ScriptedListerWatcher(lists=lists, watches=watches), name="t")
    registry = CollectorRegistry()
    registry.register(InformerCollector(namespace="x", informers=lambda: {"things": informer}))
    informer.start()
    try:
        assert wait_until(lambda: informer.relists == 2)
        assert wait_until(lambda: len(informer.cache) == 1)
        figures = _figures(registry)
        assert figures['x_informer_objects{informer="things"}'] == 1
        assert figures['x_informer_lists_total{informer="things"}'] == 2
    finally:
        informer.stop()
