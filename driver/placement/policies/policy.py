"""What every placement policy is and shares: the ``Policy`` protocol, the ``Condition`` a node
must meet, and the leapfrog intersection of rank sets that finds the nodes meeting them all.

A policy orders; it never decides feasibility — the search (``driver.placement.search``) does — so
any order a policy produces is safe.
"""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from driver.placement.inventory import Inventory
from driver.placement.rankset import RankSet
from driver.placement.search import CandidateOrder, Plan
from driver.placement.state import NodeState, SignatureIndex


@dataclass(frozen=True, slots=True)
class Condition:
    """A necessary condition on a node: it is in at least one of ``sets``' indexes."""

    sets: tuple[SignatureIndex, ...]
    lacking: str
    """What no node has when the condition holds nowhere, e.g. ``no node has a free 3g.20gb placement``."""
    slices: int
    """Memory slices the condition's devices take (largest model), to pick the primary one."""


def next_in(sets: Sequence[RankSet], rank: int) -> int:
    """The least rank at or after ``rank`` in any of ``sets``; ``-1`` if none has one."""
    best = -1
    for rank_set in sets:
        found = rank_set.next_at_or_after(rank)
        if found >= 0 and (best < 0 or found < best):
            best = found
    return best


def leapfrog(unions: Sequence[Sequence[RankSet]]) -> Iterator[int]:
    """Ranks present in every union of rank sets, in increasing order (leapfrog intersection)."""
    if not unions:
        return
    count = len(unions)
    rank = 0
    agreed = 0
    i = 0
    while True:
        found = next_in(unions[i], rank)
        if found < 0:
            return
        if found == rank:
            agreed += 1
        else:
            rank = found
            agreed = 1
        if agreed == count:
            yield rank
            rank += 1
            agreed = 0
        i = (i + 1) % count


class Policy(CandidateOrder, Protocol):
    """A placement policy: node order across the cluster plus candidate order on a node."""

    name: str
    needs_levels: bool
    """Whether ``nodes`` uses the inventory's per-level index (``Inventory(track_levels=True)``)."""
    needs_states: bool
    """Whether ``nodes`` uses the inventory's GPU-state groups (``Inventory(track_states=True)``)."""

    def nodes(
        self, inventory: Inventory, plan: Plan, conditions: Sequence[Condition]
    ) -> Iterator[NodeState]:
        """Nodes worth trying, best first; each node at most once."""
        ...


def condition_unions(conditions: Sequence[Condition]) -> list[list[RankSet]]:
    """Per condition, the rank sets a node must be in one of (what ``leapfrog`` intersects)."""
    return [[s.any for s in c.sets] for c in conditions]
