"""Everything InstaSlice does with the Kubernetes API: the ``ClusterApi`` port and its adapter
(``kube``, the only importer of ``kubernetes``), informers, a work queue, leader election, events.

Importing this package does not import ``kubernetes``; daemons' ``main`` imports ``kube``.
"""

from driver.cluster.port import (
    DEVICE_CLASSES,
    EVENTS,
    LEASES,
    NODES,
    POD_DISRUPTION_BUDGETS,
    PODS,
    PRIORITY_CLASSES,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    ClusterApi,
    JsonObject,
    ObjectList,
    PatchType,
    Resource,
    WatchEvent,
    WatchEventType,
    WatchStream,
    gate_names,
)

__all__ = [
    "DEVICE_CLASSES",
    "EVENTS",
    "LEASES",
    "NODES",
    "PODS",
    "POD_DISRUPTION_BUDGETS",
    "PRIORITY_CLASSES",
    "RESOURCE_CLAIMS",
    "RESOURCE_CLAIM_TEMPLATES",
    "RESOURCE_SLICES",
    "ClusterApi",
    "JsonObject",
    "ObjectList",
    "PatchType",
    "Resource",
    "WatchEvent",
    "WatchEventType",
    "WatchStream",
    "gate_names",
]
