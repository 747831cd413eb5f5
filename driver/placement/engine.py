"""The placement engine: one pod request in, every device placed on one node or a reason out.

Pure and synchronous: no I/O, no clock, no Kubernetes objects. The controller keeps one engine,
feeds it inventory (``set_node``/``remove_node``) and occupancy (``occupy``/``release``) from its
informers, and for each pod calls :meth:`Engine.place`. ``place`` never changes state: the
controller then calls :meth:`Engine.commit` to reserve the devices before writing the allocation to
the API server, and :meth:`Engine.release_placed` if that write fails. The engine is not
thread-safe; the controller serialises place/commit/release (they take microseconds) and only its
API writes run concurrently.
"""

import logging
from collections.abc import Hashable

from driver.errors import PlacementError
from driver.placement.inventory import Inventory
from driver.placement.policies import DEFAULT_POLICY, Condition, Policy, policy_named
from driver.placement.request import NodeFilter, NoFit, Placed, PlacementResult, PodRequest
from driver.placement.search import NodeSearch, Plan, SearchBudgetExceededError
from driver.placement.state import NodeSpec
from driver.placement.tables import GpuTable, Signature, signature_of

logger = logging.getLogger(__name__)

DEFAULT_SEARCH_BUDGET = 20_000
"""Candidate tries per node before the search gives up on that node (a safety net: with the
symmetry pruning, pods of a few devices never come near it)."""

_EMPTY_FIT_CACHE_LIMIT = 4096
_PLAN_CACHE_LIMIT = 1024
_PLACED_CACHE_LIMIT = 4096


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _signature_text(signature: Signature) -> str:
    return " + ".join(name if count == 1 else f"{count} x {name}" for name, count in signature)


class _Stats:
    __slots__ = ("candidates", "failed", "filtered", "gave_up", "predicate_rejections")

    def __init__(self) -> None:
        self.candidates = 0
        self.filtered = 0
        self.failed = 0
        self.gave_up = 0
        self.predicate_rejections = 0


class Engine:
    """An inventory (nodes, occupancy, indexes) and a policy. See the module docstring for the
    calling protocol."""

    def __init__(
        self,
        *,
        policy: str | Policy = DEFAULT_POLICY,
        inventory: Inventory | None = None,
        search_budget: int = DEFAULT_SEARCH_BUDGET,
    ) -> None:
        self.policy: Policy = policy_named(policy) if isinstance(policy, str) else policy
        self.inventory = (
            inventory
            if inventory is not None
            else Inventory(
                track_levels=self.policy.needs_levels, track_states=self.policy.needs_states
            )
        )
        self._budget = search_budget
        self._empty_fit: dict[tuple[Hashable, tuple[GpuTable, ...]], bool] = {}
        self._plans: dict[PodRequest, tuple[int, Plan, list[Condition] | None]] = {}
        self._plans_by_id: dict[int, tuple[PodRequest, int, Plan, list[Condition] | None]] = {}
        """The same cache by the request's identity (callers reuse request objects; hashing a
        request costs more than the lookup). Entries hold their request, so ids are not reused."""
        self._placed: dict[int, Placed] = {}
        """Results by the identity of their assignments (one-device searches answer with one
        remembered tuple per device, see ``NodeState.assigned``): results are immutable, so equal
        ones are one object. Each entry holds its tuple, so ids are not reused."""
        self._epoch = 0
        """Bumped when the inventory changes what is published (cached conditions depend on it)."""

    # ------------------------------------------------------------------ state (controller feeds)

    def set_node(self, spec: NodeSpec) -> None:
        """Add a node or replace what it publishes (its occupancy is kept)."""
        self.inventory.set_node(spec)
        self._inventory_changed()

    def remove_node(self, name: str) -> None:
        """Forget a node's inventory (its occupancy is kept until released)."""
        self.inventory.remove_node(name)
        self._inventory_changed()

    def _inventory_changed(self) -> None:
        self._empty_fit.clear()
        self._epoch += 1

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
        """Mark a slice as taken (an allocated claim of ours or anyone's)."""
        self.inventory.occupy(node, gpu_index, start=start, size=size, media=media, profile=profile)

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
        """Undo one :meth:`occupy` with the same arguments."""
        self.inventory.release(
            node, gpu_index, start=start, size=size, media=media, profile=profile
        )

    def commit(self, placed: Placed) -> None:
        """Reserve every device of ``placed``; ``PlacementError`` (and nothing reserved) if any of
        them is no longer free — the result was computed on a state that has changed since."""
        inventory = self.inventory
        if len(placed.assignments) == 1:
            (a,) = placed.assignments
            gpu, occupant = inventory.device_slot(a)
            if gpu.mask & occupant.mask or (gpu.media_taken and a.media):
                raise PlacementError(
                    f"{a.profile} at start {a.start} on GPU {a.gpu_index} of node {a.node} "
                    "is no longer free; place the pod again"
                )
            inventory.occupy_device(a)
            return
        pending: dict[tuple[str, int], tuple[int, bool]] = {}
        for a in placed.assignments:
            gpu = inventory.registry.gpu(a.node, a.gpu_index)
            mask, media = pending.get((a.node, a.gpu_index), (gpu.mask, gpu.media_taken))
            new = ((1 << a.size) - 1) << a.start
            if mask & new or (media and a.media):
                raise PlacementError(
                    f"{a.profile} at start {a.start} on GPU {a.gpu_index} of node {a.node} "
                    "is no longer free; place the pod again"
                )
            pending[(a.node, a.gpu_index)] = (mask | new, media or a.media)
        for a in placed.assignments:
            inventory.occupy(
                a.node, a.gpu_index, start=a.start, size=a.size, media=a.media, profile=a.profile
            )

    def release_placed(self, placed: Placed) -> None:
        """Undo :meth:`commit` (e.g. when writing the allocation to the API server failed)."""
        for a in placed.assignments:
            self.inventory.release_device(a)

    # ------------------------------------------------------------------ queries (metrics)

    def free_instances(self, profile: str) -> int:
        """Instances of ``profile`` that could still be created across the cluster (each GPU
        counted for that profile alone)."""
        return self.inventory.free_instances(profile)

    # ------------------------------------------------------------------ the decision

    def place(self, pod: PodRequest, *, node_filter: NodeFilter | None = None) -> PlacementResult:
        """Where every device of ``pod`` goes, all on one node; or why it cannot be placed now."""
        inventory = self.inventory
        inventory.ensure_ranked()
        plan, conditions = self._plan(pod)
        # Counted in locals: a ``_Stats`` is built only for a refusal (not on every decision).
        candidates = filtered = gave_up = rejections = failed = 0
        if conditions is not None:
            for node in self.policy.nodes(inventory, plan, conditions):
                candidates += 1
                if node_filter is not None and not node_filter(node.name):
                    filtered += 1
                    continue
                search = NodeSearch(plan, node, self.policy, budget=self._budget)
                try:
                    found = search.run()
                except SearchBudgetExceededError:
                    logger.warning(
                        "placement search gave up on node %s after %s steps",
                        node.name,
                        search.steps,
                    )
                    gave_up += 1
                    continue
                finally:
                    rejections += search.predicate_rejections
                if found is not None:
                    known = self._placed.get(id(found))
                    if known is not None and known.assignments is found:
                        return known
                    if len(self._placed) >= _PLACED_CACHE_LIMIT:
                        self._placed.clear()
                    placed = self._placed[id(found)] = Placed(node=node.name, assignments=found)
                    return placed
                failed += 1
        stats = _Stats()
        stats.candidates = candidates
        stats.filtered = filtered
        stats.failed = failed
        stats.gave_up = gave_up
        stats.predicate_rejections = rejections
        return self._no_fit(plan, conditions or [], stats)

    def _plan(self, pod: PodRequest) -> tuple[Plan, list[Condition] | None]:
        """The digested request and its index conditions, cached per equal request."""
        same = self._plans_by_id.get(id(pod))
        if same is not None and same[0] is pod and same[1] == self._epoch:
            return same[2], same[3]
        cached = self._plans.get(pod)
        if cached is not None and cached[0] == self._epoch:
            plan, conditions = cached[1], cached[2]
        else:
            if len(self._plans) >= _PLAN_CACHE_LIMIT:
                self._plans.clear()
            plan = Plan(pod)
            conditions = self._conditions(plan)
            self._plans[pod] = (self._epoch, plan, conditions)
        if len(self._plans_by_id) >= _PLAN_CACHE_LIMIT:
            self._plans_by_id.clear()
        self._plans_by_id[id(pod)] = (pod, self._epoch, plan, conditions)
        return plan, conditions

    def _conditions(self, plan: Plan) -> list[Condition] | None:
        """Necessary conditions a node must meet, from the indexes; ``None`` if one is unmeetable."""
        inventory = self.inventory
        conditions: list[Condition] = []
        covered: set[int] = set()
        for component in plan.gpu_components:
            signature = plan.component_signature(component)
            index = inventory.index(signature) if signature is not None else None
            if signature is not None and index is not None:
                covered.update(component)
                slices = sum(inventory.profile_slices(n)[1] * c for n, c in signature)
                lacking = f"no GPU has room for {_signature_text(signature)}"
                if signature_of([(signature[0][0], 1)]) == signature:
                    lacking = f"no node has a free {signature[0][0]} placement"
                conditions.append(Condition(sets=(index,), lacking=lacking, slices=slices))
        for i, request in enumerate(plan.requests):
            if i in covered:
                continue
            names = sorted(request.profiles)
            if not any(inventory.published_gpus(n) for n in names):
                return None
            indexes = tuple(
                index
                for n in names
                if inventory.published_gpus(n) and (index := inventory.index(((n, 1),))) is not None
            )
            slices = max(inventory.profile_slices(n)[1] for n in names)
            if len(names) == 1:
                lacking = f"no node has a free {names[0]} placement"
            else:
                lacking = f"no node has a free placement of any of {', '.join(names)}"
            conditions.append(Condition(sets=indexes, lacking=lacking, slices=slices))
        return conditions

    # ------------------------------------------------------------------ reasons

    def _no_fit(self, plan: Plan, conditions: list[Condition], stats: _Stats) -> NoFit:
        permanent = self._permanent_reason(plan)
        if permanent is not None:
            return NoFit(reason=permanent, permanent=True)
        if stats.candidates == 0:
            lacking = [c.lacking for c in conditions if not any(s.any for s in c.sets)]
            if lacking:
                return NoFit(reason="; ".join(lacking), permanent=False)
            wanted = ", ".join(r.name for r in plan.requests)
            return NoFit(
                reason=f"no node has free placements for all of the pod's requests ({wanted}) "
                "at the same time",
                permanent=False,
            )
        parts = []
        if stats.filtered:
            parts.append(f"{_plural(stats.filtered, 'node')} excluded by the node filter")
        if stats.failed:
            together = (
                f"all {plan.pod.device_count} devices together"
                if plan.pod.device_count > 1
                else "the device"
            )
            rules = " under the pod's constraints" if plan.pod.constraints else ""
            selectors = (
                " that the request's selectors accept "
                f"({_plural(stats.predicate_rejections, 'free device')} rejected)"
                if stats.predicate_rejections
                else ""
            )
            parts.append(
                f"{_plural(stats.failed, 'node')} with free slices had no room for "
                f"{together}{rules}{selectors}"
            )
        if stats.gave_up:
            parts.append(
                f"the search gave up on {_plural(stats.gave_up, 'node')} after "
                f"{self._budget} steps each"
            )
        return NoFit(reason="no node fits the pod: " + "; ".join(parts), permanent=False)

    def _permanent_reason(self, plan: Plan) -> str | None:
        """Why the pod could not be placed even on an empty cluster of the current inventory."""
        inventory = self.inventory
        if inventory.registry.node_count == 0:
            return "the placement inventory has no nodes with MIG GPUs"
        for request in plan.requests:
            names = sorted(request.profiles)
            if not names:
                return f"request {request.name!r} accepts no MIG profile"
            if not any(inventory.published_gpus(n) for n in names):
                if len(names) == 1:
                    return f"no node publishes MIG profile {names[0]}"
                return f"no node publishes any of the MIG profiles {', '.join(names)}"
        shapes = list(inventory.registry.shapes())
        largest_gpu = max(t.slices for shape, _ in shapes for t in shape)
        for component in plan.gpu_components:
            needed = 0
            for i in component:
                request = plan.requests[i]
                smallest = min(
                    inventory.profile_slices(n)[0]
                    for n in request.profiles
                    if inventory.published_gpus(n)
                )
                needed += smallest * request.count
            if needed > largest_gpu:
                listed = ", ".join(repr(plan.requests[i].name) for i in component)
                return (
                    f"request {listed} needs {needed} memory slices on one GPU; "
                    f"the largest GPU in the cluster has {largest_gpu}"
                )
        most_gpus = max(len(shape) for shape, _ in shapes)
        for group in plan.distinct_groups:
            devices = sum(plan.requests[i].count for i in group)
            if devices > most_gpus:
                return (
                    f"the pod needs {devices} devices on distinct GPUs of one node; "
                    f"the largest node has {most_gpus} GPUs"
                )
        if self._fits_some_empty_node(plan, shapes):
            return None
        for component in plan.gpu_components:
            signature = plan.component_signature(component)
            if signature is None:
                continue
            tables = {t for shape, _ in shapes for t in shape}
            empty = (0,)
            if not any(
                t.fits(signature, mask=0, media_taken=False, counts=empty * len(t.profiles))
                for t in tables
            ):
                return (
                    f"no GPU model in the cluster can hold {_signature_text(signature)} on one GPU"
                )
        return "no node can hold all devices of this pod even with all its GPUs free"

    def _fits_some_empty_node(
        self, plan: Plan, shapes: list[tuple[tuple[GpuTable, ...], str]]
    ) -> bool:
        geometry = plan.geometry_key()
        if len(self._empty_fit) > _EMPTY_FIT_CACHE_LIMIT:
            self._empty_fit.clear()
        for shape, name in shapes:
            key = (geometry, shape)
            verdict = self._empty_fit.get(key)
            if verdict is None:
                node = self.inventory.registry.node(name)
                search = NodeSearch(
                    plan, node, self.policy, budget=self._budget, empty=True, use_predicates=False
                )
                try:
                    verdict = search.run() is not None
                except SearchBudgetExceededError:
                    verdict = True  # undecided: never call a pod impossible without proof
                self._empty_fit[key] = verdict
            if verdict:
                return True
        return False
