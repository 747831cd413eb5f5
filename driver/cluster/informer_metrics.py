"""Prometheus figures of a daemon's informers: objects cached and lists done, per informer.

Read when scraped, from the informers themselves, so they cannot drift: ``<namespace>_informer_objects``
(what a cache holds; over a long run it must follow the objects that exist, never grow past them)
and ``<namespace>_informer_lists`` (lists since start: one at start, one more after each 410 Gone or
error that needed a fresh list — a watch that resumes after a dropped connection lists nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from driver.cluster.informer import Informer


class InformerCollector(Collector):
    """``informers()`` names each informer (the label) and gives it, at every scrape."""

    def __init__(self, *, namespace: str, informers: Callable[[], Mapping[str, Informer]]) -> None:
        self._namespace = namespace
        self._informers = informers

    def collect(self) -> Iterator[Metric]:
        objects = GaugeMetricFamily(
            f"{self._namespace}_informer_objects",
            "Objects in an informer's cache.",
            labels=["informer"],
        )
        lists = CounterMetricFamily(
            f"{self._namespace}_informer_lists",
            "Full lists an informer made (its first included): after a 410 Gone or a failure.",
            labels=["informer"],
        )
        for name, informer in sorted(self._informers().items()):
            objects.add_metric([name], len(informer.cache))
            lists.add_metric([name], informer.relists)
        yield objects
        yield lists
