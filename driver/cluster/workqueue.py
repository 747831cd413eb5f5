"""A de-duplicating, rate-limited work queue with client-go's semantics.

Informer handlers only enqueue keys; workers take a key, reconcile it from the cache, and call
``done``. The rules that make this safe with many workers:

- a key waiting in the queue is held once, however often it is added (de-duplication);
- a key being processed is never handed to a second worker; if it is added meanwhile it is
  processed again after ``done`` (no lost update, no concurrent reconcile of one object);
- ``add_rate_limited`` re-adds a failed key after a per-key exponential backoff (and at most
  ``qps`` overall), ``forget`` resets the key's backoff after a success.

Delayed adds are kept in a heap that ``get`` itself services, so the queue needs no thread of its own.

With an ``order`` the ready keys are handed out smallest order first instead of first in, first out
(kube-scheduler's active queue is a heap too): the allocator serves waiting pods by priority, then
age. A key's order is computed when it is added, outside the queue's lock (it may read an
informer's cache, whose handlers add keys under their own lock).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from driver.cluster.clock import Clock, SystemClock
from driver.cluster.throttle import TokenBucket

T = TypeVar("T", bound=Hashable)


@dataclass(frozen=True, slots=True)
class RateLimit:
    """client-go's default controller rate limiter: the larger of a per-key exponential backoff
    (``base_delay * 2**failures``, capped) and an overall token bucket."""

    base_delay: float = 0.005
    max_delay: float = 1000.0
    qps: float = 10.0
    burst: int = 100


class _Ready(Generic[T]):
    """The keys ready to be handed out: first in, first out, or by ``order`` when one is given."""

    __slots__ = ("_fifo", "_heap", "_orders", "_sequence")

    def __init__(self, *, ordered: bool) -> None:
        self._fifo: deque[T] | None = None if ordered else deque()
        self._heap: list[tuple[Any, int, T]] = []
        self._orders: dict[T, Any] = {}
        """The order of every key added with one (kept until the key is handed out)."""
        self._sequence = itertools.count()

    def set_order(self, item: T, order: Any) -> None:
        self._orders[item] = order

    def append(self, item: T) -> None:
        if self._fifo is not None:
            self._fifo.append(item)
            return
        heapq.heappush(self._heap, (self._orders.get(item), next(self._sequence), item))

    def popleft(self) -> T:
        if self._fifo is not None:
            return self._fifo.popleft()
        return heapq.heappop(self._heap)[2]

    def forget(self, item: T) -> None:
        self._orders.pop(item, None)

    def clear(self) -> None:
        if self._fifo is not None:
            self._fifo.clear()
        self._heap.clear()
        self._orders.clear()

    def __len__(self) -> int:
        return len(self._fifo) if self._fifo is not None else len(self._heap)


class WorkQueue(Generic[T]):
    def __init__(
        self,
        *,
        name: str = "",
        rate_limit: RateLimit | None = None,
        clock: Clock | None = None,
        order: Callable[[T], Any] | None = None,
    ) -> None:
        self.name = name
        self._rate_limit = rate_limit or RateLimit()
        self._clock = clock or SystemClock()
        self._bucket = TokenBucket(
            qps=self._rate_limit.qps, burst=self._rate_limit.burst, clock=self._clock
        )
        self._cond = threading.Condition()
        self._order = order
        """The sort key of a key (smallest first); every key's must compare with every other's."""
        self._queue: _Ready[T] = _Ready(ordered=order is not None)
        self._dirty: set[T] = set()
        self._processing: set[T] = set()
        self._failures: dict[T, int] = {}
        self._waiting: list[tuple[float, int, T]] = []
        self._waiting_due: dict[T, float] = {}
        self._sequence = itertools.count()
        self._shutting_down = False

    def add(self, item: T) -> None:
        order = self._order(item) if self._order is not None else None
        with self._cond:
            if self._order is not None:
                self._queue.set_order(item, order)
            self._add_locked(item)

    def add_after(self, item: T, delay: float) -> None:
        """Add ``item`` once ``delay`` seconds have passed (an earlier pending add wins)."""
        if delay <= 0:
            self.add(item)
            return
        order = self._order(item) if self._order is not None else None
        with self._cond:
            if self._shutting_down:
                return
            if self._order is not None:
                self._queue.set_order(item, order)
            due = self._clock.monotonic() + delay
            if item in self._waiting_due and self._waiting_due[item] <= due:
                return
            self._waiting_due[item] = due
            heapq.heappush(self._waiting, (due, next(self._sequence), item))
            self._cond.notify()

    def add_rate_limited(self, item: T) -> None:
        """Re-add a key whose processing failed, after its backoff."""
        with self._cond:
            failures = self._failures.get(item, 0)
            self._failures[item] = failures + 1
        backoff = min(self._rate_limit.max_delay, self._rate_limit.base_delay * 2.0**failures)
        self.add_after(item, max(backoff, self._bucket.reserve()))

    def forget(self, item: T) -> None:
        """The key was processed successfully: its next failure starts from the base delay."""
        with self._cond:
            self._failures.pop(item, None)

    def num_requeues(self, item: T) -> int:
        with self._cond:
            return self._failures.get(item, 0)

    def get(self, *, timeout: float | None = None) -> T | None:
        """Block for the next key; ``None`` once shut down (or after ``timeout`` seconds).

        The caller owns the key until it calls ``done(key)``.
        """
        deadline = None if timeout is None else self._clock.monotonic() + timeout
        with self._cond:
            while True:
                now = self._clock.monotonic()
                self._promote_due_locked(now)
                if self._queue:
                    item = self._queue.popleft()
                    self._dirty.discard(item)
                    self._processing.add(item)
                    return item
                if self._shutting_down:
                    return None
                waits = [t - now for t in (deadline, self._next_due_locked()) if t is not None]
                if deadline is not None and deadline <= now:
                    return None
                self._cond.wait(timeout=max(0.0, min(waits)) if waits else None)

    def done(self, item: T) -> None:
        with self._cond:
            self._processing.discard(item)
            if item in self._dirty and not self._shutting_down:
                self._queue.append(item)
                self._cond.notify()
            elif item not in self._waiting_due:
                self._queue.forget(item)

    def shutdown(self) -> None:
        """Wake every waiting ``get`` with ``None``; later adds are ignored."""
        with self._cond:
            self._shutting_down = True
            self._queue.clear()
            self._dirty.clear()
            self._waiting.clear()
            self._waiting_due.clear()
            self._cond.notify_all()

    @property
    def shutting_down(self) -> bool:
        with self._cond:
            return self._shutting_down

    def __len__(self) -> int:
        """Keys ready to be handed out (not the delayed ones, not those being processed)."""
        with self._cond:
            return len(self._queue)

    def processing(self) -> int:
        """Keys handed out by ``get`` and not yet ``done``."""
        with self._cond:
            return len(self._processing)

    def pending_delayed(self) -> int:
        with self._cond:
            return len(self._waiting_due)

    def _add_locked(self, item: T) -> None:
        if self._shutting_down or item in self._dirty:
            return
        self._dirty.add(item)
        if item in self._processing:
            return
        self._queue.append(item)
        self._cond.notify()

    def _promote_due_locked(self, now: float) -> None:
        while self._waiting and self._waiting[0][0] <= now:
            due, _, item = heapq.heappop(self._waiting)
            if self._waiting_due.get(item) != due:
                continue  # superseded by an earlier add_after of the same key
            del self._waiting_due[item]
            self._add_locked(item)

    def _next_due_locked(self) -> float | None:
        return self._waiting[0][0] if self._waiting else None
