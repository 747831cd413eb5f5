"""The signature indexes: for each signature, the nodes with a GPU that can take it now.

A *signature* is a multiset of profiles that must fit on one GPU (e.g. ``1g.5gb`` or
``2 x 1g.5gb + 2g.10gb``). Its index is a rank set of the nodes that have a GPU able to take it
(ranks: see ``driver.placement.registry``). Graded (for the fragmentation-aware policy), each
signature also files every node under its best GPU's *level* — the free placements that fitting the
signature there would destroy, then how full the GPU is — so "the node whose GPU loses least" is a
successor query too. Signatures are indexed on first use; single-profile ones always, multi-profile
ones up to a bound.

Each GPU holds its level for every indexed signature (``GpuState.levels``) and each node its best
level (``NodeState.best``); level vectors are shared by equal GPU states, so what one change to a
GPU moves in the indexes is worked out once per pair of vectors.
"""

from collections.abc import Iterable

from driver.placement.state import GpuState, NodeState, SignatureIndex, StateKey
from driver.placement.tables import GpuTable, Signature

MAX_MULTI_SIGNATURES = 64
"""Multi-profile signatures indexed at most; later ones fall back to per-profile conditions."""

LevelChanges = tuple[tuple[SignatureIndex, int, int], ...]
"""The signatures whose level one GPU change moves, as ``(index, new level, old level)``."""


class SignatureIndexes:
    """Every indexed signature's rank sets, and the GPUs' level vectors they are filed from.

    ``graded`` files nodes by level too (needed by ``bestfit``; ``firstfit`` only needs to know
    which nodes can fit, which is cheaper to maintain)."""

    def __init__(self, *, graded: bool) -> None:
        self.graded = graded
        self._by_signature: dict[Signature, SignatureIndex] = {}
        self._by_id: list[SignatureIndex] = []
        self._multi = 0
        self._by_table: dict[GpuTable, list[SignatureIndex]] = {}
        self._level_cache: dict[StateKey, tuple[int, ...]] = {}
        self._level_vectors: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._level_diffs: dict[tuple[GpuTable, int, int], LevelChanges] = {}

    def find(self, signature: Signature) -> SignatureIndex | None:
        """The index of ``signature`` if it is indexed already."""
        return self._by_signature.get(signature)

    def add(
        self, signature: Signature, nodes: Iterable[NodeState], *, ranked: bool
    ) -> SignatureIndex | None:
        """Index a new signature over ``nodes`` (every node; filed in the rank sets if ``ranked``);
        ``None`` past the multi-profile bound. Every GPU's level vector grows by one."""
        multi = len(signature) > 1 or signature[0][1] > 1
        if multi and self._multi >= MAX_MULTI_SIGNATURES:
            return None
        self._multi += multi
        sig = SignatureIndex(signature, len(self._by_id))
        self._by_signature[signature] = sig
        self._by_id.append(sig)
        for table, sigs in self._by_table.items():
            if _relevant(table, signature):
                sigs.append(sig)
        graded = self.graded
        # Cached level lists are one entry short now; extend each once and keep it shared.
        self._level_cache = {}
        self._level_vectors = {}
        self._level_diffs = {}
        for node in nodes:
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
                if ranked:
                    sig.add(node.rank, best, graded=graded)
        return sig

    # ----------------------------------------------------------------------------- levels

    def levels_for(self, gpu: GpuState) -> tuple[int, ...]:
        """The GPU's level for every indexed signature (by sig id), shared by equal GPU states.

        Equal level vectors are one object, so a change that moves no level costs one identity test.
        """
        key = gpu.key
        levels = self._level_cache.get(key)
        if levels is None:
            computed = [-1] * len(self._by_id)
            for sig in self._for_table(gpu.table):
                computed[sig.id] = gpu.level(sig.signature, graded=self.graded)
            levels = self._intern(tuple(computed))
            self._level_cache[key] = levels
        return levels

    def changes(self, table: GpuTable, old: tuple[int, ...], new: tuple[int, ...]) -> LevelChanges:
        """The signatures whose level differs between two level vectors of ``table``'s GPUs.

        Level vectors are interned, so this is computed once per pair (ids are stable: the
        interned vectors are all held)."""
        key = (table, id(old), id(new))
        diff = self._level_diffs.get(key)
        if diff is None:
            diff = tuple(
                (sig, new[sig.id], old[sig.id])
                for sig in self._for_table(table)
                if new[sig.id] != old[sig.id]
            )
            self._level_diffs[key] = diff
        return diff

    def _intern(self, levels: tuple[int, ...]) -> tuple[int, ...]:
        return self._level_vectors.setdefault(levels, levels)

    def _for_table(self, table: GpuTable) -> list[SignatureIndex]:
        sigs = self._by_table.get(table)
        if sigs is None:
            sigs = [s for s in self._by_id if _relevant(table, s.signature)]
            self._by_table[table] = sigs
        return sigs

    # ----------------------------------------------------------------------------- filing

    def grade(self, node: NodeState) -> None:
        """Work out a new node's best levels and fitting GPUs from its GPUs' levels."""
        for gpu in node.gpus:
            for sig in self._for_table(gpu.table):
                level = gpu.levels[sig.id]
                if level >= 0:
                    node.fitting[sig.id] = node.fitting.get(sig.id, 0) + 1
                    best = node.best.get(sig.id, -1)
                    if best < 0 or level < best:
                        node.best[sig.id] = level

    def file(self, node: NodeState) -> None:
        """Put a ranked node in the rank sets of the signatures it can take."""
        for sig_id, level in node.best.items():
            self._by_id[sig_id].add(node.rank, level, graded=self.graded)

    def unfile(self, node: NodeState) -> None:
        """Take a ranked node out of every rank set (it is going)."""
        for sig_id, level in node.best.items():
            self._by_id[sig_id].discard(node.rank, level, graded=self.graded)

    def refile(self, ordered: Iterable[NodeState]) -> None:
        """Build every rank set again from the nodes (just ranked again)."""
        for sig in self._by_id:
            sig.clear()
        for node in ordered:
            self.file(node)

    def refit(self, node: NodeState, changed: LevelChanges, *, ranked: bool) -> None:
        """The node's index entries after one GPU's levels changed, not graded.

        Every level that fits is 0: the node is in a signature's index while it counts a GPU
        that fits (``NodeState.fitting``), so no change needs a scan of its GPUs."""
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
                if ranked:
                    sig.any.add(rank)  # ``SignatureIndex.add`` without levels
            else:
                count = fitting[sig_id] - 1
                fitting[sig_id] = count
                if count:
                    continue
                del node_best[sig_id]
                if ranked:
                    sig.any.discard(rank)

    def regrade(self, node: NodeState, changed: LevelChanges, *, ranked: bool) -> None:
        """The node's best levels and index tiers after one GPU's levels changed, graded."""
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
            if not ranked:
                continue
            if old_best < 0:
                sig.add(rank, best, graded=True)
            elif best < 0:
                sig.discard(rank, old_best, graded=True)
            else:
                sig.move(rank, old_best, best)

    # ----------------------------------------------------------------------------- reading back

    def members(self) -> Iterable[tuple[Signature, dict[int, int]]]:
        """Per indexed signature, rank -> best level, read back from its rank sets (0 for every
        member when not graded); ``AssertionError`` if its tiers and its members disagree."""
        for sig in self._by_id:
            if self.graded:
                members = {rank: level for level in sig.level_set for rank in sig.tiers[level]}
            else:
                members = dict.fromkeys(sig.any, 0)
            if set(members) != set(sig.any):
                raise AssertionError(f"level tiers and 'any' disagree for {sig.signature}")
            yield sig.signature, members


def _relevant(table: GpuTable, signature: Signature) -> bool:
    return all(name in table.profile_by_name for name, _ in signature)
