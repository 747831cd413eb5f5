"""The allocator's shared, lock-guarded state: inventory, occupancy and the placement engine.

Informer handlers feed it (slices, claims), worker threads decide on it. Every decision —
refresh the inventory, evaluate candidates, run the engine, reserve the result — happens under one
lock and takes microseconds to milliseconds; the API writes that follow happen outside it, so the
writes of different pods go out concurrently.

It also tracks how far the claim informer has read the API's history (the resourceVersion of the
last claim event), so a worker can wait until the informer has seen its own write — and with it
every allocation committed before — before checking that write for overlaps.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from _thread import LockType
from collections import Counter
from collections.abc import Callable, Iterable

from controller.allocation.candidates import CandidateCache
from controller.allocation.conditions import PlacementProblem
from controller.allocation.holds import HoldKind, Holds
from controller.allocation.inventory import SliceInventory
from controller.allocation.nodefilter import NodeFilter
from controller.allocation.occupancy import ClaimOccupancy, parse_rv
from controller.allocation.priority import PodOrder, order_of
from controller.allocation.waiting import WaitingPods
from controller.allocation.waitreport import WaitingPod, waiting_pod
from driver.cluster.port import JsonObject
from driver.cluster.views import ClaimView, PodView
from driver.placement import Engine
from driver.placement.state import StateKey

logger = logging.getLogger(__name__)


class SliceState:
    """The published slices behind one lock. Alone it is what the webhook process keeps — which
    profiles are on offer and how many fit one GPU: no placement engine, no selector views
    (``SliceInventory(None, selectors=False)``), about a third of ``AllocationState``'s memory per
    node; ``AllocationState`` extends it, so ``CacheAdmissionContext`` reads either."""

    def __init__(self, inventory: SliceInventory | None = None) -> None:
        self.lock = threading.RLock()
        self.inventory = (
            inventory if inventory is not None else SliceInventory(None, selectors=False)
        )

    def slice_changed(self, slice_obj: JsonObject) -> None:
        with self.lock:
            self.inventory.slice_changed(slice_obj)

    def slice_deleted(self, slice_obj: JsonObject) -> None:
        with self.lock:
            self.inventory.slice_deleted(slice_obj)

    def refresh(self) -> set[str]:
        """Apply pending slice changes (call with ``lock`` held); nodes whose devices changed."""
        return self.inventory.refresh()


class AllocationState(SliceState):
    """The allocator's: the slice inventory with its placement engine and selector views, the
    claims' occupancy, the node filter and the candidates cache; and who is served next — the
    pods waiting for capacity in serving order and the slices held for some of them."""

    def __init__(self, *, policy: str) -> None:
        self.engine = Engine(policy=policy)
        super().__init__(SliceInventory(self.engine))
        self.occupancy = ClaimOccupancy(engine=self.engine, inventory=self.inventory)
        self.candidates = CandidateCache(self.inventory)
        self.nodes = NodeFilter()
        self.holds = Holds(self.engine)
        self.waiting = WaitingPods()
        self._seen_pods: dict[str, float] = {}
        """Pod UID → when first ordered here (``PodOrder.seen``); dropped when it is placed or
        goes away."""
        self._seen = threading.Lock()
        self._claims_rv = 0
        self._waiters: list[tuple[int, int, LockType]] = []
        """Heap of (resourceVersion awaited, tie-breaker, held lock) of ``wait_claims_seen``
        callers: a claim event wakes only the workers whose write it covers, not every waiting
        one, by releasing their lock (a bare lock: an ``Event`` is a condition variable in Python,
        a few dozen calls per wait and set)."""
        self._tickets = itertools.count()
        self.generation = 0
        """Bumped by every ``rebuild``: a worker's check spans no rebuild."""

    # -- informer side (slices: ``SliceState``) --------------------------------------------------

    def claim_changed(self, claim: JsonObject) -> bool:
        """True if slices were freed."""
        with self.lock:
            freed = self.occupancy.observe(claim)
            if freed:  # with the release, so no decision sees the room at the old epoch
                self.waiting.capacity_changed()
        self._advance(parse_rv(ClaimView.of(claim)))
        return freed

    def claim_deleted(self, claim: JsonObject) -> bool:
        with self.lock:
            freed = self.occupancy.forget(claim)
            if freed:
                self.waiting.capacity_changed()
        self._advance(parse_rv(ClaimView.of(claim)))
        return freed

    def _advance(self, rv: int) -> None:
        with self._seen:
            if rv <= self._claims_rv:
                return
            self._claims_rv = rv
            waiters = self._waiters
            while waiters and waiters[0][0] <= rv:
                heapq.heappop(waiters)[2].release()

    def wait_claims_seen(self, rv: int, *, timeout: float) -> bool:
        """Block until the claim informer has delivered an event at or after ``rv``."""
        with self._seen:
            if self._claims_rv >= rv:
                return True
            wake = threading.Lock()
            wake.acquire()
            entry = (rv, next(self._tickets), wake)
            heapq.heappush(self._waiters, entry)
        if wake.acquire(timeout=max(0.0, timeout)):
            return True
        with self._seen:
            if entry in self._waiters:  # timed out: nobody will release it
                self._waiters.remove(entry)
                heapq.heapify(self._waiters)
            return self._claims_rv >= rv

    # -- worker side ---------------------------------------------------------------------------

    def refresh(self) -> set[str]:
        """Apply pending slice changes (call with ``lock`` held); nodes whose devices changed."""
        changed = super().refresh()
        for node in changed:
            self.occupancy.node_refreshed(node)
        return changed

    def rebuild(
        self,
        *,
        slices: Callable[[], Iterable[JsonObject]],
        claims: Callable[[], Iterable[JsonObject]],
    ) -> None:
        """Start over from the informers' copies of the API: what a new leader does first.

        ``slices`` and ``claims`` are read with the lock held, so an event the informer delivers
        meanwhile is either in what they return or applied to the new state after the swap.
        """
        with self.lock:
            engine = Engine(policy=self.engine.policy)
            inventory = SliceInventory(engine)
            for slice_obj in slices():
                inventory.slice_changed(slice_obj)
            occupancy = ClaimOccupancy(engine=engine, inventory=inventory)
            inventory.refresh()
            highest = 0
            for claim in claims():
                occupancy.observe(claim)
                highest = max(highest, parse_rv(ClaimView.of(claim)))
            self.engine, self.inventory, self.occupancy = engine, inventory, occupancy
            self.candidates = CandidateCache(inventory)
            self.holds.rebind(engine)
            self.waiting.clear()
            self.generation += 1
        self._advance(highest)
        logger.info(
            "occupancy rebuilt: %d node(s), %d allocated claim(s) of ours",
            len(inventory.nodes()),
            len(occupancy),
        )

    def warm(self, device_classes: Iterable[JsonObject]) -> None:
        """Evaluate each class's selectors over the inventory now (cached until it changes), so
        the first pods of a burst do not wait for it: at 100 nodes of 8 GPUs it takes the better
        part of a second, under the lock every worker needs."""
        with self.lock:
            self.refresh()
            for device_class in device_classes:
                try:
                    self.candidates.candidates(device_class, ())
                except PlacementProblem as problem:  # reported when a pod asks for the class
                    logger.debug("DeviceClass not usable yet: %s", problem)

    def capacity_changed(self) -> None:
        """Something may have freed room (a claim released, a slice published, a node or its
        pods changed): the waiting pods are worth trying again."""
        with self.lock:
            self.waiting.capacity_changed()

    def order_of(self, pod: PodView) -> PodOrder:
        """The pod's place in the serving order (``priority``), the same on every call."""
        seen = self._seen_pods.setdefault(pod.uid, time.monotonic())  # atomic in CPython
        return order_of(pod, seen=seen)

    def forget_pod(self, *, key: str, uid: str) -> bool:
        """A pod was placed or went away: it waits no more and its holds are released (True if
        it had any)."""
        self._seen_pods.pop(uid, None)
        with self.lock:
            self.waiting.remove(key)
            released = bool(self.holds.drop(uid))
            if released:
                self.waiting.capacity_changed()
            return released

    def hold_counts(self) -> dict[str, int]:
        """Active holds by kind (metric)."""
        with self.lock:
            return {str(kind): self.holds.count(kind) for kind in HoldKind}

    def wait_inputs(self) -> tuple[dict[str, WaitingPod], Counter[StateKey]]:
        """What ``waitreport`` needs of this state, copied under the lock: the pods waiting for
        capacity by key, and how many GPUs are in each distinct state."""
        with self.lock:
            self.refresh()
            waiting = {
                w.key: waiting_pod(w, (h.kind for h in self.holds.of(w.order.uid)))
                for w in self.waiting.waiters()
            }
            states = Counter(gpu.key for node in self.engine.inventory.nodes() for gpu in node.gpus)
        return waiting, states

    def free_per_profile(self) -> dict[str, int]:
        with self.lock:
            self.refresh()
            return {p: self.engine.free_instances(p) for p in self.inventory.profile_names()}
