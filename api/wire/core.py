"""The core group (``/api/v1``): Events, Secrets, the parts of Pods and Nodes we write or read."""

from __future__ import annotations

from typing import Literal, Required, TypedDict

from api.wire.meta import ObjectMeta


class ObjectReference(TypedDict, total=False):
    apiVersion: str
    kind: str
    name: str
    namespace: str
    uid: str
    resourceVersion: str


class EventSource(TypedDict, total=False):
    component: str
    host: str


class Event(TypedDict, total=False):
    """A core/v1 Event (what ``kubectl describe`` lists under the object)."""

    apiVersion: str
    kind: str
    metadata: Required[ObjectMeta]
    involvedObject: Required[ObjectReference]
    type: str
    """``Normal`` or ``Warning``."""
    reason: str
    message: str
    count: int
    firstTimestamp: str
    lastTimestamp: str
    source: EventSource
    reportingComponent: str
    reportingInstance: str


class EventRepeat(TypedDict):
    """The merge patch that counts an Event again."""

    count: int
    lastTimestamp: str


class Secret(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    type: str
    data: dict[str, str]
    """Base64-encoded values."""


class NodeSelectorRequirement(TypedDict, total=False):
    key: Required[str]
    operator: Required[Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]]
    values: list[str]


class NodeSelectorTerm(TypedDict, total=False):
    matchExpressions: list[NodeSelectorRequirement]
    matchFields: list[NodeSelectorRequirement]


class NodeSelector(TypedDict):
    nodeSelectorTerms: list[NodeSelectorTerm]


class NodeStatus(TypedDict, total=False):
    capacity: dict[str, str | None]
    """Resource name → quantity; ``None`` in a merge patch deletes the entry."""
    allocatable: dict[str, str | None]


class Node(TypedDict, total=False):
    """What we write of a Node: its status, as a merge patch of ``nodes/status``."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    status: NodeStatus


class PodSchedulingGate(TypedDict):
    name: str


class PodCondition(TypedDict, total=False):
    type: Required[str]
    status: Required[str]
    """``True``, ``False`` or ``Unknown``."""
    reason: str
    message: str
    lastProbeTime: str | None
    lastTransitionTime: str


class ContainerPort(TypedDict, total=False):
    name: str
    containerPort: Required[int]


class Container(TypedDict, total=False):
    name: Required[str]
    ports: list[ContainerPort]


class PodSpec(TypedDict, total=False):
    """The fields of a pod's spec read outside ``PodView``."""

    containers: list[Container]
    schedulingGates: list[PodSchedulingGate]


class Pod(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: PodSpec
