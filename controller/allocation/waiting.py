"""The pods waiting for capacity, in serving order, and what each last failed to fit.

A pod that found no room is registered here with what its next try needs (its view and its
claims). When another pod is about to take capacity, the waiting pods *ahead* of it in the order
(``priority``) are tried first, each at most once per ``epoch``: the epoch moves whenever capacity
may have been freed (a claim released, a hold dropped, a slice published, a node changed), and
between two moves the free capacity only shrinks, so a pod that did not fit at an epoch fits at
none of its later decisions within it. A release of slices moves the epoch under the same lock
hold as the release itself: a decision that sees the room also sees the new epoch. Not
thread-safe: used under the state lock.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass

from controller.allocation.podclaims import PodClaims
from controller.allocation.priority import PodOrder
from driver.cluster.views import PodView


@dataclass(slots=True)
class Waiter:
    key: str
    order: PodOrder
    pod: PodView
    claims: PodClaims
    since: float
    """Monotonic time of its first failure to fit (the starvation bound counts from here)."""
    failed_epoch: int
    profiles: frozenset[str] = frozenset()
    """The profiles its claims may take (what the wait metrics label it with)."""


class WaitingPods:
    def __init__(self) -> None:
        self._by_key: dict[str, Waiter] = {}
        self._sorted: list[tuple[PodOrder, str]] = []
        self.epoch = 0

    def capacity_changed(self) -> None:
        self.epoch += 1

    def failed(
        self,
        pod: PodView,
        claims: PodClaims,
        *,
        order: PodOrder,
        now: float,
        profiles: frozenset[str] = frozenset(),
    ) -> Waiter:
        """The pod found no room at the current epoch."""
        key = pod.key
        waiter = self._by_key.get(key)
        if waiter is not None and waiter.order != order:  # re-created under the same name
            self.remove(key)
            waiter = None
        if waiter is None:
            waiter = Waiter(
                key=key,
                order=order,
                pod=pod,
                claims=claims,
                since=now,
                failed_epoch=self.epoch,
                profiles=profiles,
            )
            self._by_key[key] = waiter
            bisect.insort(self._sorted, (order, key))
        else:
            waiter.pod, waiter.claims, waiter.failed_epoch = pod, claims, self.epoch
            waiter.profiles = profiles or waiter.profiles
        return waiter

    def remove(self, key: str) -> Waiter | None:
        waiter = self._by_key.pop(key, None)
        if waiter is not None:
            at = bisect.bisect_left(self._sorted, (waiter.order, key))
            if at < len(self._sorted) and self._sorted[at] == (waiter.order, key):
                del self._sorted[at]
        return waiter

    def ahead_of(self, order: PodOrder) -> Iterator[Waiter]:
        """Waiting pods served before ``order`` that may fit now (not yet tried at this epoch),
        first in the order first. Safe to ``remove`` while iterating."""
        end = bisect.bisect_left(self._sorted, (order, ""))
        for _, key in list(self._sorted[:end]):
            waiter = self._by_key.get(key)
            if waiter is not None and waiter.failed_epoch < self.epoch:
                yield waiter

    def waiters(self) -> list[Waiter]:
        return list(self._by_key.values())

    def clear(self) -> None:
        self._by_key.clear()
        self._sorted.clear()
