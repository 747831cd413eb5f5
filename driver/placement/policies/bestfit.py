"""``bestfit``: the placement policy that keeps the most future placements open.

Across the cluster it tries first the node whose best GPU would lose the least by taking the pod's
largest request — loss being the currently free placements (of any profile) the new slice overlaps,
weighted by their memory slices — and the fuller GPU on ties (best fit in bin-packing terms). The
signature indexes graded by level answer that directly. On a node it places the larger requests
first and orders each device's candidates the same way: a 1g goes into a GPU whose lower half is
already split rather than into a clean one, and to slot 6 of an empty GPU rather than slot 0, where
it would kill the 7g, 4g and 3g starts. Ties fall back to first-fit order, so it is deterministic
too.
"""

from collections.abc import Iterable, Iterator, Sequence

from driver.placement.inventory import Inventory
from driver.placement.policies.firstfit import FirstFit
from driver.placement.policies.policy import Condition, condition_unions, leapfrog, next_in
from driver.placement.search import Candidate, NodeSearch, Plan
from driver.placement.state import NodeState
from driver.placement.tables import TableProfile


class BestFit:
    """The GPU that loses the least (weighted free placements) first, the fuller on ties; big first."""

    name = "bestfit"
    needs_levels = True
    needs_states = False

    def __init__(self) -> None:
        self._first: tuple[NodeState, int, int] | None = None
        """While ``nodes`` offers a node for a one-signature pod: that node, the signature's id
        and the node's best level for it (``candidates`` starts at a GPU of that level)."""

    def nodes(
        self, inventory: Inventory, plan: Plan, conditions: Sequence[Condition]
    ) -> Iterator[NodeState]:
        if not conditions:
            return
        if not inventory.track_levels:
            yield from FirstFit().nodes(inventory, plan, conditions)
            return
        unions = condition_unions(conditions)
        primary = max(conditions, key=lambda c: c.slices).sets
        if len(primary) == 1 and len(conditions) == 1:
            # One signature (most pods): its tiers in level order are the answer, no intersection.
            sig = primary[0]
            level = sig.level_set.next_at_or_after(0)
            while level >= 0:
                at_level = sig.tiers[level]
                rank = at_level.next_at_or_after(0)
                while rank >= 0:
                    node = inventory.registry.node_at(rank)
                    if node is not None:
                        self._first = (node, sig.id, level)
                        try:
                            yield node
                        finally:
                            self._first = None
                    rank = at_level.next_at_or_after(rank + 1)
                level = sig.level_set.next_at_or_after(level + 1)
            return
        seen: set[int] = set()
        level = 0
        while True:
            # The next level at which some node's best GPU can take the primary request.
            level = next_in([s.level_set for s in primary], level)
            if level < 0:
                return
            tier = [s.tiers[level] for s in primary if level in s.tiers]
            for rank in leapfrog([*unions, tier]):
                if rank in seen:
                    continue
                seen.add(rank)
                node = inventory.registry.node_at(rank)
                if node is not None:
                    yield node
            level += 1

    def device_order(self, plan: Plan, node: NodeState) -> Sequence[int]:
        if len(plan.device_requests) == 1:
            return (0,)

        def size(slot: int) -> int:
            request = plan.device_requests[slot]
            sizes = [
                p.profile.memory_slices
                for table in set(node.shape)
                for p in plan.profiles_for(request, table)
            ]
            return min(sizes, default=0)

        return sorted(range(len(plan.device_requests)), key=lambda s: -size(s))

    def candidates(
        self, search: NodeSearch, request: int, positions: Sequence[int]
    ) -> Iterable[Candidate]:
        plan, gpus, masks, media = search.plan, search.gpus, search.masks, search.media
        first = self._first
        if first is not None and first[0] is search.node and plan.single and search.untouched:
            # A one-device pod of one profile on the node ``nodes`` offers: the node is filed
            # under its best GPU's level (least destroyed, then fullest), so the first GPU at that
            # level and its first ranked start are the best candidate, and one that fits (a level
            # counts ``max_count``). The rest only if the search goes on (it does not).
            _, sig_id, level = first
            for position in positions:
                if gpus[position].levels[sig_id] == level:
                    table = gpus[position].table
                    (profile,) = plan.profiles_for(request, table)
                    ranked = table.ranked_starts(
                        profile.index, mask=masks[position], media_taken=media[position]
                    )
                    best_i = ranked[0][1]
                    yield position, profile, best_i
                    for candidate in self._ranked(search, request, positions):
                        if candidate[0] != position or candidate[2] != best_i:
                            yield candidate
                    return
        yield from self._ranked(search, request, positions)

    def _ranked(
        self, search: NodeSearch, request: int, positions: Sequence[int]
    ) -> Iterator[Candidate]:
        """Free candidates, least destroyed first, then the fuller GPU, then first-fit order."""
        plan, gpus, masks, media = search.plan, search.gpus, search.masks, search.media
        # Each (GPU, profile) list is already in score order, so the best candidate is the best
        # head; the full order is built only if the search backtracks past it (rare).
        heads: list[tuple[int, int, int, int, int, TableProfile, tuple[tuple[int, int], ...]]] = []
        for position in positions:
            table = gpus[position].table
            mask, media_taken = masks[position], media[position]
            free = table.slices - mask.bit_count()
            for profile in plan.profiles_for(request, table):
                ranked = table.ranked_starts(profile.index, mask=mask, media_taken=media_taken)
                if ranked:
                    destroyed, i = ranked[0]
                    heads.append((destroyed, free, position, profile.index, i, profile, ranked))
        if not heads:
            return
        best = min(heads, key=lambda head: head[:5])
        yield best[2], best[5], best[4]
        rest = sorted(
            (destroyed, head[1], head[2], head[3], i, head[5])
            for head in heads
            for destroyed, i in head[6]
            if head is not best or i != best[4]
        )
        for _, _, position, _, i, profile in rest:
            yield position, profile, i
