"""What the autoscaling scenarios do and check, and the figures they keep.

Times are the test's own clock (``time.monotonic``): a pod is *created* when its create call
returned, *bound* and *Running* when a poll (every half second) first saw it so. They are reported, never
asserted (the machine is shared; only the outcome is checked).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from api import names
from driver.cluster.port import (
    EVENTS,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    JsonObject,
    PatchType,
    parse_time,
)
from driver.errors import ApiNotFoundError
from localcluster.realstack import RealStack
from tests.autoscale.groups import InstanceState
from tests.autoscale.launcher import RealStackLauncher, Removal
from tests.autoscale.provider import CloudProvider
from tests.e2e.helpers import apply, phase, running

T = TypeVar("T")

POLL_S = 0.5
SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
HOSTNAME_LABEL = "kubernetes.io/hostname"


def until(
    stack: RealStack,
    predicate: Callable[[], T | None],
    *,
    timeout: float,
    message: str,
    explain: Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate`` every half second for at most ``timeout`` seconds (not scaled)."""
    try:
        return stack.wait_for(predicate, timeout=timeout, interval=POLL_S, message=message)
    except TimeoutError as exc:
        if explain is None:
            raise
        raise TimeoutError(f"{message}: {explain()}") from exc


@dataclass
class PodClock:
    """When each pod of a namespace was created, first seen bound and Running, and on which node."""

    stack: RealStack
    namespace: str
    created: dict[str, float] = field(default_factory=dict)
    bound_at: dict[str, float] = field(default_factory=dict)
    running_at: dict[str, float] = field(default_factory=dict)
    node_of: dict[str, str] = field(default_factory=dict)
    _expected: list[tuple[str, float]] = field(default_factory=list)

    def expect(self, prefix: str, *, at: float) -> None:
        """Pods a controller makes (a Deployment's, named ``prefix``…) count as created ``at``."""
        self._expected.append((prefix, at))

    def create(self, objects: Sequence[JsonObject]) -> None:
        for obj in objects:
            apply(self.stack, [obj])
            if obj.get("kind") == "Pod":
                self.created[str(obj["metadata"]["name"])] = time.monotonic()

    def poll(self) -> list[JsonObject]:
        now = time.monotonic()
        found = self.stack.api.list_objects(PODS, namespace=self.namespace).items
        for pod in found:
            name = str(pod["metadata"]["name"])
            if name not in self.created:
                made = [at for prefix, at in self._expected if name.startswith(prefix)]
                self.created[name] = made[0] if made else now
            if pod["spec"].get("nodeName") and name not in self.bound_at:
                self.bound_at[name] = now
            if running(pod) and name not in self.running_at:
                self.running_at[name] = now
                self.node_of[name] = str(pod["spec"].get("nodeName") or "")
        return found

    def wait_running(self, count: int, *, timeout: float, prefix: str = "") -> list[JsonObject]:
        """Until ``count`` pods (whose names start with ``prefix``) exist and all run."""

        def check() -> list[JsonObject] | None:
            mine = [p for p in self.poll() if str(p["metadata"]["name"]).startswith(prefix)]
            live = [p for p in mine if not p["metadata"].get("deletionTimestamp")]
            if len(live) == count and all(running(p) for p in live):
                return live
            return None

        def explain() -> str:
            return ", ".join(
                f"{p['metadata']['name']}={phase(p)}@{p['spec'].get('nodeName') or '-'}"
                for p in self.poll()
                if str(p["metadata"]["name"]).startswith(prefix)
            )

        return until(
            self.stack,
            check,
            timeout=timeout,
            message=f"{count} pods {prefix}* not all running",
            explain=explain,
        )

    def pending_to_running(self, pods: Iterable[str]) -> list[float]:
        return [self.running_at[p] - self.created[p] for p in pods if p in self.running_at]

    def pending_to_bound(self, pods: Iterable[str]) -> list[float]:
        return [self.bound_at[p] - self.created[p] for p in pods if p in self.bound_at]


def summary(seconds: Sequence[float], *, of: str = "pods") -> dict[str, float | int]:
    """How many (``of``), p50 and max of a list of durations, rounded to 0.1 s."""
    if not seconds:
        return {of: 0}
    return {
        of: len(seconds),
        "p50_s": round(statistics.median(seconds), 1),
        "max_s": round(max(seconds), 1),
    }


# --- node groups ----------------------------------------------------------------------------


def group_nodes(provider: CloudProvider, group: str) -> list[str]:
    """The group's nodes that are up (running instances)."""
    return [i.node for i in provider.groups.instances(group) if i.state is InstanceState.RUNNING]


def settled(provider: CloudProvider, group: str) -> list[str] | None:
    """The group's nodes when every instance runs (none starting, failed or going); else None."""
    instances = provider.groups.instances(group)
    if all(i.state is InstanceState.RUNNING for i in instances):
        return [i.node for i in instances]
    return None


def wait_group_size(
    stack: RealStack, provider: CloudProvider, group: str, size: int, *, timeout: float
) -> list[str]:
    """Until the group has exactly ``size`` nodes, all up; returns them."""

    def check() -> tuple[list[str]] | None:
        nodes = settled(provider, group)
        return (nodes,) if nodes is not None and len(nodes) == size else None

    (nodes,) = until(
        stack,
        check,
        timeout=timeout,
        message=f"node group {group} did not settle at {size} nodes",
        explain=lambda: str(provider.groups.instances(group)),
    )
    return nodes


def ready_for(stack: RealStack, node: str) -> float:
    """Seconds since the Node's Ready condition last turned True (0 when it is not Ready)."""
    try:
        obj = stack.api.get(NODES, name=node)
    except ApiNotFoundError:
        return 0.0
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") == "True":
            since = parse_time(str(condition.get("lastTransitionTime")))
            return max(0.0, time.time() - since.timestamp())
    return 0.0


def set_scale_down_disabled(stack: RealStack, nodes: Iterable[str], *, disabled: bool) -> None:
    """cluster-autoscaler's per-node opt-out of scale-down (an annotation on the Node)."""
    value = "true" if disabled else None
    for node in nodes:
        stack.api.patch(
            NODES,
            name=node,
            patch={"metadata": {"annotations": {SCALE_DOWN_DISABLED: value}}},
            patch_type=PatchType.MERGE,
        )


# --- what a removed node must not leave ---------------------------------------------------


def removal_problems(
    stack: RealStack, launcher: RealStackLauncher, nodes: Iterable[str]
) -> list[str]:
    """For nodes the provider removed: anything left on them when they went (MIG instance, CDI
    spec, checkpoint entry), any claim still allocated to them, any ResourceSlice still naming
    them. Empty when all is well."""
    wanted = set(nodes)
    removals: dict[str, Removal] = {r.node: r for r in launcher.removals() if r.node in wanted}
    problems = [f"{n}: never removed" for n in sorted(wanted - set(removals))]
    for removal in removals.values():
        problems += [f"{removal.node}: left {item}" for item in removal.leftovers]
    for claim in stack.api.list_objects(RESOURCE_CLAIMS).items:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") == names.DRIVER_NAME and result.get("pool") in wanted:
                meta = claim["metadata"]
                problems.append(
                    f"claim {meta['namespace']}/{meta['name']} still allocated on "
                    f"{result['pool']} ({result['device']})"
                )
    for slice_obj in stack.api.list_objects(RESOURCE_SLICES).items:
        if slice_obj["spec"].get("nodeName") in wanted:
            problems.append(f"ResourceSlice {slice_obj['metadata']['name']} outlived its node")
    return problems


# --- cluster-autoscaler's word on a pod -------------------------------------------------------


def autoscaler_events(stack: RealStack, namespace: str, pod: str) -> list[tuple[str, str]]:
    """(reason, message) of the events cluster-autoscaler posted on a pod."""
    found = []
    for event in stack.api.list_objects(EVENTS, namespace=namespace).items:
        involved = event.get("involvedObject") or {}
        source = (event.get("source") or {}).get("component") or event.get("reportingComponent", "")
        if involved.get("name") == pod and "cluster-autoscaler" in str(source):
            found.append((str(event.get("reason")), str(event.get("message"))))
    return found


def nodes_over_time(provider: CloudProvider, *, since: float) -> list[dict[str, Any]]:
    """Each change of a group's node count: seconds since ``since``, group, nodes up."""
    counts: dict[str, int] = {}
    series = []
    for event in provider.history():
        if event.what not in ("ready", "gone"):
            continue
        counts[event.group] = counts.get(event.group, 0) + (1 if event.what == "ready" else -1)
        series.append(
            {
                "t_s": round(event.at - since, 1),
                "group": event.group,
                "node": event.node,
                "event": event.what,
                "nodes": counts[event.group],
            }
        )
    return series


def node_starts(provider: CloudProvider) -> dict[str, float | int]:
    """How long nodes took from the autoscaler's request to serving their GPUs (kubelet Ready,
    plugin registered and published, and in controller mode the shim's resources listed)."""
    requested: dict[str, float] = {}
    took = []
    for event in provider.history():
        if event.what == "requested":
            requested[event.node] = event.at
        elif event.what == "ready" and event.node in requested:
            took.append(event.at - requested[event.node])
    return summary(took, of="nodes")
