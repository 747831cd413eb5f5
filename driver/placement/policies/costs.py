"""What a placement costs the cluster, as the ``scarcity`` policy prices it.

Placing a slice lowers, on its GPU, how many more instances of each profile could still be created
there: its *loss vector*. Each lost instance costs that profile's memory slices divided by (its free
instances across the cluster + 1) ** ``SCARCITY_EXPONENT``, so losing one of fifty free 1g.5gb
starts is cheap and losing the last free 7g.40gb is dear, whatever the GPU looks like.

Loss vectors, the sets of them one GPU state offers a request (*options*), and the *buckets* states
are kept in (equal options at equal fullness) depend only on the shared tables and the state, so they
are interned process-wide here; :class:`Prices` weighs them for one decision.
"""

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import getitem

from driver.placement.state import Buckets, StateGroup, StateKey
from driver.placement.tables import GpuTable, TableProfile

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


def options_of(key: StateKey, wanted: frozenset[str]) -> int:
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


FREE_SHIFT = 16
FREE_MASK = (1 << FREE_SHIFT) - 1
"""A bucket of GPU states is ``options id << FREE_SHIFT | free memory slices`` (what a state
group's memo holds per requested profile set; ``-1``: the set has no placement there)."""

_BUCKET_OF: dict[frozenset[str], Callable[[StateGroup], int]] = {}


def bucketing(wanted: frozenset[str]) -> Callable[[StateGroup], int]:
    """The function giving a state group's bucket for requests whose profiles are ``wanted``
    (memoised on the group under ``wanted``): what the inventory keeps its groups sorted by for
    ``scarcity``."""
    found = _BUCKET_OF.get(wanted)
    if found is None:

        def bucket_of(group: StateGroup) -> int:
            bucket = group.memo.get(wanted)
            if bucket is None:
                options = options_of(group.key, wanted)
                bucket = group.memo[wanted] = (
                    (options << FREE_SHIFT) | group.free if options >= 0 else -1
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


def first_starts(group: StateGroup, wanted: frozenset[str]) -> FirstStarts:
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
                for i, vector in loss_ids(table, index, mask, media_taken, counts):
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


def loss_ids(
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


class Prices:
    """What lost instances cost in one decision: the weights from the cluster's free instances,
    and the costs of loss vectors and options sets under them (remembered for the decision)."""

    __slots__ = ("_costs", "_free", "_weights", "cheapest", "raw")

    def __init__(self, free: Mapping[str, int]) -> None:
        self._free = free
        """Free instances per profile across the decision's inventory (none before any decision,
        e.g. on an empty cluster: weights are then memory slices alone)."""
        self._weights: dict[GpuTable, tuple[float, ...]] = {}
        self._costs: dict[int, float] = {}
        """Loss vector id -> its cost (rounded)."""
        self.cheapest: dict[int, float] = {}
        """Options id -> :meth:`least`, for callers that ask for it more than once."""
        self.raw: dict[int, float] = {}
        """Options id -> its least sum before rounding (:meth:`least_sums`)."""

    def _weights_for(self, table: GpuTable) -> tuple[float, ...]:
        """Cost of one lost instance per table profile, from the decision's free instances."""
        weights = self._weights.get(table)
        if weights is None:
            weights = self._weights[table] = _weights_of(table, self._free)
        return weights

    def cost(self, vector: int) -> float:
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

    def least(self, options: int) -> float:
        """The cost of the cheapest loss vector of the options set ``options`` (what the least of
        their :meth:`cost` is: rounding is monotonic, so the least sum is rounded alone)."""
        table, losses = _OPTION_LOSSES[options]
        weights = self._weights.get(table) or self._weights_for(table)
        least = -1.0
        for lost in losses:
            total = 0.0
            for q, n in lost:  # the same sum, in the same order, as ``cost``
                total += weights[q] * n
            if least < 0.0 or total < least:
                least = total
        return round(least, 9)  # least sums seldom recur: ``_ROUNDED`` would rarely know it

    def least_sums(self, buckets: Buckets) -> float:
        """Each options set of the buckets -> its least sum, not rounded yet (into :attr:`raw`),
        and the least of those sums (``inf`` if there are no buckets)."""
        raw = self.raw
        weights_of = self._weights
        least_of_all = float("inf")
        for bucket in buckets:
            options = bucket >> FREE_SHIFT
            if options in raw:
                continue
            # ``least``, inline (this runs for some 4.5 option sets per decision).
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
