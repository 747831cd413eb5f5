"""Slices held for one waiting pod, so that nothing behind it in the serving order takes them.

A hold is a set of engine occupants that belong to no claim. It blocks every pod it does not
exempt; the engine sees it as taken, so no policy or search needs to know about holds. Before a
pod is placed, the holds that do not block *that* pod are lifted for the length of its decision
(:meth:`Holds.lifted_for`) and put back after, all under the state lock.

Three kinds:

- ``next`` — the exact devices a waiting pod ahead in the order (``priority``) was found to fit
  when a pod behind it wanted the same capacity: the pod ahead is woken and places itself there. A
  pod ahead of the holder in the order ignores it. Short-lived (``NEXT_HOLD_SECONDS``).
- ``reservation`` — whole GPUs picked for a pod that has waited past the starvation bound and fits
  nowhere: they empty by attrition, since no pod of equal or lower priority is placed there.
- ``preemption`` — the GPUs whose lower-priority occupants were evicted for a pod: held for it
  until the victims are gone and it is placed, or until the hold expires (a victim stuck
  terminating); then the pod looks again.

Reservations and preemption holds never block a pod of higher priority than their holder. They
are written on the holder as an annotation (``persisted``), so a new leader restores them.
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

from controller.allocation.priority import PodOrder
from driver.cluster.port import format_time, parse_time
from driver.errors import NotFoundError
from driver.placement import Engine, Placed

logger = logging.getLogger(__name__)

NEXT_HOLD_SECONDS = 10.0
"""How long a ``next`` hold waits for its pod's own decision (a worker normally takes it within
milliseconds: it was put first in the work queue)."""


class HoldKind(enum.StrEnum):
    NEXT = "next"
    RESERVATION = "reservation"
    PREEMPTION = "preemption"


@dataclass(frozen=True, slots=True)
class HeldSlot:
    node: str
    gpu_index: int
    start: int
    size: int
    media: bool
    profile: str | None


@dataclass(slots=True)
class Hold:
    pod_key: str
    pod_uid: str
    order: PodOrder
    kind: HoldKind
    slots: tuple[HeldSlot, ...]
    since: datetime
    """Wall-clock start (what the annotation and ``instaslice status`` show)."""
    expires: datetime | None = None
    victims: tuple[str, ...] = ()
    """``namespace/name`` of the pods evicted for a preemption hold."""
    applied: bool = field(default=False, compare=False)

    @property
    def node(self) -> str:
        return self.slots[0].node if self.slots else ""

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted({s.gpu_index for s in self.slots}))

    def blocks(self, order: PodOrder) -> bool:
        """Whether the pod of ``order`` must keep off the held slices."""
        if order.uid == self.order.uid:
            return False
        if self.kind is HoldKind.NEXT:
            return not order.ahead_of(self.order)
        return order.priority <= self.order.priority

    def describe(self) -> str:
        gpus = ", ".join(str(g) for g in self.gpus)
        noun = "GPU" if len(self.gpus) == 1 else "GPUs"
        return f"{noun} {gpus} of node {self.node}"

    def persisted(self) -> str:
        """The annotation value: what a new leader needs to restore the hold."""
        body: dict[str, object] = {
            "kind": str(self.kind),
            "node": self.node,
            "gpus": list(self.gpus),
            "since": format_time(self.since),
        }
        if self.expires is not None:
            body["expires"] = format_time(self.expires)
        if self.victims:
            body["victims"] = list(self.victims)
        return json.dumps(body, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True, slots=True)
class PersistedHold:
    kind: HoldKind
    node: str
    gpus: tuple[int, ...]
    since: datetime
    expires: datetime | None
    victims: tuple[str, ...]


def parse_persisted(text: str) -> PersistedHold | None:
    """The annotation written by :meth:`Hold.persisted`; ``None`` when it is not one (a person
    may have edited it): a bad annotation restores nothing and hurts nothing else."""
    try:
        body = json.loads(text)
        kind = HoldKind(body["kind"])
        node = body["node"]
        gpus = tuple(int(g) for g in body["gpus"])
        since = parse_time(body["since"])
        expires = parse_time(body["expires"]) if body.get("expires") else None
        victims = tuple(str(v) for v in body.get("victims", ()))
    except (ValueError, KeyError, TypeError):
        return None
    if kind is HoldKind.NEXT or not isinstance(node, str) or not node or not gpus:
        return None
    return PersistedHold(
        kind=kind, node=node, gpus=gpus, since=since, expires=expires, victims=victims
    )


def whole_gpus(engine: Engine, node: str, gpus: tuple[int, ...]) -> tuple[HeldSlot, ...]:
    """One slot covering each GPU (every memory slice and the media engine)."""
    slots = []
    for index in gpus:
        try:
            size = engine.inventory.gpu(node, index).table.slices
        except NotFoundError:  # a GPU no longer published holds nothing
            logger.debug("GPU %s of node %s is not in the inventory; not held", index, node)
            continue
        slots.append(
            HeldSlot(node=node, gpu_index=index, start=0, size=size, media=True, profile=None)
        )
    return tuple(slots)


def placed_slots(placed: Placed) -> tuple[HeldSlot, ...]:
    return tuple(
        HeldSlot(
            node=a.node,
            gpu_index=a.gpu_index,
            start=a.start,
            size=a.size,
            media=a.media,
            profile=a.profile,
        )
        for a in placed.assignments
    )


class Holds:
    """Every hold, applied to one engine. Not thread-safe: used under the state lock."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._holds: dict[tuple[str, HoldKind], Hold] = {}

    # -- the engine ----------------------------------------------------------------------------

    def rebind(self, engine: Engine) -> None:
        """The state was rebuilt on a new engine: keep reservations and preemption holds on it,
        drop ``next`` holds (their pods are woken again by the rebuild)."""
        self._engine = engine
        for key, hold in list(self._holds.items()):
            hold.applied = False
            if hold.kind is HoldKind.NEXT:
                del self._holds[key]
            else:
                self._apply(hold)

    def _apply(self, hold: Hold) -> None:
        if hold.applied:
            return
        for s in hold.slots:
            self._engine.occupy(
                s.node, s.gpu_index, start=s.start, size=s.size, media=s.media, profile=s.profile
            )
        hold.applied = True

    def _lift(self, hold: Hold) -> None:
        if not hold.applied:
            return
        for s in hold.slots:
            self._engine.release(
                s.node, s.gpu_index, start=s.start, size=s.size, media=s.media, profile=s.profile
            )
        hold.applied = False

    @contextmanager
    def lifted_for(self, order: PodOrder) -> Iterator[None]:
        """The holds that do not block the pod of ``order`` lifted while it is placed."""
        lifted = [h for h in self._holds.values() if h.applied and not h.blocks(order)]
        for hold in lifted:
            self._lift(hold)
        try:
            yield
        finally:
            for hold in lifted:
                if self._holds.get((hold.pod_uid, hold.kind)) is hold:
                    self._apply(hold)

    # -- the registry --------------------------------------------------------------------------

    def add(self, hold: Hold) -> None:
        """Hold the slots for the pod (replacing its hold of the same kind)."""
        self.drop(hold.pod_uid, hold.kind)
        self._holds[(hold.pod_uid, hold.kind)] = hold
        self._apply(hold)

    def drop(self, pod_uid: str, kind: HoldKind | None = None) -> list[Hold]:
        """Release the pod's holds (of ``kind``, or all of them)."""
        kinds = list(HoldKind) if kind is None else [kind]
        dropped = []
        for k in kinds:
            hold = self._holds.pop((pod_uid, k), None)
            if hold is not None:
                self._lift(hold)
                dropped.append(hold)
        return dropped

    def get(self, pod_uid: str, kind: HoldKind) -> Hold | None:
        return self._holds.get((pod_uid, kind))

    def of(self, pod_uid: str) -> list[Hold]:
        return [h for (uid, _), h in self._holds.items() if uid == pod_uid]

    def expire(self, now: datetime) -> list[Hold]:
        """Drop the holds whose time is up; they are returned so their pods can be told."""
        due = [h for h in self._holds.values() if h.expires is not None and h.expires <= now]
        for hold in due:
            self.drop(hold.pod_uid, hold.kind)
        return due

    def all(self) -> list[Hold]:
        return list(self._holds.values())

    def count(self, kind: HoldKind) -> int:
        return sum(1 for h in self._holds.values() if h.kind is kind)
