"""Where a pod is on InstaSlice's path, in the words the demo prints.

``Pending`` (created, nothing decided) → ``gated`` (our webhook's gate holds it until the controller
has placed every slice it needs; another gate, such as Kueue's, shows as ``held``) → ``placed``
(gate lifted, waiting for the scheduler) → ``bound`` (on a node, slices being created) → ``Running``
(or ``Succeeded``/``Failed``) → ``terminating`` → ``gone``. Pure functions over pod JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from api import names
from driver.cluster.port import JsonObject, gate_names

PENDING = "Pending"
GATED = "gated"
HELD = "held"
PLACED = "placed"
BOUND = "bound"
TERMINATING = "terminating"
GONE = "gone"
FINAL_PHASES = ("Running", "Succeeded", "Failed")


def pod_key(pod: JsonObject) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def pod_stage(pod: JsonObject) -> str:
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    phase = str((pod.get("status") or {}).get("phase") or PENDING)
    if meta.get("deletionTimestamp"):
        return TERMINATING
    if phase in FINAL_PHASES:
        return phase
    gates = gate_names(pod)
    if names.SCHEDULING_GATE in gates:
        return GATED
    if gates:
        return HELD
    if spec.get("nodeName"):
        return BOUND
    if _ungated_by_us(pod):
        return PLACED
    return PENDING


def _ungated_by_us(pod: JsonObject) -> bool:
    """A pod our webhook gated and our controller released: its placement condition says so, or
    (controllers that write no condition) it asks for MIG slices at all."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == names.PLACEMENT_CONDITION:
            return bool(condition.get("status") == "True")
    spec = pod.get("spec") or {}
    if spec.get("resourceClaims"):
        return True
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        resources = container.get("resources") or {}
        for section in ("limits", "requests"):
            if any(
                str(r).startswith(names.CLASSIC_RESOURCE_PREFIX)
                for r in resources.get(section) or {}
            ):
                return True
    return False


@dataclass(frozen=True, slots=True)
class StageChange:
    pod: str
    before: str
    after: str
    pod_object: JsonObject | None
    """The pod as last seen (``None`` once it is gone)."""


def stage_changes(
    previous: Mapping[str, str], pods: Mapping[str, JsonObject]
) -> tuple[dict[str, str], list[StageChange]]:
    """New stage per pod key, and the changes since ``previous`` (new pods start from
    ``Pending``; pods no longer listed become ``gone``). Changes are ordered by pod key."""
    current = {key: pod_stage(pod) for key, pod in pods.items()}
    changes = [
        StageChange(pod=key, before=previous.get(key, PENDING), after=stage, pod_object=pods[key])
        for key, stage in sorted(current.items())
        if previous.get(key, PENDING) != stage
    ]
    changes += [
        StageChange(pod=key, before=stage, after=GONE, pod_object=None)
        for key, stage in sorted(previous.items())
        if key not in pods
    ]
    return current, changes
