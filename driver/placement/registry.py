"""The nodes the placement engine knows: what each publishes, its GPUs, its rank, and totals.

A node's *rank* is its position in node-name order; the signature indexes file nodes by rank, so
"the first node in name order that can take a 3g.20gb" is a successor query. A node added in name
order takes the next rank; one that sorts before a known node leaves the ranks stale until
:meth:`Registry.rerank` (once per decision, however many were added). Per profile the registry
keeps how many GPUs publish it, the memory slices it takes, and how many instances of it could
still be created (its GPUs' capacities, which the inventory moves as occupancy changes them).
"""

import logging
from collections.abc import Iterator

from driver.errors import NotFoundError
from driver.placement.occupancy import Occupancy
from driver.placement.state import GpuState, NodeSpec, NodeState
from driver.placement.tables import GpuTable

logger = logging.getLogger(__name__)


class Registry:
    """Nodes by name and by rank, their GPUs by (node, index), and per-profile totals."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeState] = {}
        self._gpus: dict[tuple[str, int], GpuState] = {}
        self._by_rank: list[NodeState | None] = []
        self.ranks_stale = False
        """A node was added out of name order: ranks (and the rank sets) wait for :meth:`rerank`."""
        self._shapes: dict[tuple[GpuTable, ...], dict[str, None]] = {}
        """Node names per shape (dict as an insertion-ordered set: the first is the representative)."""
        self._published_gpus: dict[str, int] = {}
        self.free_instance_counts: dict[str, int] = {}
        """:meth:`free_instances` of every profile ever published; the inventory moves them as
        occupancy changes its GPUs' capacities (callers other than the inventory only read it)."""
        self._min_slices: dict[str, int] = {}
        self._max_slices: dict[str, int] = {}

    # ----------------------------------------------------------------------------- changes

    def add(self, spec: NodeSpec, occupancy: Occupancy) -> NodeState:
        """Register a node not known yet; its GPUs derive their state from ``occupancy``.

        The node is not ranked yet (see :meth:`rank`)."""
        node = NodeState(spec)
        gpus = tuple(
            GpuState(node, gpu_spec, occupancy.held(spec.name, gpu_spec.index))
            for gpu_spec in sorted(spec.gpus, key=lambda g: g.index)
        )
        node.gpus = gpus
        node.shape = tuple(g.table for g in gpus)
        self._nodes[spec.name] = node
        self._shapes.setdefault(node.shape, {})[spec.name] = None
        for gpu in gpus:
            self._gpus[(spec.name, gpu.index)] = gpu
            for profile, cap in zip(gpu.table.profiles, gpu.caps, strict=True):
                name = profile.name
                self._published_gpus[name] = self._published_gpus.get(name, 0) + 1
                self.free_instance_counts[name] = self.free_instance_counts.get(name, 0) + cap
                size = profile.profile.memory_slices
                self._min_slices[name] = min(self._min_slices.get(name, size), size)
                self._max_slices[name] = max(self._max_slices.get(name, size), size)
        return node

    def rank(self, node: NodeState, *, reuse: int = -1) -> bool:
        """Give a node just added its rank (``reuse``: the rank of the node it replaces, if any);
        whether the ranks are current (else the node waits for :meth:`rerank`)."""
        if self.ranks_stale:
            return False
        if reuse >= 0:
            node.rank = reuse
            self._by_rank[reuse] = node
            return True
        last = self._last_ranked()
        if last is not None and last.name > node.name:
            self.ranks_stale = True
            return False
        node.rank = len(self._by_rank)
        self._by_rank.append(node)
        return True

    def remove(self, name: str) -> NodeState | None:
        """Forget a node (its occupancy is kept) and answer it; ``None`` if it was not known.

        Its rank is freed; the ranks stay current only if the node had one."""
        node = self._nodes.pop(name, None)
        if node is None:
            return None
        shape_nodes = self._shapes[node.shape]
        del shape_nodes[name]
        if not shape_nodes:
            del self._shapes[node.shape]
        for gpu in node.gpus:
            del self._gpus[(name, gpu.index)]
            for profile, cap in zip(gpu.table.profiles, gpu.caps, strict=True):
                self._published_gpus[profile.name] -= 1
                self.free_instance_counts[profile.name] -= cap
        if not self.ranks_stale and node.rank >= 0:
            self._by_rank[node.rank] = None
        else:
            self.ranks_stale = True
        return node

    def rerank(self) -> list[NodeState]:
        """Rank every node in name order again (ranks were stale) and answer them in that order."""
        ordered = sorted(self._nodes.values(), key=lambda n: n.name)
        self._by_rank = list(ordered)
        for rank, node in enumerate(ordered):
            node.rank = rank
        self.ranks_stale = False
        logger.debug("re-ranked %s nodes", len(ordered))
        return ordered

    def _last_ranked(self) -> NodeState | None:
        while self._by_rank and self._by_rank[-1] is None:
            self._by_rank.pop()
        return self._by_rank[-1] if self._by_rank else None

    # ----------------------------------------------------------------------------- queries

    def get(self, name: str) -> NodeState | None:
        return self._nodes.get(name)

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

    def all_nodes(self) -> Iterator[NodeState]:
        """Every node, in no particular order (ranks may be stale)."""
        return iter(self._nodes.values())

    def ranked_nodes(self) -> Iterator[NodeState]:
        """Every node, in rank order (name order once the ranks are current)."""
        return (n for n in self._by_rank if n is not None)

    def find_gpu(self, node: str, gpu_index: int) -> GpuState | None:
        return self._gpus.get((node, gpu_index))

    def gpu(self, node: str, gpu_index: int) -> GpuState:
        gpu = self._gpus.get((node, gpu_index))
        if gpu is not None:
            return gpu
        self.node(node)  # NotFoundError naming the node if it is the node that is unknown
        raise NotFoundError(f"node {node!r} has no GPU {gpu_index} in the placement inventory")

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
        return self.free_instance_counts.get(profile, 0)

    def profile_slices(self, profile: str) -> tuple[int, int]:
        """Fewest and most memory slices ``profile`` takes on any GPU model ever published."""
        return self._min_slices.get(profile, 0), self._max_slices.get(profile, 0)

    def profile_names(self) -> tuple[str, ...]:
        """Profiles published by at least one GPU, sorted."""
        return tuple(sorted(name for name, n in self._published_gpus.items() if n > 0))
