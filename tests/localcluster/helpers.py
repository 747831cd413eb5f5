"""Small builders shared by the local API server contract tests."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import watch
from kubernetes.client import ApiException

from localcluster.resources import ResourceType, lookup

NS = "default"


def pod(name: str = "p", *, gates: list[str] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox:1"}], **spec},
    }
    if gates:
        body["spec"]["schedulingGates"] = [{"name": g} for g in gates]
    return body


def claim(name: str = "c", *, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if owner is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
            }
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig.instaslice.dev"}}]
            }
        },
    }


def allocation(device: str, node: str = "node-1") -> dict[str, Any]:
    return {
        "devices": {
            "results": [
                {"request": "gpu", "driver": "mig.instaslice.dev", "pool": node, "device": device}
            ]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
        "allocationTimestamp": "2026-01-01T00:00:00Z",
    }


def watch_events(list_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[Any]:
    """``kubernetes.watch.Watch().stream`` (untyped upstream) behind a typed signature."""
    stream: Iterator[Any] = watch.Watch().stream(list_fn, *args, **kwargs)  # type: ignore[no-untyped-call]
    return stream


def resource(group: str, version: str, plural: str) -> ResourceType:
    found = lookup(group, version, plural)
    assert found is not None
    return found


def status_of(exc: ApiException) -> dict[str, Any]:
    body = json.loads(exc.body or "{}")
    assert body["kind"] == "Status"
    assert body["code"] == exc.status
    return body  # type: ignore[no-any-return]


def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def budget(name: str = "web", **spec: Any) -> dict[str, Any]:
    """A ``policy/v1`` PodDisruptionBudget selecting ``app=web`` unless ``selector`` is given."""
    spec.setdefault("selector", {"matchLabels": {"app": "web"}})
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": spec,
    }


def pod_status(*, phase: str = "Running", ready: bool = True) -> dict[str, Any]:
    """A kubelet-written status: the phase and a ``Ready`` condition."""
    return {
        "phase": phase,
        "conditions": [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "lastProbeTime": None,
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
    }
