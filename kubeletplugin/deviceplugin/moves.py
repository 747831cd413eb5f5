"""Which shadow claims must change hands so that each stands for the container using its slices (pure).

Input: this node's shadow claims, and for each claim whose device ids the kubelet lists, the
container holding them (``held``). Output: ``Swap``s to write.

1. A held claim standing for another container than its holder is moved to the holder — the slice
   is in that container; deleting the old pod must not free it.
2. The container that lost it (``X``) may now lack a reservation. If its need (the pod spec's
   request of that profile's resource) is no longer covered by the claims it stands for, a *spare*
   claim is moved to it — unbound, not held, from a container that now stands for more slices than
   it asks (first the holder that took X's claim: its own reservation was left unused). Without a
   spare (the holder had no reservation: a pod that bypassed the webhook), X keeps nothing and its
   own ``Allocate`` will fail with the no-reservation error; that is logged.

Needs, not a journal, decide step 2: after a crash between two writes, the next pass computes the
same remaining moves from the API server alone (a pod whose need is met is owed nothing).
Claims are namespaced and owner references cannot cross namespaces, so a claim held by a pod of
another namespace cannot be moved; it is reported (``cross_namespace``), and its slice is still
never destroyed while the kubelet lists its ids (``reconcile``'s release rule).
"""

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from driver.ids import ClaimUid
from kubeletplugin.deviceplugin.shadow import ShadowClaim, Slot

logger = logging.getLogger(__name__)

Need = Callable[[Slot, str], int | None]
"""Slices of ``profile`` the slot's container asks for; None when unknown (pod not readable)."""


@dataclass(frozen=True, slots=True)
class Move:
    claim: ShadowClaim
    to: Slot


@dataclass(frozen=True, slots=True)
class Swap:
    """A claim moved to its holder, preceded by the spare claim given back to the loser (if any).

    The spare is written first: if that write fails the holder move waits for the next pass, so
    the loser is never left without its reservation by a half-done swap.
    """

    holder: Move
    spare: Move | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    swaps: tuple[Swap, ...] = ()
    cross_namespace: tuple[tuple[ShadowClaim, Slot], ...] = ()
    unrepaid: tuple[Move, ...] = ()
    """Holder moves whose loser is left short (no spare anywhere)."""


def plan_moves(
    *,
    claims: Sequence[ShadowClaim],
    held: Mapping[ClaimUid, Slot],
    spare: Callable[[ShadowClaim], bool],
    need: Need,
) -> Plan:
    holder_moves, cross = _holder_moves(claims, held)
    if not holder_moves:
        return Plan(cross_namespace=tuple(cross))
    ledger = _Ledger(claims, holder_moves, need=need)
    swaps: list[Swap] = []
    unrepaid: list[Move] = []
    for move in holder_moves:
        loser = move.claim.slot
        profile = move.claim.profile
        wanted = None if loser is None else need(loser, profile)
        if loser is None or wanted is None or ledger.have(loser, profile) >= wanted:
            swaps.append(Swap(holder=move))
            continue
        deficit = wanted - ledger.have(loser, profile)
        given = ledger.spare_for(move, loser, deficit=deficit, held=held, spare=spare)
        if given is None:
            unrepaid.append(move)
        swaps.append(Swap(holder=move, spare=given))
    return Plan(swaps=tuple(swaps), cross_namespace=tuple(cross), unrepaid=tuple(unrepaid))


def _holder_moves(
    claims: Sequence[ShadowClaim], held: Mapping[ClaimUid, Slot]
) -> tuple[list[Move], list[tuple[ShadowClaim, Slot]]]:
    """Step 1: each held claim that stands for another container than its holder, moved to the
    holder; those held across namespaces apart (they cannot move)."""
    holder_moves: list[Move] = []
    cross: list[tuple[ShadowClaim, Slot]] = []
    for claim in claims:
        holder = held.get(claim.uid)
        if holder is None or holder == claim.slot:
            continue
        if holder.namespace != claim.namespace:
            cross.append((claim, holder))
            continue
        holder_moves.append(Move(claim=claim, to=holder))
    return holder_moves, cross


class _Ledger:
    """Which container each claim stands for as the plan's moves are made, and the claims already
    moved (none moves twice)."""

    def __init__(
        self, claims: Sequence[ShadowClaim], holder_moves: Sequence[Move], *, need: Need
    ) -> None:
        self.owner: dict[ClaimUid, Slot | None] = {c.uid: c.slot for c in claims}
        for move in holder_moves:
            self.owner[move.claim.uid] = move.to
        self.live = [c for c in claims if not c.deleting]
        self.used: set[ClaimUid] = {m.claim.uid for m in holder_moves}
        self.need = need

    def have(self, slot: Slot, profile: str) -> int:
        owner = self.owner
        return sum(
            len(c.devices) for c in self.live if owner[c.uid] == slot and c.profile == profile
        )

    def surplus(self, slot: Slot, profile: str) -> int:
        wanted = self.need(slot, profile)
        return 0 if wanted is None else self.have(slot, profile) - wanted

    def spare_for(
        self,
        move: Move,
        loser: Slot,
        *,
        deficit: int,
        held: Mapping[ClaimUid, Slot],
        spare: Callable[[ShadowClaim], bool],
    ) -> Move | None:
        """Step 2: a spare claim of ``move``'s profile given back to ``loser`` (short of
        ``deficit`` slices) by a container of its namespace that stands for more than it asks,
        the holder first; None when there is none."""
        owner, profile = self.owner, move.claim.profile
        others = {
            s
            for c in self.live
            if (s := owner[c.uid]) is not None and s.namespace == loser.namespace
        }
        for giver in [move.to, *sorted(others - {move.to, loser})]:
            extra = self.surplus(giver, profile)
            if extra <= 0:
                continue
            candidates = [
                c
                for c in self.live
                if owner[c.uid] == giver
                and c.profile == profile
                and c.uid not in self.used
                and c.uid not in held
                and len(c.devices) <= min(deficit, extra)
                and spare(c)
            ]
            if candidates:
                given = Move(claim=candidates[0], to=loser)
                owner[given.claim.uid] = loser
                self.used.add(given.claim.uid)
                return given
        return None
