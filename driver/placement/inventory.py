"""The cluster as the placement engine sees it: nodes, what is taken, and the indexes over both.

Four parts, each in its own module: the registry of nodes and their GPUs
(``driver.placement.registry``), the occupancy — what is taken per (node, GPU index), recorded even
before the node is known (``driver.placement.occupancy``) — and two index families, the signature
indexes (``driver.placement.signatures``) and the GPU state groups with their buckets
(``driver.placement.groups``). :class:`Inventory` composes them: each change goes to every part it
concerns, and what one change to a GPU does to its state and the indexes is a cached step
(``driver.placement.steps``). Every change updates the indexes in place — nothing here ever scans
the cluster for a decision.
"""

from collections.abc import Iterable, Iterator

from driver.placement.groups import StateGroups
from driver.placement.occupancy import OCCUPANT_CACHE_LIMIT, Occupancy
from driver.placement.registry import Registry
from driver.placement.request import DeviceAssignment
from driver.placement.signatures import SignatureIndexes
from driver.placement.state import (
    GpuState,
    NodeSpec,
    NodeState,
    Occupant,
    SignatureIndex,
    StateGroup,
    StateKey,
)
from driver.placement.steps import Steps
from driver.placement.tables import Signature


class Inventory:
    """Registry, occupancy and indexes, kept consistent. Not thread-safe: serialise callers.

    ``track_levels`` grades the signature indexes by level (needed by ``bestfit``). ``track_states``
    groups GPUs by state (needed by ``scarcity``). Changes go through the inventory; the parts are
    public for reading (policies read ranks from ``registry`` and buckets from ``groups``), and the
    queries below answer what callers outside the engine ask.
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
        self.registry = Registry()
        self.occupancy = Occupancy()
        self.signatures = SignatureIndexes(graded=track_levels)
        self.groups = StateGroups(on_forget=self._forget_steps)
        self._steps = Steps(self.signatures, self.groups if track_states else None)
        self._slots: dict[int, tuple[DeviceAssignment, GpuState, Occupant]] = {}
        """Device id -> (that device, its GPU, its occupant) (:meth:`device_slot`); emptied when
        a node is set or removed (its GPUs are new objects then). Entries hold their device, so
        ids are not reused."""
        for spec in nodes:
            self.set_node(spec)

    def _forget_steps(self) -> None:
        self._steps.drop()

    # ----------------------------------------------------------------------------- nodes

    def set_node(self, spec: NodeSpec) -> None:
        """Add a node or replace what it publishes; its occupancy is kept."""
        old = self.registry.get(spec.name)
        self._slots.clear()
        rank = -1
        if old is not None:
            rank = old.rank
            self.remove_node(spec.name)
        node = self.registry.add(spec, self.occupancy)
        for gpu in node.gpus:
            gpu.levels = self.signatures.levels_for(gpu)
            if self.track_states:
                self.groups.enter(gpu)
        self.signatures.grade(node)
        if self.registry.rank(node, reuse=rank):
            self.signatures.file(node)

    def remove_node(self, name: str) -> None:
        """Forget a node's inventory (its occupancy is kept until released)."""
        node = self.registry.remove(name)
        if node is None:
            return
        self._slots.clear()
        if self.track_states:
            for gpu in node.gpus:
                self.groups.leave(gpu)
        if not self.registry.ranks_stale:  # it was ranked and the ranks are current
            self.signatures.unfile(node)

    def ensure_ranked(self) -> None:
        """Re-rank nodes in name order and rebuild the rank sets after out-of-order additions.

        Costs O(nodes x indexed signatures); it runs only when a node was added whose name does not
        sort after every known node, and at most once per decision however many were added.
        """
        if self.registry.ranks_stale:
            self.signatures.refile(self.registry.rerank())

    def index(self, signature: Signature) -> SignatureIndex | None:
        """The index of ``signature``, built on first use; ``None`` past the multi-profile bound."""
        sig = self.signatures.find(signature)
        if sig is None:
            registry = self.registry
            sig = self.signatures.add(
                signature, registry.all_nodes(), ranked=not registry.ranks_stale
            )
            if sig is not None:
                self._steps.drop()  # their level vectors are one entry short
        return sig

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
        occupant = self.occupancy.occupant(start=start, size=size, media=media, profile=profile)
        self.occupancy.occupy(node, gpu_index, occupant)
        gpu = self.registry.find_gpu(node, gpu_index)
        if gpu is not None:
            self._refresh(gpu, occupant)

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
        removed = self.occupancy.release(
            node, gpu_index, start=start, size=size, media=media, profile=profile
        )
        gpu = self.registry.find_gpu(node, gpu_index)
        if gpu is not None:
            self._refresh(gpu, removed=removed)

    def occupy_device(self, device: DeviceAssignment) -> None:
        """:meth:`occupy` of a device the engine placed (its commit), the GPU already checked free.

        A device's GPU and occupant are remembered per device object (the engine answers with
        remembered devices), so committing and releasing it again looks nothing up."""
        gpu, occupant = self.device_slot(device)
        gpu.occupants.append(occupant)
        self._refresh(gpu, occupant)

    def release_device(self, device: DeviceAssignment) -> None:
        """:meth:`release` of a device :meth:`occupy_device` recorded."""
        slot = self._slots.get(id(device))
        if slot is not None and slot[0] is device:
            _, gpu, occupant = slot
            occupants = gpu.occupants
            # Equal occupants are one object (``Occupancy.occupant``), and any equal one may go:
            # they leave the same state behind.
            for at, held in enumerate(occupants):
                if held is occupant:
                    del occupants[at]
                    self._refresh(gpu, removed=occupant)
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
        gpu = self.registry.gpu(device.node, device.gpu_index)
        occupant = self.occupancy.occupant(
            start=device.start, size=device.size, media=device.media, profile=device.profile
        )
        if len(self._slots) >= OCCUPANT_CACHE_LIMIT:
            self._slots.clear()
        self._slots[id(device)] = (device, gpu, occupant)
        return gpu, occupant

    def _refresh(
        self, gpu: GpuState, added: Occupant | None = None, *, removed: Occupant | None = None
    ) -> None:
        """Bring the GPU's state and every index up to date after its occupants changed
        (``added``: the one occupant appended since the last refresh, if that is all;
        ``removed``: the one occupant taken out since, if that is all)."""
        step = self._steps.step_for(gpu, added, removed)
        gpu.mask = step.mask
        gpu.media_taken = step.media
        gpu.counts = step.counts
        gpu.used = step.used
        gpu.caps = step.caps
        gpu.key = step.key
        if step.moves_group:
            self.groups.move(gpu, step.group)  # type: ignore[arg-type]
        if step.moved:
            free_instances = self.registry.free_instance_counts
            for name, delta in step.moved:
                free_instances[name] += delta
        gpu.levels = step.levels
        changed = step.changed
        if not changed:
            return
        ranked = not self.registry.ranks_stale
        if self.track_levels:
            self.signatures.regrade(gpu.node, changed, ranked=ranked)
        else:
            self.signatures.refit(gpu.node, changed, ranked=ranked)

    # ----------------------------------------------------------------------------- queries

    def node(self, name: str) -> NodeState:
        return self.registry.node(name)

    def nodes(self) -> Iterator[NodeState]:
        """Every node, in name order."""
        self.ensure_ranked()
        return self.registry.ranked_nodes()

    def gpu(self, node: str, gpu_index: int) -> GpuState:
        return self.registry.gpu(node, gpu_index)

    def occupants(self, node: str, gpu_index: int) -> tuple[Occupant, ...]:
        return self.occupancy.occupants(node, gpu_index)

    def published_gpus(self, profile: str) -> int:
        return self.registry.published_gpus(profile)

    def free_instances(self, profile: str) -> int:
        return self.registry.free_instances(profile)

    def profile_slices(self, profile: str) -> tuple[int, int]:
        return self.registry.profile_slices(profile)

    def profile_names(self) -> tuple[str, ...]:
        return self.registry.profile_names()

    def gpu_states(self) -> Iterator[tuple[StateKey, Iterable[GpuState]]]:
        """Each distinct GPU state with the GPUs in it (``track_states`` only; else nothing)."""
        return self.groups.gpu_states()

    def state_groups(self) -> Iterable[StateGroup]:
        """Each distinct GPU state as its group (``track_states`` only; else nothing)."""
        return self.groups.live()

    def index_snapshot(self) -> dict[Signature, dict[str, int]]:
        """Per indexed signature, node name -> best level, read back from the rank sets.

        For tests and debugging: equal snapshots mean equal indexes, whatever the history.
        """
        self.ensure_ranked()
        return {
            signature: {self._name_at(rank): level for rank, level in members.items()}
            for signature, members in self.signatures.members()
        }

    def _name_at(self, rank: int) -> str:
        node = self.registry.node_at(rank)
        if node is None:
            raise AssertionError(f"rank {rank} is indexed but holds no node")
        return node.name
