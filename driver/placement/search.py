"""Placing every device of one pod on one node: a depth-first search with backtracking.

The policy decides the order devices are placed in and the order candidate (GPU, profile, start)
triples are tried; the search enforces the rules — no memory-slice overlap, one ``+me`` per GPU,
``max_count``, published devices only, predicates, and the pod's match/distinct constraints — and
backtracks when a choice leaves a later device nowhere to go. It is complete: when it says "no", no
assignment exists on that node. Devices of one request are interchangeable, so a state reached by
a permutation of earlier choices is pruned once it has failed.
"""

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from driver.placement.request import (
    AttributeKey,
    DeviceAssignment,
    DeviceRef,
    DistinctAttribute,
    MatchAttribute,
    PodRequest,
)
from driver.placement.tables import GpuTable, Signature, TableProfile, signature_of

if TYPE_CHECKING:
    from driver.placement.state import NodeState

Candidate = tuple[int, TableProfile, int]
"""(GPU position on the node, profile, index into the profile's placements)."""


class Plan:
    """A pod request digested once per decision: device slots, groups, per-table profile lists."""

    __slots__ = (
        "_profiles",
        "device_requests",
        "distinct_groups",
        "distinct_of",
        "gpu_components",
        "gpu_group",
        "key_constraints",
        "keys_of",
        "pod",
        "requests",
        "single",
    )

    def __init__(self, pod: PodRequest) -> None:
        self.pod = pod
        self.requests = pod.requests
        count = len(pod.requests)
        index_of = {r.name: i for i, r in enumerate(pod.requests)}
        parent = list(range(count))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        pinned = [False] * count
        distinct_groups: list[tuple[int, ...]] = []
        keys: list[tuple[tuple[int, ...], AttributeKey, bool]] = []
        for constraint in pod.constraints:
            members = tuple(
                sorted(index_of[n] for n in constraint.requests)
                if constraint.requests
                else range(count)
            )
            if constraint.key is None and isinstance(constraint, MatchAttribute):
                for i in members:
                    pinned[i] = True
                    parent[find(i)] = find(members[0])
            elif constraint.key is None:
                distinct_groups.append(members)
            else:
                keys.append((members, constraint.key, isinstance(constraint, DistinctAttribute)))
        self.gpu_group = tuple(find(i) if pinned[i] else -1 for i in range(count))
        components: dict[int, list[int]] = {}
        for i, root in enumerate(self.gpu_group):
            if root >= 0:
                components.setdefault(root, []).append(i)
        self.gpu_components = tuple(tuple(c) for c in components.values())
        self.distinct_groups = tuple(distinct_groups)
        self.distinct_of = tuple(
            tuple(g for g, members in enumerate(distinct_groups) if i in members)
            for i in range(count)
        )
        self.key_constraints = tuple(keys)
        self.keys_of = tuple(
            tuple(k for k, (members, _, _) in enumerate(keys) if i in members) for i in range(count)
        )
        self.device_requests = tuple(
            i for i, request in enumerate(pod.requests) for _ in range(request.count)
        )
        self._profiles: dict[tuple[int, GpuTable], tuple[TableProfile, ...]] = {}
        self.single = (
            len(self.device_requests) == 1
            and not pod.constraints
            and pod.requests[0].predicate is None
        )
        """One device, no constraints, no predicate: the first free candidate under ``max_count``
        is the answer, so the search needs none of its backtracking state."""

    def profiles_for(self, request: int, table: GpuTable) -> tuple[TableProfile, ...]:
        """The request's acceptable profiles that ``table`` publishes, in the model's order."""
        key = (request, table)
        found = self._profiles.get(key)
        if found is None:
            wanted = self.requests[request].profiles
            found = tuple(p for p in table.profiles if p.name in wanted)
            self._profiles[key] = found
        return found

    def component_signature(self, component: Sequence[int]) -> Signature | None:
        """The one-GPU signature of a same-GPU component, if each request names one profile."""
        pairs = []
        for i in component:
            request = self.requests[i]
            if len(request.profiles) != 1:
                return None
            pairs.append((next(iter(request.profiles)), request.count))
        return signature_of(pairs)

    def geometry_key(self) -> Hashable:
        """What the empty-cluster verdict depends on (predicates deliberately left out)."""
        return (
            tuple((r.profiles, r.count) for r in self.requests),
            self.gpu_group,
            self.distinct_groups,
            tuple((m, id(k), d) for m, k, d in self.key_constraints),
        )


_ASSIGNED_LIMIT = 4096
"""One-device answers remembered per node (``NodeState.assigned``) before they are forgotten."""


class SearchBudgetExceededError(Exception):
    """The node's search took more steps than allowed; the node is treated as not fitting."""


class CandidateOrder(Protocol):
    """The policy's half of the search (see ``driver.placement.policies``)."""

    def device_order(self, plan: Plan, node: "NodeState") -> Sequence[int]:
        """Device slots (indexes into ``plan.device_requests``) in the order to place them."""
        ...

    def candidates(
        self, search: "NodeSearch", request: int, positions: Sequence[int]
    ) -> Iterable[Candidate]:
        """Free candidates for one device of ``request`` on GPUs at ``positions``, best first."""
        ...


class NodeSearch:
    """One node's search state: copies of its GPUs' masks, mutated and restored while searching."""

    def __init__(
        self,
        plan: Plan,
        node: "NodeState",
        order: CandidateOrder,
        *,
        budget: int,
        empty: bool = False,
        use_predicates: bool = True,
    ) -> None:
        self.plan = plan
        self.node = node
        self.gpus = node.gpus
        self._masks: list[int] | None = None
        self._media: list[bool] | None = None
        self._empty = empty
        self._order = order
        self._budget = budget
        self._use_predicates = use_predicates
        self.steps = 0
        self.predicate_rejections = 0
        self._added: dict[tuple[int, int], int] = {}
        self._refs: dict[tuple[int, int, int], DeviceRef] = {}
        if plan.single:
            return
        self._slots = tuple(order.device_order(plan, node))
        self._group_gpu: dict[int, list[int]] = {}
        self._distinct_used: list[dict[int, int]] = [{} for _ in plan.distinct_groups]
        self._key_state: list[dict[Hashable, int]] = [{} for _ in plan.key_constraints]
        self._per_request: list[list[tuple[int, int, int]]] = [[] for _ in plan.requests]
        self._chosen: dict[int, Candidate] = {}
        self._failed: set[Hashable] = set()
        self._predicate_cache: dict[tuple[int, int, int, int], bool] = {}
        self._memo = len(self._slots) > 1

    @property
    def masks(self) -> list[int]:
        """Each GPU's occupied memory slices as this search has them (its own placements
        included), by position; built on first use (scarcity's one-device path never asks)."""
        masks = self._masks
        if masks is None:
            gpus = self.gpus
            masks = self._masks = [0] * len(gpus) if self._empty else [g.mask for g in gpus]
        return masks

    @property
    def media(self) -> list[bool]:
        """Whether each GPU's ``+me`` engine is taken, as :attr:`masks` (built on first use)."""
        media = self._media
        if media is None:
            gpus = self.gpus
            media = self._media = (
                [False] * len(gpus) if self._empty else [g.media_taken for g in gpus]
            )
        return media

    def run(self) -> tuple[DeviceAssignment, ...] | None:
        """Every device placed on this node, in request order; ``None`` if impossible."""
        if self.plan.single:
            return self._run_single()
        if not self._place(0):
            return None
        node = self.node.name
        result = []
        for slot in range(len(self.plan.device_requests)):
            position, profile, i = self._chosen[slot]
            placement = profile.placements[i]
            result.append(
                DeviceAssignment(
                    request=self.plan.requests[self.plan.device_requests[slot]].name,
                    node=node,
                    gpu_index=self.gpus[position].index,
                    profile=profile.name,
                    start=placement.start,
                    size=placement.size,
                    media=profile.media,
                )
            )
        return tuple(result)

    def _run_single(self) -> tuple[DeviceAssignment, ...] | None:
        """:meth:`run` for a :attr:`Plan.single` plan: the same answer (and steps), no state."""
        plan = self.plan
        request = plan.device_requests[0]
        gpus = self.gpus
        empty = self._empty
        assigned = self.node.assigned
        for position, profile, i in self._order.candidates(self, request, range(len(gpus))):
            self.steps += 1
            if self.steps > self._budget:
                raise SearchBudgetExceededError
            count = 0 if empty else gpus[position].counts[profile.index]
            if count >= profile.profile.max_count:
                continue
            name = plan.requests[request].name
            key = (name, position, profile.index, i)
            found = assigned.get(key)
            if found is None:
                if len(assigned) >= _ASSIGNED_LIMIT:
                    assigned.clear()
                placement = profile.placements[i]
                found = assigned[key] = (
                    DeviceAssignment(
                        request=name,
                        node=self.node.name,
                        gpu_index=self.gpus[position].index,
                        profile=profile.name,
                        start=placement.start,
                        size=placement.size,
                        media=profile.media,
                    ),
                )
            return found
        return None

    def positions(self, request: int) -> Sequence[int]:
        """GPU positions the request's next device may use under the GPU constraints."""
        group = self.plan.gpu_group[request]
        base: Sequence[int] = range(len(self.gpus))
        if group >= 0:
            pinned = self._group_gpu.get(group)
            if pinned is not None:
                base = (pinned[0],)
        distinct = self.plan.distinct_of[request]
        if not distinct:
            return base
        return [p for p in base if not any(self._distinct_used[g].get(p) for g in distinct)]

    @property
    def untouched(self) -> bool:
        """Every GPU's mask, ``+me`` and counts here are its current state (nothing placed by this
        search yet, not searching an empty node), so state-keyed caches apply."""
        return not self._empty and not self._added

    def counts(self, position: int) -> tuple[int, ...]:
        """Instances of each table profile on the GPU at ``position``, this search's included."""
        gpu = self.gpus[position]
        base = (0,) * len(gpu.table.profiles) if self._empty else gpu.counts
        if not self._added:
            return base
        counts = list(base)
        for (at, profile), added in self._added.items():
            if at == position:
                counts[profile] += added
        return tuple(counts)

    def ref(self, position: int, profile: TableProfile, i: int) -> DeviceRef:
        key = (position, profile.index, i)
        ref = self._refs.get(key)
        if ref is None:
            gpu = self.gpus[position]
            ref = DeviceRef(
                node=self.node.name,
                gpu_index=gpu.index,
                gpu_uuid=gpu.spec.uuid,
                model=gpu.spec.model,
                profile=profile.profile,
                start=profile.placements[i].start,
            )
            self._refs[key] = ref
        return ref

    def _memo_key(self, depth: int) -> Hashable:
        return (depth, tuple(tuple(sorted(chosen)) for chosen in self._per_request))

    def _place(self, depth: int) -> bool:
        if depth == len(self._slots):
            return True
        if self._memo:
            key = self._memo_key(depth)
            if key in self._failed:
                return False
        slot = self._slots[depth]
        request = self.plan.device_requests[slot]
        for candidate in self._order.candidates(self, request, self.positions(request)):
            self.steps += 1
            if self.steps > self._budget:
                raise SearchBudgetExceededError
            if not self._admissible(request, candidate):
                continue
            undo = self._apply(slot, request, candidate)
            if self._place(depth + 1):
                return True
            undo()
        if self._memo:
            self._failed.add(key)
        return False

    def _admissible(self, request: int, candidate: Candidate) -> bool:
        position, profile, i = candidate
        count = self._added.get((position, profile.index), 0)
        if not self._empty:
            count += self.gpus[position].counts[profile.index]
        if count >= profile.profile.max_count:
            return False
        predicate = self.plan.requests[request].predicate
        if predicate is not None and self._use_predicates:
            cache_key = (request, position, profile.index, i)
            verdict = self._predicate_cache.get(cache_key)
            if verdict is None:
                verdict = bool(predicate(self.ref(position, profile, i)))
                self._predicate_cache[cache_key] = verdict
                if not verdict:
                    self.predicate_rejections += 1
            if not verdict:
                return False
        for k in self.plan.keys_of[request]:
            _, key_fn, distinct = self.plan.key_constraints[k]
            value = key_fn(self.ref(position, profile, i))
            state = self._key_state[k]
            if distinct and state.get(value):
                return False
            if not distinct and state and value not in state:
                return False
        return True

    def _apply(self, slot: int, request: int, candidate: Candidate) -> Callable[[], None]:
        position, profile, i = candidate
        old_mask, old_media = self.masks[position], self.media[position]
        self.masks[position] = old_mask | profile.masks[i]
        self.media[position] = old_media or profile.media
        added = (position, profile.index)
        self._added[added] = self._added.get(added, 0) + 1
        group = self.plan.gpu_group[request]
        if group >= 0:
            pinned = self._group_gpu.setdefault(group, [position, 0])
            pinned[1] += 1
        for g in self.plan.distinct_of[request]:
            used = self._distinct_used[g]
            used[position] = used.get(position, 0) + 1
        values: list[tuple[int, Hashable]] = []
        for k in self.plan.keys_of[request]:
            value = self.plan.key_constraints[k][1](self.ref(position, profile, i))
            state = self._key_state[k]
            state[value] = state.get(value, 0) + 1
            values.append((k, value))
        chosen = (position, profile.index, i)
        self._per_request[request].append(chosen)
        self._chosen[slot] = candidate

        def undo() -> None:
            self.masks[position], self.media[position] = old_mask, old_media
            self._added[added] -= 1
            if group >= 0:
                pinned = self._group_gpu[group]
                pinned[1] -= 1
                if not pinned[1]:
                    del self._group_gpu[group]
            for g in self.plan.distinct_of[request]:
                self._distinct_used[g][position] -= 1
            for k, value in values:
                state = self._key_state[k]
                state[value] -= 1
                if not state[value]:
                    del state[value]
            self._per_request[request].remove(chosen)
            del self._chosen[slot]

        return undo
