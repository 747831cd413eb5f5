"""``scarcity``: the placement policy that weighs what a slice costs the *cluster*.

Placing a slice lowers, on its GPU, how many more instances of each profile could still be created
there; each lost instance is priced by how scarce its profile is across the cluster
(``driver.placement.policies.costs``). The GPU (and start) of least cost wins, the fuller on ties,
then first-fit order. It reads only the current state (no knowledge of future requests or
durations). GPUs in equal states are scored once, and states offering the same placement options at
the same fullness once between them: the inventory keeps the states in such buckets as GPUs change
state (a state's options are memoised on its group), so a decision costs the number of buckets
(about 6 on the speed trace), not of states or GPUs, and costs each distinct set of options once.
For pods of several devices the node order follows the largest request, and each device takes the
cheapest start left.
"""

from collections.abc import Iterable, Iterator, Mapping, Sequence

from driver.placement.inventory import Inventory
from driver.placement.policies.bestfit import BestFit
from driver.placement.policies.costs import (
    FREE_MASK,
    FREE_SHIFT,
    Prices,
    bucketing,
    first_starts,
    loss_ids,
    options_of,
)
from driver.placement.policies.firstfit import FirstFit
from driver.placement.policies.policy import Condition, condition_unions
from driver.placement.rankset import RankSet
from driver.placement.search import Candidate, NodeSearch, Plan
from driver.placement.state import Buckets, GpuState, NodeState


class Scarcity:
    """The start that costs the cluster least, lost instances weighted by how scarce they are."""

    name = "scarcity"
    needs_levels = False
    needs_states = True

    def __init__(self) -> None:
        self._prices = Prices({})
        """The decision's prices (each ``nodes`` call starts new ones; before any, e.g. on an
        empty cluster, weights are memory slices alone)."""
        self._first: tuple[NodeState, GpuState, float, frozenset[str]] | None = None
        """While ``nodes`` offers the first node of its first tier: that node, its GPU of least
        (cost, fullness, position), that cost and the profiles it was scored for (``candidates``
        starts there)."""

    def nodes(
        self, inventory: Inventory, plan: Plan, conditions: Sequence[Condition]
    ) -> Iterator[NodeState]:
        if not conditions:
            return
        if not inventory.track_states:
            yield from FirstFit().nodes(inventory, plan, conditions)
            return
        self._prices = prices = Prices(inventory.registry.free_instance_counts)
        self._first = None
        primary = _largest_request(plan, inventory) if len(plan.requests) > 1 else 0
        wanted = plan.requests[primary].profiles
        # States are kept in buckets of equal options and fullness by the inventory (updated as
        # states come and go), so a decision scores each bucket once and regroups nothing.
        buckets = inventory.groups.buckets(wanted, bucketing(wanted))
        if not buckets:
            return
        raw = prices.raw
        least = prices.least_sums(buckets)
        # One condition of one signature (most pods): its rank set alone says whether a node fits.
        only = (
            conditions[0].sets[0].any if len(conditions) == 1 == len(conditions[0].sets) else None
        )
        unions = condition_unions(conditions) if only is None else []
        # The first tier's first node (usually the answer) without rounding every cost nor
        # sorting every rank of every tier: the least (cost, free) key, then the GPU of least
        # (rank, index) in its buckets.
        key, gpu = _first_tier(buckets, raw, least)
        rank = gpu.node.rank
        if (rank in only) if only is not None else _in_all(unions, rank):
            node = inventory.registry.node_at(rank)
            if node is not None:
                # ``candidates`` starts from this GPU when it searches this node first.
                self._first = (node, gpu, key[0], wanted) if gpu.node is node else None
                try:
                    yield node
                finally:
                    self._first = None
        # The full order, only if that node did not take the pod (a one-device pod never gets
        # here: the first tier's GPU fits it).
        yield from _in_tier_order(inventory, buckets, raw, only, unions, seen={rank})

    def device_order(self, plan: Plan, node: NodeState) -> Sequence[int]:
        return BestFit().device_order(plan, node)

    def candidates(
        self, search: NodeSearch, request: int, positions: Sequence[int]
    ) -> Iterable[Candidate]:
        plan, gpus = search.plan, search.gpus
        first_node = self._first
        if first_node is not None and first_node[0] is search.node and search.untouched:
            # The node ``nodes`` offers first: its GPU in the first tier with the least index has
            # the least (cost, fullness, position) key (the tier's is the least of all states).
            _, first_gpu, first_cost, first_wanted = first_node
            position = gpus.index(first_gpu)
            if position in positions and plan.requests[request].profiles == first_wanted:
                first = self._cheapest_start(search, request, position, first_cost)
                yield first
                yield from self._after(search, request, positions, first, first_cost)
                return
        if search.untouched:
            # Each GPU's cheapest start costs what its state's options do (as scored by ``nodes``),
            # so only the winning GPU's starts need costing for the first candidate.
            wanted = plan.requests[request].profiles
            least: list[tuple[float, int, int]] = []
            prices = self._prices
            known = prices.cheapest
            for position in positions:
                gpu = gpus[position]
                group = gpu.group
                bucket = group.memo.get(wanted) if group is not None else None
                if bucket is None:
                    options = options_of(gpu.key, wanted)
                else:
                    options = bucket >> FREE_SHIFT if bucket >= 0 else -1
                if options >= 0:
                    cheapest = known.get(options)
                    if cheapest is None:
                        cheapest = known[options] = prices.least(options)
                    least.append((cheapest, gpu.table.slices - gpu.used, position))
            if not least:
                return
            cheapest, _, position = min(least)
            first = self._cheapest_start(search, request, position, cheapest)
            yield first
            yield from self._after(search, request, positions, first, cheapest)
            return
        scored = self._scored(search, request, positions)
        if not scored:
            return
        yield min(scored)[5]
        scored.sort()
        for entry in scored[1:]:
            yield entry[5]

    def _cheapest_start(
        self, search: NodeSearch, request: int, position: int, cheapest: float
    ) -> Candidate:
        """The first candidate of an untouched search whose least (cost, fullness, position) key
        is ``cheapest`` at GPU ``position``: the first of its starts costing that."""
        plan = search.plan
        cost = self._prices.cost
        gpu = search.gpus[position]
        table = gpu.table
        # The least (profile, start) among the starts that cost ``cheapest``: profiles come in
        # table order and their starts in increasing order, so the first found (this runs on
        # every decision). The search is untouched, so the GPU's state group knows each loss
        # vector's first start, and only the distinct vectors are costed.
        first: tuple[int, int] | None = None
        group = gpu.group
        if group is not None:
            for vector, index, i in first_starts(group, plan.requests[request].profiles):
                if cost(vector) == cheapest:
                    first = (index, i)
                    break
        else:
            mask, media_taken = search.masks[position], search.media[position]
            counts = search.counts(position)
            for profile in plan.profiles_for(request, table):
                index = profile.index
                for i, vector in loss_ids(table, index, mask, media_taken, counts):
                    if cost(vector) == cheapest:
                        first = (index, i)
                        break
                if first is not None:
                    break
        if first is None:
            raise AssertionError("the cheapest GPU has no start of the cheapest cost")
        return position, table.profiles[first[0]], first[1]

    def _after(
        self,
        search: NodeSearch,
        request: int,
        positions: Sequence[int],
        first: Candidate,
        cheapest: float,
    ) -> Iterator[Candidate]:
        """The candidates after :meth:`_cheapest_start`'s ``first`` (of cost ``cheapest``), in
        order: only if the search goes on, which a one-device pod's never does."""
        position, profile, i = first
        table = search.gpus[position].table
        rest = self._scored(search, request, positions)
        rest.remove(
            (
                cheapest,
                table.slices - search.masks[position].bit_count(),
                position,
                profile.index,
                i,
                first,
            )
        )
        rest.sort()
        for entry in rest:
            yield entry[5]

    def _scored(
        self, search: NodeSearch, request: int, positions: Sequence[int]
    ) -> list[tuple[float, int, int, int, int, Candidate]]:
        """Every free candidate with its sort key (cost, fullness, position, profile, start)."""
        plan, gpus, masks, media = search.plan, search.gpus, search.masks, search.media
        cost = self._prices.cost
        scored: list[tuple[float, int, int, int, int, Candidate]] = []
        for position in positions:
            table = gpus[position].table
            mask, media_taken = masks[position], media[position]
            counts = search.counts(position)
            free = table.slices - mask.bit_count()
            for profile in plan.profiles_for(request, table):
                index = profile.index
                for i, vector in loss_ids(table, index, mask, media_taken, counts):
                    scored.append((cost(vector), free, position, index, i, (position, profile, i)))
        # (cost, free, position, profile, start) is unique, so tuples never compare candidates.
        return scored


_NEAR = 2e-9
"""Sums further apart than this round (to 9 decimals) to different costs, below ``_NEAR_LIMIT``
(where doubles are still much finer than 1e-9)."""
_NEAR_LIMIT = 1e6


def _in_tier_order(
    inventory: Inventory,
    buckets: Buckets,
    raw: Mapping[int, float],
    only: RankSet | None,
    unions: Sequence[Sequence[RankSet]],
    *,
    seen: set[int],
) -> Iterator[NodeState]:
    """The nodes not ``seen`` whose GPUs fit (``only``, else every union of ``unions``), tier by
    tier of (cost, free) of their states (``raw``: each options set's least sum), in rank order
    within a tier."""
    scored = sorted(
        (round(raw[bucket >> FREE_SHIFT], 9), bucket & FREE_MASK, bucket) for bucket in buckets
    )  # (cost, free, bucket) is unique
    start = 0
    while start < len(scored):
        # States of equal cost and fullness form one tier, taken in rank (first-fit) order.
        end = start + 1
        while end < len(scored) and scored[end][:2] == scored[start][:2]:
            end += 1
        ranks = sorted(
            {
                g.node.rank
                for entry in scored[start:end]
                for group in buckets.get(entry[2], ())
                for g in group.gpus
            }
            - seen
        )
        for rank in ranks:
            seen.add(rank)
            if (rank in only) if only is not None else _in_all(unions, rank):
                node = inventory.registry.node_at(rank)
                if node is not None:
                    yield node
        start = end


def _first_tier(
    buckets: Buckets, raw: Mapping[int, float], least: float
) -> tuple[tuple[float, int], GpuState]:
    """The least (rounded cost, free) key of the buckets (``raw``: their options sets' least
    sums, not rounded; ``least`` the least of them) and the GPU of least (rank, index) in the
    buckets of that key.

    Rounding is monotonic, so only sums within ``_NEAR`` of the least can round to the least
    cost: just those are rounded."""
    near = least + _NEAR if least < _NEAR_LIMIT else float("inf")
    key: tuple[float, int] | None = None
    tier: list[int] = []
    for bucket in buckets:
        total = raw[bucket >> FREE_SHIFT]
        if total <= near:
            entry = (round(total, 9), bucket & FREE_MASK)
            if key is None or entry < key:
                key, tier = entry, [bucket]
            elif entry == key:
                tier.append(bucket)
    gpu: GpuState | None = None
    rank = index = -1
    for bucket in tier:
        for group in buckets[bucket]:
            for g in group.gpus:
                r = g.node.rank
                if gpu is None or r < rank or (r == rank and g.index < index):
                    gpu, rank, index = g, r, g.index
    if gpu is None or key is None:
        raise AssertionError("the first tier has no GPU")
    return key, gpu


def _in_all(unions: Sequence[Sequence[RankSet]], rank: int) -> bool:
    """Whether ``rank`` is in some set of every union."""
    return all(any(rank in s for s in union) for union in unions)


def _largest_request(plan: Plan, inventory: Inventory) -> int:
    """The request whose device may take the most memory slices (the first on ties)."""
    return max(
        range(len(plan.requests)),
        key=lambda r: (
            max((inventory.profile_slices(n)[1] for n in plan.requests[r].profiles), default=0),
            -r,
        ),
    )
