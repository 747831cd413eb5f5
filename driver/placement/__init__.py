"""The placement engine: where each MIG slice of a pod goes, or why it cannot go anywhere.

Public API (everything the controller needs)::

    engine = Engine(policy="firstfit")            # or "bestfit"; see POLICIES
    engine.set_node(NodeSpec(name, gpus=(GpuSpec(index, model, uuid=…, published=…), …)))
    engine.occupy(node, gpu_index, start=…, size=…, media=…, profile=…)   # allocated claims
    result = engine.place(pod_request, node_filter=…)   # Placed | NoFit; changes nothing
    engine.commit(result)                               # reserve; release_placed(result) undoes
"""

from driver.placement.engine import DEFAULT_SEARCH_BUDGET, Engine
from driver.placement.inventory import Inventory
from driver.placement.policies import (
    DEFAULT_POLICY,
    POLICIES,
    BestFit,
    FirstFit,
    Policy,
    policy_named,
)
from driver.placement.request import (
    AttributeKey,
    Constraint,
    DeviceAssignment,
    DevicePredicate,
    DeviceRef,
    DeviceRequest,
    DistinctAttribute,
    MatchAttribute,
    NodeFilter,
    NoFit,
    Placed,
    PlacementResult,
    PodRequest,
    distinct_gpu,
    same_gpu,
)
from driver.placement.state import GpuSpec, NodeSpec, Occupant

__all__ = [
    "DEFAULT_POLICY",
    "DEFAULT_SEARCH_BUDGET",
    "POLICIES",
    "AttributeKey",
    "BestFit",
    "Constraint",
    "DeviceAssignment",
    "DevicePredicate",
    "DeviceRef",
    "DeviceRequest",
    "DistinctAttribute",
    "Engine",
    "FirstFit",
    "GpuSpec",
    "Inventory",
    "MatchAttribute",
    "NoFit",
    "NodeFilter",
    "NodeSpec",
    "Occupant",
    "Placed",
    "PlacementResult",
    "PodRequest",
    "Policy",
    "distinct_gpu",
    "policy_named",
    "same_gpu",
]
