"""Pod statuses the emulated kubelet writes, shaped like the real kubelet's (pure functions).

Each builder starts from the stored status so that what other writers own — the scheduler's
``PodScheduled`` condition, the claim controller's ``resourceClaimStatuses`` — is kept.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from driver.cluster.port import JsonObject

StatusBuilder = Callable[[JsonObject], JsonObject]
"""Builds the status to write from the stored pod (re-run on a conflict with the fresh one)."""

_KUBELET_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")


def _base(pod: JsonObject) -> JsonObject:
    return copy.deepcopy(pod.get("status") or {})


def _conditions(status: JsonObject, now: str, values: dict[str, tuple[str, str]]) -> None:
    """Set the kubelet's conditions: type -> (status, reason); transition time moves on change."""
    kept = [c for c in status.get("conditions") or [] if c.get("type") not in values]
    old = {c.get("type"): c for c in status.get("conditions") or []}
    for kind in _KUBELET_CONDITIONS:
        if kind not in values:
            continue
        value, reason = values[kind]
        previous = old.get(kind)
        condition: JsonObject = {
            "type": kind,
            "status": value,
            "lastProbeTime": None,
            "lastTransitionTime": (
                previous.get("lastTransitionTime")
                if previous is not None and previous.get("status") == value
                else now
            ),
        }
        if reason:
            condition["reason"] = reason
        kept.append(condition)
    status["conditions"] = kept


def _container_status(container: JsonObject, state: JsonObject, *, ready: bool) -> JsonObject:
    return {
        "name": container.get("name"),
        "image": container.get("image"),
        "imageID": "",
        "ready": ready,
        "started": "running" in state,
        "restartCount": 0,
        "state": state,
    }


def _containers(pod: JsonObject, field: str) -> list[JsonObject]:
    return list((pod.get("spec") or {}).get(field) or [])


def waiting_status(
    pod: JsonObject, *, now: str, host_ip: str, reason: str, message: str = ""
) -> JsonObject:
    """Admitted, containers not started (``ContainerCreating`` or a start error)."""
    status = _base(pod)
    status["phase"] = "Pending"
    status["hostIP"] = host_ip
    status["hostIPs"] = [{"ip": host_ip}]
    status.setdefault("startTime", now)
    waiting: dict[str, Any] = {"reason": reason}
    if message:
        waiting["message"] = message
    status["containerStatuses"] = [
        _container_status(c, {"waiting": waiting}, ready=False)
        for c in _containers(pod, "containers")
    ]
    _conditions(
        status,
        now,
        {
            "PodReadyToStartContainers": ("False", ""),
            "Initialized": ("True", ""),
            "Ready": ("False", "ContainersNotReady"),
            "ContainersReady": ("False", "ContainersNotReady"),
        },
    )
    return status


def running_status(pod: JsonObject, *, now: str, host_ip: str, pod_ip: str) -> JsonObject:
    status = _base(pod)
    status["phase"] = "Running"
    status["hostIP"] = host_ip
    status["hostIPs"] = [{"ip": host_ip}]
    status["podIP"] = pod_ip
    status["podIPs"] = [{"ip": pod_ip}]
    status.setdefault("startTime", now)
    if _containers(pod, "initContainers"):
        done = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now,
                               "finishedAt": now}}  # fmt: skip
        status["initContainerStatuses"] = [
            _container_status(c, done, ready=True) for c in _containers(pod, "initContainers")
        ]
    running = {"running": {"startedAt": now}}
    status["containerStatuses"] = [
        _container_status(c, running, ready=True) for c in _containers(pod, "containers")
    ]
    _conditions(
        status,
        now,
        {
            "PodReadyToStartContainers": ("True", ""),
            "Initialized": ("True", ""),
            "Ready": ("True", ""),
            "ContainersReady": ("True", ""),
        },
    )
    return status


def succeeded_status(pod: JsonObject, *, now: str) -> JsonObject:
    status = _base(pod)
    status["phase"] = "Succeeded"
    statuses = []
    for container in _containers(pod, "containers"):
        previous: JsonObject = next(
            (
                s
                for s in status.get("containerStatuses") or []
                if s.get("name") == container.get("name")
            ),
            {},
        )
        started = ((previous.get("state") or {}).get("running") or {}).get("startedAt", now)
        terminated = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started,
                                     "finishedAt": now}}  # fmt: skip
        statuses.append(_container_status(container, terminated, ready=False))
    status["containerStatuses"] = statuses
    _conditions(
        status,
        now,
        {
            "PodReadyToStartContainers": ("False", ""),
            "Ready": ("False", "PodCompleted"),
            "ContainersReady": ("False", "PodCompleted"),
        },
    )
    return status


def rejected_status(pod: JsonObject, *, reason: str, message: str) -> JsonObject:
    """What ``rejectPod`` writes: phase Failed with the admission reason."""
    status = _base(pod)
    status["phase"] = "Failed"
    status["reason"] = reason
    status["message"] = f"Pod was rejected: {message}"
    return status
