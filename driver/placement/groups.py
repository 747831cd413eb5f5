"""GPUs grouped by state, and the groups sorted into a policy's buckets, kept as GPUs change state.

A GPU's state is everything placement rules can see of it (table, occupied mask, ``+me`` taken,
counts), so a policy that scores GPUs (the scarcity-aware one) scores each distinct state once
instead of every GPU. Policies memoise what they derive from a state on its group
(``StateGroup.memo``) and ask for the live groups sorted into buckets of their own
(:meth:`StateGroups.buckets`), which are updated in place as states gain their first GPU or lose
their last — a decision reads buckets instead of regrouping the states.
"""

from collections.abc import Callable, Hashable, Iterable, Iterator

from driver.placement.state import Buckets, GpuState, StateGroup, StateKey

MAX_KNOWN_STATES = 1 << 16
"""State groups kept (with their memos) while no GPU is in their state; past it the empty ones go."""


class StateGroups:
    """Every GPU state met, as its group; the live ones (with GPUs) in each policy's buckets.

    ``on_forget`` is called when groups without GPUs are forgotten (whatever refers to them, such
    as steps leading into them, must go too)."""

    def __init__(self, *, on_forget: Callable[[], None]) -> None:
        self._on_forget = on_forget
        self._known: dict[StateKey, StateGroup] = {}
        """Every state group known, live or not."""
        self._live: dict[StateGroup, None] = {}
        """The groups with at least one GPU."""
        self._buckets: list[tuple[Hashable, Callable[[StateGroup], int], Buckets]] = []
        self._buckets_named: dict[Hashable, Buckets] = {}

    def group_for(self, key: StateKey) -> StateGroup:
        group = self._known.get(key)
        if group is None:
            if len(self._known) >= MAX_KNOWN_STATES:
                self._known = {k: g for k, g in self._known.items() if g.gpus}
                self._on_forget()
            group = self._known[key] = StateGroup(key)
        return group

    def known(self) -> Iterable[StateGroup]:
        """Every group known, live or not."""
        return self._known.values()

    def enter(self, gpu: GpuState) -> None:
        """Put a GPU new to the inventory in the group of its state."""
        self._join(gpu, self.group_for(gpu.key))

    def _join(self, gpu: GpuState, group: StateGroup) -> None:
        members = group.gpus
        if not members:
            self._live[group] = None
            joins = group.joins
            if group.joined < len(self._buckets):
                memo = group.memo
                for name, bucket_of, buckets in self._buckets[group.joined :]:
                    bucket = memo.get(name)
                    if bucket is None:
                        bucket = bucket_of(group)
                    if bucket >= 0:
                        joins.append((buckets, bucket))
                group.joined = len(self._buckets)
            # Inline (twice per GPU change): the group joins its buckets.
            for buckets, bucket in joins:
                bucketed = buckets.get(bucket)
                if bucketed is None:
                    buckets[bucket] = {group: None}
                else:
                    bucketed[group] = None
        members[gpu] = None
        gpu.group = group

    def leave(self, gpu: GpuState) -> None:
        """Take a GPU out of its group (it is going, or changing state)."""
        group = gpu.group
        if group is None:
            return
        members = group.gpus
        del members[gpu]
        gpu.group = None
        if not members:
            del self._live[group]
            for buckets, bucket in group.joins:
                bucketed = buckets[bucket]
                del bucketed[group]
                if not bucketed:
                    del buckets[bucket]

    def move(self, gpu: GpuState, entering: StateGroup) -> None:
        """:meth:`leave` then join ``entering``, inline where neither group empties nor fills."""
        group = gpu.group
        if group is not None and len(group.gpus) > 1:
            del group.gpus[gpu]
        else:
            self.leave(gpu)
        if entering.gpus:
            entering.gpus[gpu] = None
            gpu.group = entering
        else:
            self._join(gpu, entering)

    # ----------------------------------------------------------------------------- queries

    def gpu_states(self) -> Iterator[tuple[StateKey, Iterable[GpuState]]]:
        """Each distinct GPU state with the GPUs in it."""
        return ((group.key, group.gpus) for group in self._live)

    def live(self) -> Iterable[StateGroup]:
        """Each distinct GPU state as its group."""
        return self._live.keys()

    def buckets(self, name: Hashable, bucket_of: Callable[[StateGroup], int]) -> Buckets:
        """The live state groups by their bucket, kept up to date from the first call for
        ``name`` on, as states gain their first or lose their last GPU.

        ``bucket_of(group)`` must depend on the group's state alone and store its answer in
        ``group.memo[name]`` (``-1``: in no bucket); the first one given for ``name`` is kept.
        """
        buckets = self._buckets_named.get(name)
        if buckets is None:
            buckets = self._buckets_named[name] = {}
            self._buckets.append((name, bucket_of, buckets))
            for group in self._live:
                # Live groups cover every earlier bucketing (they caught up when they filled).
                bucket = group.memo.get(name)
                if bucket is None:
                    bucket = bucket_of(group)
                if bucket >= 0:
                    buckets.setdefault(bucket, {})[group] = None
                    group.joins.append((buckets, bucket))
                group.joined = len(self._buckets)
        return buckets
