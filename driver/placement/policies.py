"""Placement policies: which node to try next, and in which order to try devices and slices on it.

``firstfit`` (the default) is InstaSlice's documented behaviour: nodes in name order, GPUs in index
order, starts in the order NVML lists them, devices in the order the pod lists them; the first
complete fit wins. It is deterministic.

``bestfit`` keeps the most future placements open. Across the cluster it tries first the node whose
best GPU would lose the least by taking the pod's largest request — loss being the currently free
placements (of any profile) the new slice overlaps, weighted by their memory slices — and the
fuller GPU on ties (best fit in bin-packing terms). On a node it places the larger requests first and
orders each device's candidates the same way: a 1g goes into a GPU whose lower half is already split
rather than into a clean one, and to slot 6 of an empty GPU rather than slot 0, where it would kill
the 7g, 4g and 3g starts. Ties fall back to first-fit order, so it is deterministic too.

``scarcity`` weighs what a slice costs the *cluster*: placing it lowers, on its GPU, how many more
instances of each profile could still be created there; each lost instance costs that profile's
memory slices divided by (its free instances across the cluster + 1) ** 1.5. Losing one of fifty
free 1g.5gb starts is cheap, losing the last free 7g.40gb is dear, whatever the GPU looks like. The
GPU (and start) of least cost wins, the fuller on ties, then first-fit order. It reads only the
current state (no knowledge of future requests or durations). GPUs in equal states are scored once,
and states offering the same placement options at the same fullness once between them: the
inventory keeps the states in such buckets as GPUs change state (a state's options are memoised on
its group), so a decision costs the number of buckets (about 6 on the speed trace), not of states or
GPUs, and costs each distinct set of options once. For pods of several devices the
node order follows the largest request, and each device takes the cheapest start left.

Policies never decide feasibility — the search (``driver.placement.search``) does — so any order
they produce is safe.
"""

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import getitem
from typing import Protocol

from driver.errors import ConfigError
from driver.placement.inventory import Inventory
from driver.placement.rankset import RankSet
from driver.placement.search import Candidate, CandidateOrder, NodeSearch, Plan
from driver.placement.state import (
    Buckets,
    GpuState,
    NodeState,
    SignatureIndex,
    StateGroup,
    StateKey,
)
from driver.placement.tables import GpuTable, TableProfile


@dataclass(frozen=True, slots=True)
class Condition:
    """A necessary condition on a node: it is in at least one of ``sets``' indexes."""

    sets: tuple[SignatureIndex, ...]
    lacking: str
    """What no node has when the condition holds nowhere, e.g. ``no node has a free 3g.20gb placement``."""
    slices: int
    """Memory slices the condition's devices take (largest model), to pick the primary one."""


def _next_in(sets: Sequence[RankSet], rank: int) -> int:
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
        found = _next_in(unions[i], rank)
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


def _condition_unions(conditions: Sequence[Condition]) -> list[list[RankSet]]:
    return [[s.any for s in c.sets] for c in conditions]


class FirstFit:
    """Nodes by name, GPUs by index, starts in NVML order, devices as listed: first fit wins."""

    name = "firstfit"
    needs_levels = False
    needs_states = False

    def nodes(
        self, inventory: Inventory, plan: Plan, conditions: Sequence[Condition]
    ) -> Iterator[NodeState]:
        for rank in leapfrog(_condition_unions(conditions)):
            node = inventory.node_at(rank)
            if node is not None:
                yield node

    def device_order(self, plan: Plan, node: NodeState) -> Sequence[int]:
        return range(len(plan.device_requests))

    def candidates(
        self, search: NodeSearch, request: int, positions: Sequence[int]
    ) -> Iterable[Candidate]:
        plan, gpus, masks, media = search.plan, search.gpus, search.masks, search.media
        for position in positions:
            table = gpus[position].table
            mask, media_taken = masks[position], media[position]
            for profile in plan.profiles_for(request, table):
                for i in table.free_starts(profile.index, mask=mask, media_taken=media_taken):
                    yield position, profile, i


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
        unions = _condition_unions(conditions)
        primary = max(conditions, key=lambda c: c.slices).sets
        if len(primary) == 1 and len(conditions) == 1:
            # One signature (most pods): its tiers in level order are the answer, no intersection.
            sig = primary[0]
            level = sig.level_set.next_at_or_after(0)
            while level >= 0:
                at_level = sig.tiers[level]
                rank = at_level.next_at_or_after(0)
                while rank >= 0:
                    node = inventory.node_at(rank)
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
            level = _next_in([s.level_set for s in primary], level)
            if level < 0:
                return
            tier = [s.tiers[level] for s in primary if level in s.tiers]
            for rank in leapfrog([*unions, tier]):
                if rank in seen:
                    continue
                seen.add(rank)
                node = inventory.node_at(rank)
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


SCARCITY_EXPONENT = 1.5
"""How steeply a profile's cost rises as its free instances run out (tuned on ``bench/traces``:
1.0 and 2.0 each did worse on some of them)."""


LossVector = tuple[tuple[int, int], ...]
"""What one placement lowers on its GPU: ``(table profile index, by how many instances)`` pairs."""

_VECTOR_IDS: dict[tuple[GpuTable, LossVector], int] = {}
_VECTORS: list[tuple[GpuTable, LossVector]] = []
_OPTION_IDS: dict[tuple[int, ...], int] = {}
_OPTIONS: list[tuple[int, ...]] = []
_OPTION_LOSSES: list[tuple[GpuTable, tuple[LossVector, ...]]] = []
"""Per options id, its table and the loss vectors that can be its least (appended before
``_OPTIONS``): a vector that loses at least as much of every profile as another of the set is left
out, since its weighted sum is never the smaller (see :func:`_undominated`)."""
"""Loss vectors, and the sets of them one GPU state offers a request, interned process-wide:
both are pure functions of the (shared) table and the state, so every ``Scarcity`` shares them.
Interning takes ``_INTERNING`` (engines in different threads may meet here); lookups need not."""
_INTERNING = threading.Lock()


def _vector_id(table: GpuTable, lost: LossVector) -> int:
    key = (table, lost)
    found = _VECTOR_IDS.get(key)
    if found is None:
        with _INTERNING:
            found = _VECTOR_IDS.get(key)
            if found is None:
                _VECTORS.append(key)
                found = _VECTOR_IDS[key] = len(_VECTORS) - 1
    return found


def _options_id(table: GpuTable, key: StateKey, profiles: Sequence[TableProfile]) -> int:
    """The interned set of loss vectors the placements of ``profiles`` have in state ``key``;
    ``-1`` if none of them can be placed there."""
    _, mask, media_taken, counts = key
    vectors = {
        _vector_id(table, lost)
        for profile in profiles
        for _, lost in table.capacity_losses(
            profile.index, mask=mask, media_taken=media_taken, counts=counts
        )
    }
    if not vectors:
        return -1
    options = tuple(sorted(vectors))
    found = _OPTION_IDS.get(options)
    if found is None:
        with _INTERNING:
            found = _OPTION_IDS.get(options)
            if found is None:
                _OPTION_LOSSES.append((table, _undominated([_VECTORS[v][1] for v in options])))
                _OPTIONS.append(options)
                found = _OPTION_IDS[options] = len(_OPTIONS) - 1
    return found


def _undominated(vectors: Sequence[LossVector]) -> tuple[LossVector, ...]:
    """``vectors`` less each one that loses at least as much of every profile as another kept one.

    Its weighted sum is never the least: weights are positive and the sums add their terms in
    profile order, so with floats too a sum only grows by a larger term or an extra one (float
    multiplication and addition are monotonic)."""
    kept: list[LossVector] = []
    for vector in vectors:
        lost = dict(vector)
        if not any(
            other != vector and all(lost.get(q, 0) >= n for q, n in other) for other in vectors
        ):
            kept.append(vector)
    return tuple(kept)


_OPTIONS_OF: dict[tuple[StateKey, frozenset[str]], int] = {}


def _options_of(key: StateKey, wanted: frozenset[str]) -> int:
    """:func:`_options_id` for a request whose acceptable profiles are ``wanted`` in state ``key``,
    remembered across the state's comings and goings."""
    memo_key = (key, wanted)
    found = _OPTIONS_OF.get(memo_key)
    if found is None:
        table = key[0]
        # What ``Plan.profiles_for`` gives: the wanted profiles the table publishes, in its order.
        profiles = tuple(p for p in table.profiles if p.name in wanted)
        found = _OPTIONS_OF[memo_key] = _options_id(table, key, profiles)
    return found


_FREE_SHIFT = 16
_FREE_MASK = (1 << _FREE_SHIFT) - 1
"""A bucket of GPU states is ``options id << _FREE_SHIFT | free memory slices`` (what a state
group's memo holds per requested profile set; ``-1``: the set has no placement there)."""

_BUCKET_OF: dict[frozenset[str], Callable[[StateGroup], int]] = {}


def _bucket_of(wanted: frozenset[str]) -> Callable[[StateGroup], int]:
    """The bucket of a state group for requests whose profiles are ``wanted`` (memoised on the
    group under ``wanted``): what the inventory keeps its groups sorted by for ``scarcity``."""
    found = _BUCKET_OF.get(wanted)
    if found is None:

        def bucket_of(group: StateGroup) -> int:
            bucket = group.memo.get(wanted)
            if bucket is None:
                options = _options_of(group.key, wanted)
                bucket = group.memo[wanted] = (
                    (options << _FREE_SHIFT) | group.free if options >= 0 else -1
                )
            return bucket

        found = _BUCKET_OF[wanted] = bucket_of
    return found


FirstStarts = tuple[tuple[int, int, int], ...]
"""Each distinct loss vector a request's starts have in one state, as ``(vector id, table profile,
start)`` with the first start that has it, in candidate order (profiles in table order, starts
increasing)."""

_FIRST_STARTS: list[FirstStarts] = []
_FIRST_STARTS_IDS: dict[FirstStarts, int] = {}
_FIRST_STARTS_KEYS: dict[frozenset[str], tuple[str, frozenset[str]]] = {}


def _first_starts(group: StateGroup, wanted: frozenset[str]) -> FirstStarts:
    """:data:`FirstStarts` of the group's state for requests whose profiles are ``wanted``
    (interned, its id memoised on the group, so a decision reads it instead of every start)."""
    memo_key = _FIRST_STARTS_KEYS.get(wanted)
    if memo_key is None:
        memo_key = _FIRST_STARTS_KEYS.setdefault(wanted, ("first starts", wanted))
    found = group.memo.get(memo_key)
    if found is None:
        table, mask, media_taken, counts = group.key
        seen: dict[int, tuple[int, int, int]] = {}
        for profile in table.profiles:
            if profile.name in wanted:
                index = profile.index
                for i, vector in _loss_ids(table, index, mask, media_taken, counts):
                    if vector not in seen:
                        seen[vector] = (vector, index, i)
        starts = tuple(seen.values())
        with _INTERNING:
            found = _FIRST_STARTS_IDS.get(starts)
            if found is None:
                _FIRST_STARTS.append(starts)
                found = _FIRST_STARTS_IDS[starts] = len(_FIRST_STARTS) - 1
        group.memo[memo_key] = found
    return _FIRST_STARTS[found]


_LOSS_IDS: dict[tuple[GpuTable, int, int, bool, tuple[int, ...]], tuple[tuple[int, int], ...]] = {}


def _loss_ids(
    table: GpuTable, profile: int, mask: int, media_taken: bool, counts: tuple[int, ...]
) -> tuple[tuple[int, int], ...]:
    """``table.capacity_losses`` with each loss vector as its interned id: ``(placement, id)``."""
    key = (table, profile, mask, media_taken, counts)
    found = _LOSS_IDS.get(key)
    if found is None:
        losses = table.capacity_losses(profile, mask=mask, media_taken=media_taken, counts=counts)
        found = _LOSS_IDS[key] = tuple((i, _vector_id(table, lost)) for i, lost in losses)
    return found


_ROUNDED: dict[float, float] = {}
_ROUNDED_LIMIT = 1 << 16
"""Costs are compared rounded to 9 decimals (so sums that differ only by float error tie);
``round`` is the slowest step of a cost and the same sums recur, so roundings are remembered."""


def _weight(slices: int, free: int) -> float:
    """The cost of losing one instance of a profile of ``slices`` with ``free`` instances left."""
    weight: float = slices / (free + 1) ** SCARCITY_EXPONENT
    return weight


_WEIGHT_ROWS: dict[tuple[float, int], list[float]] = {}
"""Per (exponent, memory slices), :func:`_weight` of every free-instance count up to the largest
seen, by count (grown on demand): a decision reads a table's weights in one ``map``."""


@dataclass(frozen=True, slots=True)
class _WeightTable:
    """What a table's weights are read with: its profiles' names, sizes and weight rows."""

    exponent: float
    names: tuple[str, ...]
    zeros: tuple[int, ...]
    """``0`` per profile: the free count of a profile the inventory has not seen (``dict.get``)."""
    slices: tuple[int, ...]
    rows: tuple[list[float], ...]


_WEIGHT_TABLES: dict[GpuTable, _WeightTable] = {}


def _weights_of(table: GpuTable, free: Mapping[str, int]) -> tuple[float, ...]:
    """The cost of one lost instance of each of the table's profiles (in table order) with
    ``free`` instances of each left across the cluster."""
    known = _WEIGHT_TABLES.get(table)
    if known is None or known.exponent != SCARCITY_EXPONENT:
        slices = tuple(p.profile.memory_slices for p in table.profiles)
        known = _WEIGHT_TABLES[table] = _WeightTable(
            exponent=SCARCITY_EXPONENT,
            names=tuple(p.name for p in table.profiles),
            zeros=(0,) * len(slices),
            slices=slices,
            rows=tuple(_WEIGHT_ROWS.setdefault((SCARCITY_EXPONENT, n), []) for n in slices),
        )
    frees = tuple(map(free.get, known.names, known.zeros))
    try:
        # Free counts are sums of capacities, never negative (a negative index would wrap).
        return tuple(map(getitem, known.rows, frees))
    except IndexError:
        with _INTERNING:
            for row, slices_of, count in zip(known.rows, known.slices, frees, strict=True):
                for n in range(len(row), count + 1):
                    row.append(_weight(slices_of, n))
        return tuple(map(getitem, known.rows, frees))


class Scarcity:
    """The start that costs the cluster least, lost instances weighted by how scarce they are."""

    name = "scarcity"
    needs_levels = False
    needs_states = True

    def __init__(self) -> None:
        self._free: Mapping[str, int] = {}
        """Free instances per profile across the decision's inventory (none before any ``nodes``
        call, e.g. on an empty cluster: weights are then memory slices alone)."""
        self._weights: dict[GpuTable, tuple[float, ...]] = {}
        self._costs: dict[int, float] = {}
        """Loss vector id -> its cost under the current weights (rounded), reset with them."""
        self._cheapest: dict[int, float] = {}
        """Options id -> :meth:`_least` under the current weights, reset with them."""
        self._raw: dict[int, float] = {}
        """Options id -> its least sum before rounding (``nodes``), reset with the weights."""
        self._first: tuple[NodeState, GpuState, float, frozenset[str]] | None = None
        """While ``nodes`` offers the first node of its first tier: that node, its GPU of least
        (cost, fullness, position), that cost and the profiles it was scored for (``candidates``
        starts there)."""

    def _weights_for(self, table: GpuTable) -> tuple[float, ...]:
        """Cost of one lost instance per table profile, from the free instances of the decision's
        inventory (memory slices alone before any ``nodes`` call, e.g. on an empty cluster)."""
        weights = self._weights.get(table)
        if weights is None:
            weights = self._weights[table] = _weights_of(table, self._free)
        return weights

    def _cost(self, vector: int) -> float:
        """The cost of the loss vector with id ``vector``: its lost instances, weighted."""
        cost = self._costs.get(vector)
        if cost is None:
            table, lost = _VECTORS[vector]
            weights = self._weights.get(table) or self._weights_for(table)
            total = 0.0
            for q, n in lost:
                total += weights[q] * n
            cost = _ROUNDED.get(total)
            if cost is None:
                if len(_ROUNDED) >= _ROUNDED_LIMIT:
                    _ROUNDED.clear()
                cost = _ROUNDED[total] = round(total, 9)
            self._costs[vector] = cost
        return cost

    def _least(self, options: int) -> float:
        """The cost of the cheapest loss vector of the options set ``options`` (what the least of
        their :meth:`_cost` is: rounding is monotonic, so the least sum is rounded alone)."""
        table, losses = _OPTION_LOSSES[options]
        weights = self._weights.get(table) or self._weights_for(table)
        least = -1.0
        for lost in losses:
            total = 0.0
            for q, n in lost:  # the same sum, in the same order, as ``_cost``
                total += weights[q] * n
            if least < 0.0 or total < least:
                least = total
        return round(least, 9)  # least sums seldom recur: ``_ROUNDED`` would rarely know it

    def nodes(
        self, inventory: Inventory, plan: Plan, conditions: Sequence[Condition]
    ) -> Iterator[NodeState]:
        if not conditions:
            return
        if not inventory.track_states:
            yield from FirstFit().nodes(inventory, plan, conditions)
            return
        self._free = inventory.free_instance_counts
        self._weights = {}
        self._costs = {}
        cheapest: dict[int, float] = {}
        self._cheapest = cheapest
        self._first = None
        self._raw = {}
        primary = _largest_request(plan, inventory) if len(plan.requests) > 1 else 0
        wanted = plan.requests[primary].profiles
        # States are kept in buckets of equal options and fullness by the inventory (updated as
        # states come and go), so a decision scores each bucket once and regroups nothing.
        buckets = inventory.state_buckets(wanted, _bucket_of(wanted))
        if not buckets:
            return
        raw = self._raw
        least = self._least_sums(buckets)
        # One condition of one signature (most pods): its rank set alone says whether a node fits.
        only = (
            conditions[0].sets[0].any if len(conditions) == 1 == len(conditions[0].sets) else None
        )
        unions = _condition_unions(conditions) if only is None else []
        # The first tier's first node (usually the answer) without rounding every cost nor
        # sorting every rank of every tier: the least (cost, free) key, then the GPU of least
        # (rank, index) in its buckets.
        key, gpu = _first_tier(buckets, raw, least)
        rank = gpu.node.rank
        if (rank in only) if only is not None else _in_all(unions, rank):
            node = inventory.node_at(rank)
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

    def _least_sums(self, buckets: Buckets) -> float:
        """Each options set of the buckets -> its least sum, not rounded yet (into ``_raw``),
        and the least of those sums (``inf`` if there are no buckets)."""
        raw = self._raw
        weights_of = self._weights
        least_of_all = float("inf")
        for bucket in buckets:
            options = bucket >> _FREE_SHIFT
            if options in raw:
                continue
            # ``_least``, inline (this runs for some 4.5 option sets per decision).
            table, losses = _OPTION_LOSSES[options]
            weights = weights_of.get(table) or self._weights_for(table)
            least = -1.0
            for lost in losses:
                total = 0.0
                for q, n in lost:
                    total += weights[q] * n
                if least < 0.0 or total < least:
                    least = total
            raw[options] = least
            if least < least_of_all:  # noqa: PLR1730 - ``min`` is a call per options set
                least_of_all = least
        return least_of_all

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
            known = self._cheapest
            for position in positions:
                gpu = gpus[position]
                group = gpu.group
                bucket = group.memo.get(wanted) if group is not None else None
                if bucket is None:
                    options = _options_of(gpu.key, wanted)
                else:
                    options = bucket >> _FREE_SHIFT if bucket >= 0 else -1
                if options >= 0:
                    cheapest = known.get(options)
                    if cheapest is None:
                        cheapest = known[options] = self._least(options)
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
        cost = self._cost
        gpu = search.gpus[position]
        table = gpu.table
        # The least (profile, start) among the starts that cost ``cheapest``: profiles come in
        # table order and their starts in increasing order, so the first found (this runs on
        # every decision). The search is untouched, so the GPU's state group knows each loss
        # vector's first start, and only the distinct vectors are costed.
        first: tuple[int, int] | None = None
        group = gpu.group
        if group is not None:
            for vector, index, i in _first_starts(group, plan.requests[request].profiles):
                if cost(vector) == cheapest:
                    first = (index, i)
                    break
        else:
            mask, media_taken = search.masks[position], search.media[position]
            counts = search.counts(position)
            for profile in plan.profiles_for(request, table):
                index = profile.index
                for i, vector in _loss_ids(table, index, mask, media_taken, counts):
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
        cost = self._cost
        scored: list[tuple[float, int, int, int, int, Candidate]] = []
        for position in positions:
            table = gpus[position].table
            mask, media_taken = masks[position], media[position]
            counts = search.counts(position)
            free = table.slices - mask.bit_count()
            for profile in plan.profiles_for(request, table):
                index = profile.index
                for i, vector in _loss_ids(table, index, mask, media_taken, counts):
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
        (round(raw[bucket >> _FREE_SHIFT], 9), bucket & _FREE_MASK, bucket) for bucket in buckets
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
                node = inventory.node_at(rank)
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
        total = raw[bucket >> _FREE_SHIFT]
        if total <= near:
            entry = (round(total, 9), bucket & _FREE_MASK)
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


POLICIES: dict[str, Callable[[], Policy]] = {
    FirstFit.name: FirstFit,
    BestFit.name: BestFit,
    Scarcity.name: Scarcity,
}
"""Policies selectable by name; register another with one line."""

DEFAULT_POLICY = FirstFit.name


def policy_named(name: str) -> Policy:
    """A fresh policy called ``name``; ``ConfigError`` naming the choices if unknown."""
    factory = POLICIES.get(name)
    if factory is None:
        raise ConfigError(f"unknown placement policy {name!r} (known: {', '.join(POLICIES)})")
    return factory()
