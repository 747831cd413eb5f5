"""The two pieces every emulated controller is built from: shared informers and a keyed work loop.

As in kube-controller-manager, controllers in one process share one informer per kind (one list,
one watch), register handlers that only enqueue keys, and reconcile each key on worker threads
from the cache; a failed key is retried with the work queue's per-key backoff.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

from driver.cluster.cache import IndexFunc
from driver.cluster.informer import Informer, ListWatch
from driver.cluster.port import ClusterApi, Resource
from driver.cluster.workqueue import RateLimit, WorkQueue

log = logging.getLogger(__name__)

SYNC_TIMEOUT_S = 10.0


class InformerFactory:
    """One informer per (resource, field selector); started with the factory or at once if the
    factory already runs."""

    def __init__(self, api: ClusterApi, *, name: str) -> None:
        self._api = api
        self._name = name
        self._lock = threading.Lock()
        self._informers: dict[tuple[Resource, str], Informer] = {}
        self._started = False

    def informer(self, resource: Resource, *, field_selector: str | None = None) -> Informer:
        key = (resource, field_selector or "")
        with self._lock:
            informer = self._informers.get(key)
            if informer is None:
                source = ListWatch(self._api, resource, field_selector=field_selector)
                suffix = f"[{field_selector}]" if field_selector else ""
                informer = Informer(
                    source=source,
                    name=f"{self._name}-{resource.plural}{suffix}",
                    watch_timeout_seconds=600,
                )
                self._informers[key] = informer
                if self._started:
                    informer.start()
            return informer

    def start(self) -> None:
        with self._lock:
            self._started = True
            informers = list(self._informers.values())
        for informer in informers:
            informer.start()

    def wait_for_sync(self, timeout: float = SYNC_TIMEOUT_S) -> bool:
        with self._lock:
            informers = list(self._informers.values())
        return all(i.wait_for_sync(timeout=timeout) for i in informers)

    def stop(self) -> None:
        with self._lock:
            informers = list(self._informers.values())
            self._started = False
        for informer in informers:
            informer.stop()


class KeyedLoop:
    """Worker threads reconciling string keys; ``sync`` raising means "retry with backoff"."""

    def __init__(
        self,
        *,
        name: str,
        sync: Callable[[str], None],
        workers: int = 1,
        rate_limit: RateLimit | None = None,
    ) -> None:
        self.name = name
        self._sync = sync
        self._workers = workers
        self.queue: WorkQueue[str] = WorkQueue(
            name=name, rate_limit=rate_limit or RateLimit(base_delay=0.05, max_delay=5.0, qps=0)
        )
        self._threads: list[threading.Thread] = []

    def add(self, key: str) -> None:
        self.queue.add(key)

    def add_after(self, key: str, delay: float) -> None:
        self.queue.add_after(key, delay)

    def start(self) -> None:
        for i in range(self._workers):
            thread = threading.Thread(target=self._run, name=f"{self.name}-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self.queue.shutdown()
        for thread in self._threads:
            thread.join(timeout=10.0)
            if thread.is_alive():
                log.warning("%s: worker %s did not stop", self.name, thread.name)
        self._threads.clear()

    def _run(self) -> None:
        while (key := self.queue.get()) is not None:
            try:
                self._sync(key)
            except Exception as exc:
                if self.queue.shutting_down:
                    log.debug("%s: %s failed while stopping: %s", self.name, key, exc)
                else:
                    log.info("%s: %s failed (retrying): %s", self.name, key, exc)
                    log.debug("%s: %s failure", self.name, key, exc_info=True)
                    self.queue.add_rate_limited(key)
            else:
                self.queue.forget(key)
            finally:
                self.queue.done(key)


def ensure_index(informer: Informer, name: str, func: IndexFunc) -> None:
    """Add an index to a shared informer unless another controller already added it."""
    with contextlib.suppress(ValueError):
        informer.add_index(name, func)
