"""Reservations against starvation in a queued replay: which GPU a request that waited too long
reserves, and when, by the controller's rules (``controller.allocation.arbiter``).

A request past the bound that fits nowhere is *starving*. Whenever slices free (and at the moment
it starts starving) each starving request, in serving order, may reserve a GPU:

- candidates are the GPUs with running requests that nobody holds, cheapest to empty first: the
  fewest running requests, then the oldest (whose latest start is earliest), then the fleet's
  order. A replay knows when each request will leave; a controller does not, so the choice uses
  only what a controller knows;
- if one running request leaving one of the ``SINGLE_DEPARTURE_GPUS`` cheapest would let the
  request in, nothing is reserved: the serving order alone gives it that room first, and a
  reservation would only idle the GPU's other slices. Requests starve when every GPU needs several
  departures (small slices scattered under a large request);
- otherwise the first of the ``MAX_RESERVATION_TRIES`` cheapest that could hold the request once
  emptied is reserved for it.

``waitqueue`` says what a reservation blocks. A request that reserves nothing stays starving and
is looked at again when slices free.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence

from controller.allocation.arbiter import MAX_RESERVATION_TRIES, SINGLE_DEPARTURE_GPUS
from driver.placement import Engine
from driver.placement.tables import Signature, signature_of
from instaslice.planning.preemption import GpuKey, RunningByGpu, fits_without
from instaslice.planning.waitqueue import Waiting, WaitQueue

StarvingKey = tuple[int, str, int]
"""(priority, profile, count): starving requests that get the same answer."""


class Reservations:
    """The starving requests of one replay, and the reservations made for them."""

    def __init__(
        self, engine: Engine, gpus: Sequence[GpuKey], running: RunningByGpu, queue: WaitQueue
    ) -> None:
        self.engine, self.gpus, self.running, self.queue = engine, gpus, running, queue
        self.made = 0
        """Reservations made, in all."""
        self._starving: dict[StarvingKey, deque[Waiting]] = {}
        """Per group, in the order they started starving (which is the serving order)."""
        self._signatures: dict[tuple[str, int], Signature] = {}

    def __bool__(self) -> bool:
        return bool(self._starving)

    def starve(self, waiting: Waiting) -> None:
        """``waiting`` has waited past the bound and fits nowhere."""
        request = waiting.request
        key = (request.priority, request.profile, request.count)
        self._starving.setdefault(key, deque()).append(waiting)
        self.settle()

    def settle(self) -> None:
        """Reservations for the starving requests, in serving order, while they get one; a group
        whose first request gets none waits (the others would get none either)."""
        starving, queue = self._starving, self.queue
        heads = [(group[0].order, key) for key, group in starving.items()]
        heapq.heapify(heads)
        ranked = self._ranked()
        while heads:
            _, key = heapq.heappop(heads)
            group = starving[key]
            waiting = group[0]
            if queue.get(waiting.index) is waiting and waiting.reserved is None:
                gpu = self._choose(waiting, ranked)
                if gpu is None:
                    continue
                queue.reserve(waiting, gpu)
                self.made += 1
                ranked.remove(gpu)
            group.popleft()  # reserved, or placed meanwhile
            if group:
                heapq.heappush(heads, (group[0].order, key))
            else:
                del starving[key]

    def _ranked(self) -> list[GpuKey]:
        """The GPUs with running requests that nobody holds, cheapest to empty first."""
        reserved, running = self.queue.reserved, self.running
        ranked = []
        for order, gpu in enumerate(self.gpus):
            rank = running.rank(gpu)
            if rank is not None and gpu not in reserved:
                ranked.append((rank, order, gpu))
        ranked.sort()
        return [gpu for _, _, gpu in ranked]

    def _choose(self, waiting: Waiting, ranked: Sequence[GpuKey]) -> GpuKey | None:
        """The GPU to reserve for ``waiting`` among ``ranked``, or None (see the module
        docstring)."""
        request = waiting.request
        key = (request.profile, request.count)
        signature = self._signatures.get(key)
        if signature is None:
            signature = self._signatures[key] = signature_of([key])
        inventory, running = self.engine.inventory, self.running
        for gpu in ranked[:SINGLE_DEPARTURE_GPUS]:
            state = inventory.gpu(*gpu)
            if any(fits_without(state, [h], signature) for h in running.on(gpu)):
                return None
        for gpu in ranked[:MAX_RESERVATION_TRIES]:
            if fits_without(inventory.gpu(*gpu), list(running.on(gpu)), signature):
                return gpu
        return None
