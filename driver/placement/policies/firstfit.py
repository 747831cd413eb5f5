"""``firstfit``, the default placement policy: InstaSlice's documented behaviour.

Nodes in name order, GPUs in index order, starts in the order NVML lists them, devices in the order
the pod lists them; the first complete fit wins. It is deterministic, and reads only which nodes can
take each signature (the signature indexes without levels).
"""

from collections.abc import Iterable, Iterator, Sequence

from driver.placement.inventory import Inventory
from driver.placement.policies.policy import Condition, condition_unions, leapfrog
from driver.placement.search import Candidate, NodeSearch, Plan
from driver.placement.state import NodeState


class FirstFit:
    """Nodes by name, GPUs by index, starts in NVML order, devices as listed: first fit wins."""

    name = "firstfit"
    needs_levels = False
    needs_states = False

    def nodes(
        self, inventory: Inventory, plan: Plan, conditions: Sequence[Condition]
    ) -> Iterator[NodeState]:
        for rank in leapfrog(condition_unions(conditions)):
            node = inventory.registry.node_at(rank)
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
