"""Who gets capacity: the pods ahead first, reservations against starvation, preemption.

Called by ``sync`` with the state lock held, around the engine's answer for one pod:

- :meth:`Arbiter.serve_ahead` — the pod fits; but a waiting pod ahead of it in the order
  (``priority``) that fits now gets the capacity first: a ``next`` hold is placed for it and it is
  woken, and the pod is placed again on what is left (or waits);
- :meth:`Arbiter.reserve` — the pod fits nowhere, has waited past ``SyncConfig.starvation_after``,
  no single departure would let it in (then the order alone serves it) and only the occupants of
  some GPU stand in its way: the GPU cheapest to empty by attrition is reserved for it (fewest occupants, then the one whose youngest occupant is oldest — the
  controller knows no pod's lifetime, and under lifetimes of similar length the pods that have
  run longest end first);
- :meth:`Arbiter.preempt` — the pod fits nowhere and may preempt: the victims (``preemption``) and a
  ``preemption`` hold on the GPUs it will use once they are gone.

Holds and what they block are ``holds``; the order is ``priority``; the waiting pods ``waiting``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from api.names import SHADOW_CLAIM_LABEL
from controller.allocation.disruption import Budgets
from controller.allocation.holds import (
    NEXT_HOLD_SECONDS,
    Hold,
    HoldKind,
    placed_slots,
    whole_gpus,
)
from controller.allocation.occupancy import ClaimRecord, Slot
from controller.allocation.outcome import SyncConfig
from controller.allocation.preemption import Plan, Search, Victim
from controller.allocation.priority import PodOrder, may_preempt
from controller.allocation.state import AllocationState
from controller.allocation.waiting import Waiter
from controller.informers import BY_UID, ClusterInformers
from driver.cluster.indexes import BY_CLAIM
from driver.cluster.views import ClaimView, PodView
from driver.errors import NotFoundError
from driver.placement import Placed

logger = logging.getLogger(__name__)

Found = TypeVar("Found")

MAX_SERVED_AHEAD = 16
"""``next`` holds one decision may place for pods ahead of it (each then decides on its own)."""
MAX_RESERVATION_TRIES = 64
"""GPUs tried, cheapest first, when choosing a reservation."""
SINGLE_DEPARTURE_GPUS = 8
"""GPUs (cheapest first) checked for room that one departure would make (no reservation then)."""


@dataclass(frozen=True, slots=True)
class Preemption:
    """A preemption decided under the lock: evict ``plan.victims``; ``hold`` keeps the room."""

    plan: Plan
    hold: Hold


@dataclass(frozen=True, slots=True)
class NoPreemption:
    """Why a pod that may preempt does not (said on its condition)."""

    reason: str


class Arbiter:
    def __init__(
        self,
        *,
        state: AllocationState,
        informers: ClusterInformers,
        config: SyncConfig,
        now: Callable[[], datetime],
    ) -> None:
        self._state = state
        self._informers = informers
        self._config = config
        self._now = now

    # -- engine helpers ------------------------------------------------------------------------

    @contextmanager
    def released(self, slots: Sequence[Slot]) -> Iterator[None]:
        """The slices of ``slots`` free in the engine for the length of a dry run."""
        engine = self._state.engine
        for s in slots:
            engine.release(
                s.node, s.gpu_index, start=s.start, size=s.size, media=s.media, profile=s.profile
            )
        try:
            yield
        finally:
            for s in slots:
                engine.occupy(
                    s.node,
                    s.gpu_index,
                    start=s.start,
                    size=s.size,
                    media=s.media,
                    profile=s.profile,
                )

    # -- order ---------------------------------------------------------------------------------

    def serve_ahead(
        self,
        order: PodOrder,
        placed: Found,
        *,
        place_self: Callable[[], Found | None],
        dry_run: Callable[[Waiter], Placed | None],
    ) -> tuple[Found | None, list[str]]:
        """``placed`` (the pod's own answer) unless waiting pods ahead of it take that room
        first: each that fits gets a ``next`` hold and its key is returned to be woken."""
        state = self._state
        woken: list[str] = []
        for waiter in state.waiting.ahead_of(order):
            if len(woken) >= MAX_SERVED_AHEAD:
                break
            uid = waiter.order.uid
            if state.holds.get(uid, HoldKind.NEXT) is not None:
                continue
            with state.holds.lifted_for(waiter.order):
                found = dry_run(waiter)
            if found is None:
                waiter.failed_epoch = state.waiting.epoch
                continue
            state.holds.add(
                Hold(
                    pod_key=waiter.key,
                    pod_uid=uid,
                    order=waiter.order,
                    kind=HoldKind.NEXT,
                    slots=placed_slots(found),
                    since=self._now(),
                    expires=self._now() + timedelta(seconds=NEXT_HOLD_SECONDS),
                )
            )
            woken.append(waiter.key)
            again = place_self()
            if again is None:
                return None, woken
            placed = again
        return placed, woken

    # -- starvation ----------------------------------------------------------------------------

    def reserve(
        self,
        pod: PodView,
        order: PodOrder,
        waiter: Waiter,
        *,
        node_ok: Callable[[str], bool],
        place_on: Callable[[str], Placed | None],
    ) -> Hold | None:
        """A reservation for a pod past the starvation bound, or None (not due, held already,
        or no single GPU's occupants stand alone in its way)."""
        bound = self._config.starvation_after
        state = self._state
        if bound is None or time.monotonic() - waiter.since < bound:
            return None
        if any(h.kind is not HoldKind.NEXT for h in state.holds.of(pod.uid)):
            return None
        held = {
            (s.node, s.gpu_index)
            for h in state.holds.all()
            if h.kind is not HoldKind.NEXT
            for s in h.slots
        }
        candidates: list[tuple[tuple[int, float], str, int, list[ClaimRecord]]] = []
        for (node, index), records in state.occupancy.on_gpus().items():
            if (node, index) in held or not node_ok(node):
                continue
            youngest = max(r.first_seen for r in records)
            candidates.append(((len(records), youngest), node, index, records))
        candidates.sort(key=lambda c: c[0])
        if self._one_departure_enough(order, candidates[:SINGLE_DEPARTURE_GPUS], place_on):
            return None
        for _, node, index, records in candidates[:MAX_RESERVATION_TRIES]:
            slots = [s for r in records for s in r.slots if s.gpu_index == index]
            with self.released(slots), state.holds.lifted_for(order):
                found = place_on(node)
            if found is None or index not in {a.gpu_index for a in found.assignments}:
                continue
            hold = Hold(
                pod_key=pod.key,
                pod_uid=pod.uid,
                order=order,
                kind=HoldKind.RESERVATION,
                slots=whole_gpus(state.engine, node, (index,)),
                since=self._now(),
            )
            state.holds.add(hold)
            logger.info(
                "pod %s waited %.0fs: %s reserved for it (%d occupant(s) to free)",
                pod.key,
                time.monotonic() - waiter.since,
                hold.describe(),
                len(records),
            )
            return hold
        return None

    def _one_departure_enough(
        self,
        order: PodOrder,
        candidates: Sequence[tuple[tuple[int, float], str, int, list[ClaimRecord]]],
        place_on: Callable[[str], Placed | None],
    ) -> bool:
        """Whether one occupant leaving some GPU would let the pod in: then the serving order
        alone gives it that room first, and a reservation would only idle the GPU's other
        slices. Pods starve when every GPU needs several departures (small slices scattered)."""
        state = self._state
        for _, node, index, records in candidates:
            for record in records:
                slots = [s for s in record.slots if s.gpu_index == index]
                with self.released(slots), state.holds.lifted_for(order):
                    if place_on(node) is not None:
                        return True
        return False

    def still_waiting_for(self, hold: Hold) -> int:
        """Claims still holding slices on the held GPUs (what the pod's condition reports)."""
        return sum(len(self._state.occupancy.on_gpu(hold.node, index)) for index in hold.gpus)

    # -- preemption ----------------------------------------------------------------------------

    def preempt(
        self,
        pod: PodView,
        order: PodOrder,
        *,
        node_ok: Callable[[str], bool],
        place_on: Callable[[str, Sequence[str]], Placed | None],
        min_slices: int = 1,
    ) -> Preemption | NoPreemption | None:
        """Victims and a hold for a pod that fits nowhere; None when preemption does not apply
        (off, ``preemptionPolicy: Never``, a preemption of its own under way, nobody of lower
        priority holds our slices where it could go). ``min_slices``: the fewest memory slices
        the pod can use on one GPU (prunes the search). ``node_ok``: whether the pod could go to
        a node at all once its lower-priority pods are gone; ``place_on(node, victim_uids)``: its
        placement there with those pods' usage not counted."""
        state = self._state
        if not self._config.preemption or not may_preempt(pod):
            return None
        if state.holds.get(pod.uid, HoldKind.PREEMPTION) is not None:
            return None
        candidates = self._candidates(pod, node_ok)
        if not candidates:
            return None

        def fits(node: str, victims: Sequence[Victim]) -> Placed | None:
            slots = [s for v in victims for s in v.slots]
            with self.released(slots), state.holds.lifted_for(order):
                return place_on(node, [v.pod.uid for v in victims])

        search = Search(
            fits=fits,
            free_slices=self._free_slices,
            min_slices=min_slices,
            stranded=self._stranded,
        )
        with state.holds.lifted_for(order):  # the free slices it may use, for the pruning
            plan = search.best(candidates)
        if plan is None:
            if search.refusing:
                return NoPreemption(
                    reason="preempting lower-priority pods would violate PodDisruptionBudget "
                    + ", ".join(search.refusing)
                )
            return None
        hold = self._hold_for(pod, order, plan)
        logger.info(
            "pod %s (priority %d) preempts %s on node %s (%d fit checks)",
            pod.key,
            pod.priority,
            ", ".join(f"{v.key} ({v.priority})" for v in plan.victims),
            plan.node,
            search.checks,
        )
        return Preemption(plan=plan, hold=hold)

    def _hold_for(self, pod: PodView, order: PodOrder, plan: Plan) -> Hold:
        """The GPUs the pod will use once the victims are gone, held for it until they are
        (their longest grace period plus the slack)."""
        grace = max(v.pod.termination_grace_seconds for v in plan.victims)
        now = self._now()
        hold = Hold(
            pod_key=pod.key,
            pod_uid=pod.uid,
            order=order,
            kind=HoldKind.PREEMPTION,
            slots=whole_gpus(self._state.engine, plan.node, plan.gpus),
            since=now,
            expires=now + timedelta(seconds=grace + self._config.preemption_slack),
            victims=tuple(v.key for v in plan.victims),
        )
        self._state.holds.add(hold)
        return hold

    def _stranded(self, victims: Sequence[Victim]) -> int:
        """Victims with a profile no GPU has a free placement of now (they cannot move)."""
        engine = self._state.engine
        return sum(
            1
            for v in victims
            if any(s.profile and engine.free_instances(s.profile) == 0 for s in v.slots)
        )

    def _free_slices(self, node: str, index: int) -> int:
        try:
            gpu = self._state.engine.inventory.gpu(node, index)
        except NotFoundError:
            return 0
        return gpu.table.slices - (gpu.mask & gpu.table.full_mask).bit_count()

    def _candidates(self, pod: PodView, node_ok: Callable[[str], bool]) -> dict[str, list[Victim]]:
        """Per node, the lower-priority pods whose eviction frees some of our slices there."""
        budgets = Budgets(self._informers.pdbs.list())
        slots_of: dict[str, list[Slot]] = {}
        pods: dict[str, PodView] = {}
        for (node, _), records in self._state.occupancy.on_gpus().items():
            if not node_ok(node):  # with every candidate gone (see ``sync._no_room``)
                continue
            for record in records:
                users = self._users(record)
                if len(users) != 1:
                    continue  # shared, or nobody we know: its eviction would free nothing sure
                (user,) = users
                if user.priority >= pod.priority or user.meta.deleting or user.terminal:
                    continue
                pods[user.uid] = user
                slots_of.setdefault(user.uid, []).extend(record.slots)
        by_node: dict[str, list[Victim]] = {}
        for uid, slots in slots_of.items():
            user = pods[uid]
            victim = Victim(pod=user, slots=tuple(slots), budgets=budgets.of(user))
            for node in sorted({s.node for s in slots}):
                by_node.setdefault(node, []).append(victim)
        return by_node

    def _users(self, record: ClaimRecord) -> list[PodView]:
        """The pods that use a claim: reserved, owning (shadow claims) or naming it."""
        namespace, _, name = record.key.partition("/")
        raw = self._informers.claims.get(name, namespace=namespace)
        if raw is None:
            return []
        claim = ClaimView.of(raw)
        uids = set(claim.reserved_pod_uids()) | set(claim.meta.owner_pod_uids())
        shadow_for = claim.meta.labels.get(SHADOW_CLAIM_LABEL)
        if shadow_for:
            uids.add(shadow_for)
        found: dict[str, PodView] = {}
        pods = self._informers.pods
        for uid in uids:
            for obj in pods.by_index(BY_UID, uid):
                view = PodView.of(obj)
                found[view.uid] = view
        for obj in pods.by_index(BY_CLAIM, record.key):
            view = PodView.of(obj)
            found[view.uid] = view
        return [found[uid] for uid in sorted(found)]
