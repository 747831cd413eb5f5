"""The test cloud provider's node groups: what each group is, which instances it has (pure).

A node group is a GPU model and a count per node (``1xA100-40GB``, the plugin's ``--emulated-gpus``)
with cluster-autoscaler's minimum and maximum size. Its instances are the nodes it started, named
``<group>-<n>`` (``n`` never reused), each with the provider id ``instaslice-test://<node>`` — the
kubelet's ``--provider-id``, which its Node carries in ``spec.providerID`` and which
cluster-autoscaler matches against ``NodeGroupNodes``. An instance is *creating* until its node is
up, then *running*, *deleting* once the autoscaler asked for it to go, and forgotten when it is
gone; a start that failed leaves it *failed*, with the reason, until the autoscaler deletes it.

The target size is what cluster-autoscaler asked for: every instance not being deleted. The
operations refuse what the externalgrpc contract says must fail (an unknown group, a size outside
min..max, a node of another group) with a :class:`NodeGroupError` the gRPC layer turns into a status
code. Thread-safe: gRPC calls and node starts and stops come from several threads.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

PROVIDER_ID_PREFIX = "instaslice-test://"


class NodeGroupError(Exception):
    """A request the node groups refuse; ``not_found`` tells an unknown group from a bad size."""

    def __init__(self, message: str, *, not_found: bool = False) -> None:
        super().__init__(message)
        self.not_found = not_found


@dataclass(frozen=True, slots=True)
class NodeGroupSpec:
    """One node group: its nodes' GPUs, labels and size limits."""

    id: str
    gpus: str
    """Every node's GPUs, as ``--emulated-gpus`` takes them: ``1xA100-40GB``, ``2xH100-80GB``."""
    min_size: int
    max_size: int
    labels: Mapping[str, str] = field(default_factory=dict)
    """``--node-labels`` of its kubelets (and so of its template)."""
    scale_down_utilization_threshold: float | None = None
    """The group's own ``--scale-down-utilization-threshold`` (None: the autoscaler's)."""

    def __post_init__(self) -> None:
        if not 0 <= self.min_size <= self.max_size:
            raise ValueError(f"node group {self.id}: need 0 <= min <= max")


class InstanceState(enum.Enum):
    CREATING = "creating"
    RUNNING = "running"
    DELETING = "deleting"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Instance:
    """One node of a group, as the provider knows it."""

    group: str
    node: str
    state: InstanceState
    error: str = ""

    @property
    def provider_id(self) -> str:
        return provider_id(self.node)


def provider_id(node: str) -> str:
    return f"{PROVIDER_ID_PREFIX}{node}"


class NodeGroups:
    """The groups' specs, limits and instances; every change under one lock."""

    def __init__(self, specs: Iterable[NodeGroupSpec]) -> None:
        self._lock = threading.Lock()
        self._specs: dict[str, NodeGroupSpec] = {}
        for spec in specs:
            if spec.id in self._specs:
                raise ValueError(f"node group {spec.id} twice")
            self._specs[spec.id] = spec
        self._instances: dict[str, Instance] = {}  # by node name
        self._counters: dict[str, int] = dict.fromkeys(self._specs, 0)

    # --- reading ------------------------------------------------------------------------------

    def specs(self) -> list[NodeGroupSpec]:
        with self._lock:
            return sorted(self._specs.values(), key=lambda s: s.id)

    def spec(self, group: str) -> NodeGroupSpec:
        with self._lock:
            return self._spec(group)

    def instances(self, group: str | None = None) -> list[Instance]:
        with self._lock:
            if group is not None:
                self._spec(group)
            return sorted(
                (i for i in self._instances.values() if group is None or i.group == group),
                key=lambda i: i.node,
            )

    def instance(self, node: str) -> Instance | None:
        with self._lock:
            return self._instances.get(node)

    def target_size(self, group: str) -> int:
        with self._lock:
            self._spec(group)
            return self._target(group)

    def group_of(self, *, provider_id: str, node: str) -> NodeGroupSpec | None:
        """The group of a Node (by provider id, else by name); None for nodes of no group."""
        with self._lock:
            instance = self._by_provider_id(provider_id) or self._instances.get(node)
            return self._specs[instance.group] if instance is not None else None

    # --- what cluster-autoscaler asks ---------------------------------------------------------

    def increase(self, group: str, delta: int) -> list[Instance]:
        """``delta`` new instances, creating; refused unless ``0 < delta`` and the target stays
        within the group's maximum."""
        with self._lock:
            spec = self._spec(group)
            if delta <= 0:
                raise NodeGroupError(f"node group {group}: increase by {delta}, must be positive")
            if self._target(group) + delta > spec.max_size:
                raise NodeGroupError(
                    f"node group {group}: size {self._target(group)} + {delta} exceeds its "
                    f"maximum {spec.max_size}"
                )
            added = []
            for _ in range(delta):
                self._counters[group] += 1
                instance = Instance(
                    group=group,
                    node=f"{group}-{self._counters[group]}",
                    state=InstanceState.CREATING,
                )
                self._instances[instance.node] = instance
                added.append(instance)
            return added

    def delete(self, group: str, nodes: Sequence[tuple[str, str]]) -> list[Instance]:
        """Mark the instances of ``nodes`` (provider id, node name) deleting and return them as
        they were. All or nothing: a node of another group, or a target below the group's
        minimum, refuses the whole request. Instances already deleting are not returned again."""
        with self._lock:
            spec = self._spec(group)
            found: dict[str, Instance] = {}
            for pid, name in nodes:
                instance = self._by_provider_id(pid) or self._instances.get(name)
                if instance is None or instance.group != group:
                    raise NodeGroupError(
                        f"node {name or pid} does not belong to node group {group}"
                    )
                found[instance.node] = instance
            leaving = [i for i in found.values() if i.state is not InstanceState.DELETING]
            if self._target(group) - len(leaving) < spec.min_size:
                raise NodeGroupError(
                    f"node group {group}: deleting {len(leaving)} of {self._target(group)} "
                    f"would go below its minimum {spec.min_size}"
                )
            for instance in leaving:
                self._instances[instance.node] = replace(instance, state=InstanceState.DELETING)
            return sorted(leaving, key=lambda i: i.node)

    def decrease_target(self, group: str, delta: int) -> list[Instance]:
        """Give up ``-delta`` instances not started yet (the newest first), as cluster-autoscaler
        does when it waited too long for them; refused if fewer than that are still creating.
        Returns them, now deleting."""
        with self._lock:
            self._spec(group)
            if delta >= 0:
                raise NodeGroupError(f"node group {group}: decrease by {delta}, must be negative")
            creating = sorted(
                (
                    i
                    for i in self._instances.values()
                    if i.group == group and i.state is InstanceState.CREATING
                ),
                key=lambda i: _number(i.node),
                reverse=True,
            )
            if -delta > len(creating):
                raise NodeGroupError(
                    f"node group {group}: cannot drop {-delta} requested nodes, "
                    f"{len(creating)} not started yet"
                )
            dropped = creating[:-delta]
            for instance in dropped:
                self._instances[instance.node] = replace(instance, state=InstanceState.DELETING)
            return dropped

    # --- what the node starts and stops report --------------------------------------------------

    def started(self, node: str) -> Instance | None:
        """The node is up: creating → running. Returns the instance as it is now (None if it was
        forgotten); one being deleted meanwhile stays deleting, for its stop to follow."""
        with self._lock:
            instance = self._instances.get(node)
            if instance is not None and instance.state is InstanceState.CREATING:
                instance = replace(instance, state=InstanceState.RUNNING)
                self._instances[node] = instance
            return instance

    def failed(self, node: str, reason: str) -> Instance | None:
        with self._lock:
            instance = self._instances.get(node)
            if instance is not None and instance.state is InstanceState.CREATING:
                instance = replace(instance, state=InstanceState.FAILED, error=reason)
                self._instances[node] = instance
            return instance

    def gone(self, node: str) -> None:
        with self._lock:
            self._instances.pop(node, None)

    def set_limits(self, group: str, *, min_size: int, max_size: int) -> None:
        """Change a group's limits (cluster-autoscaler reads them again on its next loop)."""
        with self._lock:
            self._specs[group] = replace(self._spec(group), min_size=min_size, max_size=max_size)

    def set_scale_down_utilization_threshold(self, group: str, threshold: float | None) -> None:
        """Give the group its own scale-down utilization threshold (None: the autoscaler's)."""
        with self._lock:
            self._specs[group] = replace(
                self._spec(group), scale_down_utilization_threshold=threshold
            )

    # --- inside the lock ----------------------------------------------------------------------

    def _spec(self, group: str) -> NodeGroupSpec:
        spec = self._specs.get(group)
        if spec is None:
            raise NodeGroupError(f"node group {group!r} not found", not_found=True)
        return spec

    def _target(self, group: str) -> int:
        return sum(
            1
            for i in self._instances.values()
            if i.group == group and i.state is not InstanceState.DELETING
        )

    def _by_provider_id(self, pid: str) -> Instance | None:
        if not pid.startswith(PROVIDER_ID_PREFIX):
            return None
        return self._instances.get(pid.removeprefix(PROVIDER_ID_PREFIX))


def _number(node: str) -> int:
    return int(node.rpartition("-")[2])
