"""The cluster as the placement engine sees it: nodes, their GPUs, what is taken, and indexes.

Inventory (what nodes publish) and occupancy (which slices are taken, by us or by anyone else) are
kept apart: occupancy is recorded per (node, GPU index) even before the node's inventory is known, so
the controller may feed allocated claims and ResourceSlices in any order. Every change to one GPU
updates the indexes in place — nothing here ever scans the cluster for a decision.

Index: for each *signature* (a multiset of profiles that must fit on one GPU, e.g. ``1g.5gb`` or
``2 x 1g.5gb + 2g.10gb``) a rank set of the nodes with a GPU that can take it now. Ranks are positions
in node-name order, so "the first node in name order that can take a 3g.20gb" is a successor query.
With ``track_levels`` (for the fragmentation-aware policy) each signature also files every node under
its best GPU's *level* — the free placements that fitting the signature there would destroy, then
how full the GPU is — so "the node whose GPU loses least" is a successor query too. Signatures are
indexed on first use; single-profile ones always, multi-profile ones up to a bound. With
``track_states`` (for the scarcity-aware policy) GPUs are also grouped by their state (table, mask,
``+me``, counts), so a policy scores each distinct state once instead of every GPU, and the groups
are kept sorted into a policy's buckets (``state_buckets``) as states gain or lose their GPUs.
"""

import logging
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping

from driver.errors import NotFoundError
from driver.placement.request import DeviceAssignment
from driver.placement.state import (
    Buckets,
    GpuState,
    NodeSpec,
    NodeState,
    Occupant,
    SignatureIndex,
    StateGroup,
    StateKey,
    Step,
)
from driver.placement.tables import GpuTable, Signature

logger = logging.getLogger(__name__)

_OCCUPANT_CACHE_LIMIT = 4096

MAX_MULTI_SIGNATURES = 64
"""Multi-profile signatures indexed at most; later ones fall back to per-profile conditions."""


MAX_KNOWN_STATES = 1 << 16
"""State groups kept (with their memos) while no GPU is in their state; past it the empty ones go."""

MAX_STEPS = 1 << 17
"""GPU state transitions kept (see :class:`Step`); past it they are all dropped and rebuilt."""


class Inventory:
    """Mutable cluster state with incremental indexes. Not thread-safe: serialise callers.

    ``track_levels`` files nodes by level per signature (needed by ``bestfit``; ``firstfit`` only
    needs to know which nodes can fit, which is cheaper to maintain). ``track_states`` groups GPUs
    by state (needed by ``scarcity``).
    """

    def __init__(
        self,
        nodes: Iterable[NodeSpec] = (),
        *,
        track_levels: bool = False,
        track_states: bool = False,
    ) -> None:
        self.track_levels = track_levels
        self.track_states = track_states
        self._states: dict[StateKey, StateGroup] = {}
        """Every state group known, live or not (``track_states``)."""
        self._live: dict[StateGroup, None] = {}
        """The groups with at least one GPU."""
        self._buckets: list[tuple[Hashable, Callable[[StateGroup], int], Buckets]] = []
        self._buckets_named: dict[Hashable, Buckets] = {}
        self._nodes: dict[str, NodeState] = {}
        self._gpus: dict[tuple[str, int], GpuState] = {}
        self._by_rank: list[NodeState | None] = []
        self._ranks_dirty = False
        self._occupants: dict[tuple[str, int], list[Occupant]] = {}
        self._occupant_of: dict[tuple[int, int, bool, str | None], Occupant] = {}
        """Occupants are immutable, so equal ones are one object (built once, not per occupy)."""
        self._slots: dict[int, tuple[DeviceAssignment, GpuState, Occupant]] = {}
        """Device id -> (that device, its GPU, its occupant) (:meth:`device_slot`); emptied when
        a node is set or removed (its GPUs are new objects then). Entries hold their device, so
        ids are not reused."""
        self._signatures: dict[Signature, SignatureIndex] = {}
        self._sig_list: list[SignatureIndex] = []
        self._multi = 0
        self._sigs_by_table: dict[GpuTable, list[SignatureIndex]] = {}
        self._free_instances: dict[str, int] = {}
        self._published_gpus: dict[str, int] = {}
        self._min_slices: dict[str, int] = {}
        self._max_slices: dict[str, int] = {}
        # Node names per shape (dict as an insertion-ordered set: the first is the representative).
        self._shapes: dict[tuple[GpuTable, ...], dict[str, None]] = {}
        self._level_cache: dict[tuple[GpuTable, int, bool, tuple[int, ...]], tuple[int, ...]] = {}
        self._level_vectors: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._caps_diffs: dict[tuple[int, int], tuple[tuple[str, int], ...]] = {}
        self._level_diffs: dict[
            tuple[GpuTable, int, int], tuple[tuple[SignatureIndex, int, int], ...]
        ] = {}
        self._steps: dict[tuple[StateKey, object], Step] = {}
        """(state, id of the occupant added or the state a release leads to) -> its step."""
        self._release_steps: dict[tuple[StateKey, int], Step] = {}
        """(state, id of the occupant released) -> its step, for :attr:`GpuState.disjoint` GPUs."""
        self._group_steps = 0
        """Steps kept on state groups instead (``StateGroup.adds`` and ``releases``), with
        ``track_states``."""
        for spec in nodes:
            self.set_node(spec)

    # ----------------------------------------------------------------------------- inventory

    def set_node(self, spec: NodeSpec) -> None:
        """Add a node or replace what it publishes; its occupancy is kept."""
        old = self._nodes.get(spec.name)
        self._slots.clear()
        reuse_rank = -1
        if old is not None:
            reuse_rank = old.rank
            self.remove_node(spec.name)
        node = NodeState(spec)
        gpus = []
        for gpu_spec in sorted(spec.gpus, key=lambda g: g.index):
            occupants = self._occupants.setdefault((spec.name, gpu_spec.index), [])
            gpus.append(GpuState(node, gpu_spec, occupants))
        for gpu in gpus:
            self._gpus[(spec.name, gpu.index)] = gpu
        node.gpus = tuple(gpus)
        node.shape = tuple(g.table for g in gpus)
        self._nodes[spec.name] = node
        self._shapes.setdefault(node.shape, {})[spec.name] = None
        for gpu in gpus:
            for profile, cap in zip(gpu.table.profiles, gpu.caps, strict=True):
                name = profile.name
                self._published_gpus[name] = self._published_gpus.get(name, 0) + 1
                self._free_instances[name] = self._free_instances.get(name, 0) + cap
                size = profile.profile.memory_slices
                self._min_slices[name] = min(self._min_slices.get(name, size), size)
                self._max_slices[name] = max(self._max_slices.get(name, size), size)
            gpu.levels = self._levels_for(gpu)
            if self.track_states:
                self._enter_state(gpu, gpu.key)
            for sig in self._sigs_for(gpu.table):
                level = gpu.levels[sig.id]
                if level >= 0:
                    node.fitting[sig.id] = node.fitting.get(sig.id, 0) + 1
                    best = node.best.get(sig.id, -1)
                    if best < 0 or level < best:
                        node.best[sig.id] = level
        if self._ranks_dirty:
            return
        graded = self.track_levels
        if reuse_rank >= 0:
            node.rank = reuse_rank
            self._by_rank[reuse_rank] = node
        else:
            last = self._last_live()
            if last is not None and last.name > spec.name:
                self._ranks_dirty = True
                return
            node.rank = len(self._by_rank)
            self._by_rank.append(node)
        for sig_id, level in node.best.items():
            self._sig_list[sig_id].add(node.rank, level, graded=graded)

    def remove_node(self, name: str) -> None:
        """Forget a node's inventory (its occupancy is kept until released)."""
        node = self._nodes.pop(name, None)
        if node is None:
            return
        self._slots.clear()
        shape_nodes = self._shapes[node.shape]
        del shape_nodes[name]
        if not shape_nodes:
            del self._shapes[node.shape]
        for gpu in node.gpus:
            del self._gpus[(name, gpu.index)]
            for profile, cap in zip(gpu.table.profiles, gpu.caps, strict=True):
                self._published_gpus[profile.name] -= 1
                self._free_instances[profile.name] -= cap
            if self.track_states:
                self._leave_state(gpu)
        if not self._ranks_dirty and node.rank >= 0:
            for sig_id, level in node.best.items():
                self._sig_list[sig_id].discard(node.rank, level, graded=self.track_levels)
            self._by_rank[node.rank] = None
        else:
            self._ranks_dirty = True

    def _last_live(self) -> NodeState | None:
        while self._by_rank and self._by_rank[-1] is None:
            self._by_rank.pop()
        return self._by_rank[-1] if self._by_rank else None

    def ensure_ranked(self) -> None:
        """Re-rank nodes in name order and rebuild the rank sets after out-of-order additions.

        Costs O(nodes x indexed signatures); it runs only when a node was added whose name does not
        sort after every known node, and at most once per decision however many were added.
        """
        if not self._ranks_dirty:
            return
        ordered = sorted(self._nodes.values(), key=lambda n: n.name)
        self._by_rank = list(ordered)
        for sig in self._sig_list:
            sig.clear()
        for rank, node in enumerate(ordered):
            node.rank = rank
            for sig_id, level in node.best.items():
                self._sig_list[sig_id].add(rank, level, graded=self.track_levels)
        self._ranks_dirty = False
        logger.debug("re-ranked %s nodes", len(ordered))

    # ----------------------------------------------------------------------------- occupancy

    def occupy(
        self,
        node: str,
        gpu_index: int,
        *,
        start: int,
        size: int,
        media: bool = False,
        profile: str | None = None,
    ) -> None:
        """Record that slices ``start … start+size-1`` of a GPU are taken (by anyone).

        Never refuses: the API server is the truth, so overlapping records are kept (and all block
        their slices) until each is released.
        """
        occupant = self._occupant(start=start, size=size, media=media, profile=profile)
        key = (node, gpu_index)
        occupants = self._occupants.get(key)
        if occupants is None:
            occupants = self._occupants[key] = []
        occupants.append(occupant)
        gpu = self._gpus.get(key)
        if gpu is not None:
            self._refresh(gpu.node, gpu, occupant)

    def release(
        self,
        node: str,
        gpu_index: int,
        *,
        start: int,
        size: int,
        media: bool = False,
        profile: str | None = None,
    ) -> None:
        """Undo one matching :meth:`occupy`; ``NotFoundError`` if there is none."""
        key = (node, gpu_index)
        occupants = self._occupants.get(key, [])
        # The first equal occupant goes (what ``list.remove`` of an equal Occupant would do).
        for at, held in enumerate(occupants):
            if (
                held.start == start
                and held.size == size
                and held.media == media
                and held.profile == profile
            ):
                del occupants[at]
                removed = held
                break
        else:
            occupant = Occupant(start=start, size=size, media=media, profile=profile)
            raise NotFoundError(
                f"no occupied slice {occupant} on GPU {gpu_index} of node {node} to release"
            )
        gpu = self._gpus.get(key)
        if gpu is not None:
            self._refresh(gpu.node, gpu, removed=removed)

    def occupy_device(self, device: DeviceAssignment) -> None:
        """:meth:`occupy` of a device the engine placed (its commit), the GPU already checked free.

        A device's GPU and occupant are remembered per device object (the engine answers with
        remembered devices), so committing and releasing it again looks nothing up."""
        gpu, occupant = self.device_slot(device)
        gpu.occupants.append(occupant)
        self._refresh(gpu.node, gpu, occupant)

    def release_device(self, device: DeviceAssignment) -> None:
        """:meth:`release` of a device :meth:`occupy_device` recorded."""
        slot = self._slots.get(id(device))
        if slot is not None and slot[0] is device:
            _, gpu, occupant = slot
            occupants = gpu.occupants
            # Equal occupants are one object (``_occupant``), and any equal one may go: they
            # leave the same state behind.
            for at, held in enumerate(occupants):
                if held is occupant:
                    del occupants[at]
                    self._refresh(gpu.node, gpu, removed=occupant)
                    return
        self.release(
            device.node,
            device.gpu_index,
            start=device.start,
            size=device.size,
            media=device.media,
            profile=device.profile,
        )

    def device_slot(self, device: DeviceAssignment) -> tuple[GpuState, Occupant]:
        """The GPU a device is on and the occupant it makes there; ``NotFoundError`` if the GPU
        is not in the inventory."""
        slot = self._slots.get(id(device))
        if slot is not None and slot[0] is device:
            return slot[1], slot[2]
        gpu = self.gpu(device.node, device.gpu_index)
        occupant = self._occupant(
            start=device.start, size=device.size, media=device.media, profile=device.profile
        )
        if len(self._slots) >= _OCCUPANT_CACHE_LIMIT:
            self._slots.clear()
        self._slots[id(device)] = (device, gpu, occupant)
        return gpu, occupant

    def _occupant(self, *, start: int, size: int, media: bool, profile: str | None) -> Occupant:
        """The one occupant object of these fields (built once, not per occupy)."""
        if start < 0 or size < 1:
            raise ValueError(f"bad placement start={start} size={size}")
        described = (start, size, media, profile)
        occupant = self._occupant_of.get(described)
        if occupant is None:
            if len(self._occupant_of) >= _OCCUPANT_CACHE_LIMIT:
                self._occupant_of.clear()
            occupant = Occupant(start=start, size=size, media=media, profile=profile)
            self._occupant_of[described] = occupant
        return occupant

    def occupants(self, node: str, gpu_index: int) -> tuple[Occupant, ...]:
        return tuple(self._occupants.get((node, gpu_index), ()))

    def _group_for(self, key: StateKey) -> StateGroup:
        group = self._states.get(key)
        if group is None:
            if len(self._states) >= MAX_KNOWN_STATES:
                self._states = {k: g for k, g in self._states.items() if g.gpus}
                self._drop_steps()  # steps may name the groups just dropped
            group = self._states[key] = StateGroup(key)
        return group

    def _enter_state(self, gpu: GpuState, key: StateKey) -> None:
        self._join(gpu, self._group_for(key))

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

    def _leave_state(self, gpu: GpuState) -> None:
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

    def _move_group(self, gpu: GpuState, entering: StateGroup) -> None:
        """``_leave_state`` then ``_join``, inline where neither group empties nor fills."""
        group = gpu.group
        if group is not None and len(group.gpus) > 1:
            del group.gpus[gpu]
        else:
            self._leave_state(gpu)
        if entering.gpus:
            entering.gpus[gpu] = None
            gpu.group = entering
        else:
            self._join(gpu, entering)

    def _refresh(
        self,
        node: NodeState,
        gpu: GpuState,
        added: Occupant | None = None,
        *,
        removed: Occupant | None = None,
    ) -> None:
        """Bring the GPU's state and every index up to date after its occupants changed
        (``added``: the one occupant appended since the last refresh, if that is all;
        ``removed``: the one occupant taken out since, if that is all)."""
        step = self._step_for(gpu, added, removed)
        gpu.mask = step.mask
        gpu.media_taken = step.media
        gpu.counts = step.counts
        gpu.used = step.used
        gpu.caps = step.caps
        gpu.key = step.key
        if step.moves_group:
            self._move_group(gpu, step.group)  # type: ignore[arg-type]
        if step.moved:
            free_instances = self._free_instances
            for name, delta in step.moved:
                free_instances[name] += delta
        changed = step.changed
        if not changed:
            gpu.levels = step.levels
            return
        gpu.levels = step.levels
        if self.track_levels:
            self._regrade(node, changed)
        else:
            self._refit(node, changed)

    def _refit(self, node: NodeState, changed: tuple[tuple[SignatureIndex, int, int], ...]) -> None:
        """The node's index entries after one GPU's levels changed, without ``track_levels``.

        Every level that fits is 0: the node is in a signature's index while it counts a GPU
        that fits (``NodeState.fitting``), so no change needs a scan of its GPUs."""
        update_sets = not self._ranks_dirty
        node_best = node.best
        rank = node.rank
        fitting = node.fitting
        for sig, new, _ in changed:
            sig_id = sig.id
            if new >= 0:
                count = fitting.get(sig_id, 0)
                fitting[sig_id] = count + 1
                if count:
                    continue
                node_best[sig_id] = 0
                if update_sets:
                    sig.any.add(rank)  # ``SignatureIndex.add`` without levels
            else:
                count = fitting[sig_id] - 1
                fitting[sig_id] = count
                if count:
                    continue
                del node_best[sig_id]
                if update_sets:
                    sig.any.discard(rank)

    def _regrade(
        self, node: NodeState, changed: tuple[tuple[SignatureIndex, int, int], ...]
    ) -> None:
        """The node's best levels and index tiers after one GPU's levels changed."""
        update_sets = not self._ranks_dirty
        node_best = node.best
        rank = node.rank
        for sig, new, old in changed:
            sig_id = sig.id
            old_best = node_best.get(sig_id, -1)
            if new >= 0 and (old_best < 0 or new <= old_best):
                best = new  # this GPU is (one of) the node's best now
            elif old != old_best:
                # It was not the best (old < 0 here means old_best >= 0) and is not better than
                # the best: nothing moves.
                continue
            else:
                # It was the best and got worse: the node's best is its best GPU now (no level
                # is below 0, so a GPU at 0 ends the search).
                best = -1
                for other in node.gpus:
                    other_level = other.levels[sig_id]
                    if other_level >= 0 and (best < 0 or other_level < best):
                        best = other_level
                        if not best:
                            break
            if best == old_best:
                continue
            if best >= 0:
                node_best[sig_id] = best
            else:
                del node_best[sig_id]
            if not update_sets:
                continue
            if old_best < 0:
                sig.add(rank, best, graded=True)
            elif best < 0:
                sig.discard(rank, old_best, graded=True)
            else:
                sig.move(rank, old_best, best)

    def _step_for(self, gpu: GpuState, added: Occupant | None, removed: Occupant | None) -> Step:
        """The step the GPU's change (see :meth:`_refresh`) takes from its current state."""
        old_key = gpu.key
        group = gpu.group
        # With ``track_states`` the GPU's group is its state: steps are kept there, found
        # without hashing the state key.
        if group is not None and added is not None:
            step = group.adds.get(id(added))
            if step is None:
                step = self._step(gpu, added)
                group.adds[id(added)] = step
                self._group_steps += 1
            if step.overlaps:
                gpu.disjoint = False
            return step
        if group is not None and removed is not None and gpu.disjoint:
            step = group.releases.get(id(removed))
            if step is None:
                step = self._step(gpu, None, removed)
                group.releases[id(removed)] = step
                self._group_steps += 1
            return step
        if added is not None:
            step_key: tuple[StateKey, object] = (old_key, id(added))
            step = self._steps.get(step_key)
            if step is None:
                step = self._step(gpu, added)
                self._steps[step_key] = step
            if step.overlaps:
                gpu.disjoint = False
        elif removed is not None and gpu.disjoint:
            # The new state is the old one less the occupant's slices, ``+me`` and count.
            release_key = (old_key, id(removed))
            step = self._release_steps.get(release_key)
            if step is None:
                step = self._step(gpu, None, removed)
                self._release_steps[release_key] = step
        else:
            new_key = gpu.derived_key()
            step_key = (old_key, new_key)
            step = self._steps.get(step_key)
            if step is None:
                step = self._step(gpu, None)
                self._steps[step_key] = step
            gpu.disjoint = gpu.occupants_disjoint()
        return step

    def _step(self, gpu: GpuState, added: Occupant | None, removed: Occupant | None = None) -> Step:
        """Work out a step the long way, from the GPU as it is now (still in its old state, its
        occupants already changed); the GPU's derived fields are left in the new state."""
        if len(self._steps) + len(self._release_steps) + self._group_steps >= MAX_STEPS:
            self._drop_steps()
        old_caps, old_levels, old_key = gpu.caps, gpu.levels, gpu.key
        overlaps = False
        if added is not None:
            table = gpu.table
            overlaps = bool(added.mask & gpu.mask) or (
                gpu.media_taken and (added.media or added.profile in table.media_names)
            )
            gpu.add(added)
        else:
            gpu.derive()
        moved: tuple[tuple[str, int], ...] = ()
        if gpu.caps is not old_caps:
            # Capacity tuples are shared per state (``GpuTable.capacities``), so what changes
            # between two of them is worked out once per pair.
            pair = (id(old_caps), id(gpu.caps))
            cached = self._caps_diffs.get(pair)
            if cached is None:
                cached = self._caps_diffs[pair] = tuple(
                    (profile.name, new - old)
                    for profile, old, new in zip(
                        gpu.table.profiles, old_caps, gpu.caps, strict=True
                    )
                    if new != old
                )
            moved = cached
        levels = self._levels_for(gpu)
        changed: tuple[tuple[SignatureIndex, int, int], ...] = ()
        if levels is not old_levels:
            # Level vectors are interned, so the signatures whose level differs between two of
            # them are computed once per pair (ids are stable: ``_level_vectors`` holds them all).
            diff_key = (gpu.table, id(old_levels), id(levels))
            diff = self._level_diffs.get(diff_key)
            if diff is None:
                diff = tuple(
                    (sig, levels[sig.id], old_levels[sig.id])
                    for sig in self._sigs_for(gpu.table)
                    if levels[sig.id] != old_levels[sig.id]
                )
                self._level_diffs[diff_key] = diff
            changed = diff
        group = self._group_for(gpu.key) if self.track_states else None
        occupant = added if added is not None else removed
        return Step(gpu, old_key, moved, levels, changed, group, occupant, overlaps=overlaps)

    def _drop_steps(self) -> None:
        self._steps = {}
        self._release_steps = {}
        if self._group_steps:
            for group in self._states.values():
                group.adds = {}
                group.releases = {}
            self._group_steps = 0

    def _levels_for(self, gpu: GpuState) -> tuple[int, ...]:
        """The GPU's level for every indexed signature (by sig id), shared by equal GPU states.

        Equal level vectors are one object, so a change that moves no level costs one identity test.
        """
        key = gpu.key
        levels = self._level_cache.get(key)
        if levels is None:
            computed = [-1] * len(self._sig_list)
            for sig in self._sigs_for(gpu.table):
                computed[sig.id] = gpu.level(sig.signature, graded=self.track_levels)
            levels = self._intern(tuple(computed))
            self._level_cache[key] = levels
        return levels

    def _intern(self, levels: tuple[int, ...]) -> tuple[int, ...]:
        return self._level_vectors.setdefault(levels, levels)

    # ----------------------------------------------------------------------------- signatures

    def _sigs_for(self, table: GpuTable) -> list[SignatureIndex]:
        sigs = self._sigs_by_table.get(table)
        if sigs is None:
            sigs = [s for s in self._sig_list if _relevant(table, s.signature)]
            self._sigs_by_table[table] = sigs
        return sigs

    def index(self, signature: Signature) -> SignatureIndex | None:
        """The index of ``signature``, built on first use; ``None`` past the multi-profile bound."""
        sig = self._signatures.get(signature)
        if sig is not None:
            return sig
        multi = len(signature) > 1 or signature[0][1] > 1
        if multi and self._multi >= MAX_MULTI_SIGNATURES:
            return None
        self._multi += multi
        sig = SignatureIndex(signature, len(self._sig_list))
        self._signatures[signature] = sig
        self._sig_list.append(sig)
        for table, sigs in self._sigs_by_table.items():
            if _relevant(table, signature):
                sigs.append(sig)
        graded = self.track_levels
        # Cached level lists are one entry short now; extend each once and keep it shared.
        self._level_cache = {}
        self._level_vectors = {}
        self._level_diffs = {}
        self._drop_steps()
        for node in self._nodes.values():
            best = -1
            fits = 0
            for gpu in node.gpus:
                key = gpu.key
                levels = self._level_cache.get(key)
                if levels is None:
                    level = (
                        gpu.level(signature, graded=graded)
                        if _relevant(gpu.table, signature)
                        else -1
                    )
                    levels = self._intern((*gpu.levels, level))
                    self._level_cache[key] = levels
                gpu.levels = levels
                level = levels[sig.id]
                if level >= 0:
                    fits += 1
                    if best < 0 or level < best:
                        best = level
            if best >= 0:
                node.best[sig.id] = best
                node.fitting[sig.id] = fits
                if not self._ranks_dirty:
                    sig.add(node.rank, best, graded=graded)
        return sig

    # ----------------------------------------------------------------------------- queries

    def node(self, name: str) -> NodeState:
        try:
            return self._nodes[name]
        except KeyError:
            raise NotFoundError(f"node {name!r} is not in the placement inventory") from None

    def node_at(self, rank: int) -> NodeState | None:
        return self._by_rank[rank] if 0 <= rank < len(self._by_rank) else None

    @property
    def node_count(self) -> int:
        return len(self._nodes)

    def nodes(self) -> Iterator[NodeState]:
        """Every node, in name order."""
        self.ensure_ranked()
        return (n for n in self._by_rank if n is not None)

    def gpu_states(self) -> Iterator[tuple[StateKey, Iterable[GpuState]]]:
        """Each distinct GPU state with the GPUs in it (``track_states`` only; else nothing)."""
        return ((group.key, group.gpus) for group in self._live)

    def state_groups(self) -> Iterable[StateGroup]:
        """Each distinct GPU state as its group (``track_states`` only; else nothing)."""
        return self._live.keys()

    def state_buckets(self, name: Hashable, bucket_of: Callable[[StateGroup], int]) -> Buckets:
        """The live state groups by their bucket (``track_states`` only), kept up to date from the
        first call for ``name`` on, as states gain their first or lose their last GPU, so a
        decision reads buckets instead of regrouping the states.

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

    def shapes(self) -> Iterator[tuple[tuple[GpuTable, ...], str]]:
        """Each distinct node shape (its GPUs' tables) with one node of that shape."""
        for shape, names in self._shapes.items():
            yield shape, next(iter(names))

    def published_gpus(self, profile: str) -> int:
        """How many GPUs publish at least one device of ``profile``."""
        return self._published_gpus.get(profile, 0)

    def free_instances(self, profile: str) -> int:
        """Instances of ``profile`` that could still be created, counted per GPU for that profile
        alone (a GPU with 3 free slices counts 3 for 1g.5gb and 1 for 2g.10gb)."""
        return self._free_instances.get(profile, 0)

    @property
    def free_instance_counts(self) -> Mapping[str, int]:
        """:meth:`free_instances` of every profile ever published, as a live read-only mapping."""
        return self._free_instances

    def profile_slices(self, profile: str) -> tuple[int, int]:
        """Fewest and most memory slices ``profile`` takes on any GPU model ever published."""
        return self._min_slices.get(profile, 0), self._max_slices.get(profile, 0)

    def profile_names(self) -> tuple[str, ...]:
        """Profiles published by at least one GPU, sorted."""
        return tuple(sorted(name for name, n in self._published_gpus.items() if n > 0))

    def index_snapshot(self) -> dict[Signature, dict[str, int]]:
        """Per indexed signature, node name -> best level, read back from the rank sets.

        For tests and debugging: equal snapshots mean equal indexes, whatever the history.
        """
        self.ensure_ranked()
        snapshot: dict[Signature, dict[str, int]] = {}
        for sig in self._sig_list:
            members: dict[str, int] = {}
            if self.track_levels:
                for level in sig.level_set:
                    for rank in sig.tiers[level]:
                        members[self._name_at(rank)] = level
            else:
                members = {self._name_at(rank): 0 for rank in sig.any}
            if set(members) != {self._name_at(rank) for rank in sig.any}:
                raise AssertionError(f"level tiers and 'any' disagree for {sig.signature}")
            snapshot[sig.signature] = members
        return snapshot

    def _name_at(self, rank: int) -> str:
        node = self.node_at(rank)
        if node is None:
            raise AssertionError(f"rank {rank} is indexed but holds no node")
        return node.name

    def gpu(self, node: str, gpu_index: int) -> GpuState:
        gpu = self._gpus.get((node, gpu_index))
        if gpu is not None:
            return gpu
        self.node(node)  # NotFoundError naming the node if it is the node that is unknown
        raise NotFoundError(f"node {node!r} has no GPU {gpu_index} in the placement inventory")


def _relevant(table: GpuTable, signature: Signature) -> bool:
    return all(name in table.profile_by_name for name, _ in signature)
