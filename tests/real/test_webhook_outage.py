"""A webhook outage in controller mode on real Kubernetes: what kube-apiserver admits, what it refuses.

``deploy/base/webhook.yaml`` splits the blast radius (README "Allocation modes"): classic
``nvidia.com/mig-*`` pods fail closed (``failurePolicy: Fail``, 5 s), pods with ResourceClaims fail
open (``Ignore``, 3 s). Two outages, each with three pods created during it:

* **hung**: the webhook process is stopped with ``SIGSTOP`` — its port still accepts connections,
  nothing answers, so kube-apiserver waits out each webhook's ``timeoutSeconds``;
* **down**: every controller replica (and with it its webhook process) is stopped — the port
  refuses connections and kube-apiserver fails the call at once.

In both, a pod whose claim uses another driver's DeviceClass is admitted untouched, a classic pod is
refused with an error naming our webhook, and a pod with a claim of our DeviceClass is admitted
ungated; kube-scheduler then allocates that one itself and it runs. How long each creation call took
is printed and written to ``$INSTASLICE_REAL_LOGS/webhook-outage.json`` (figures, not assertions).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api.names import DRIVER_NAME
from driver.cluster.port import PODS, RESOURCE_CLAIMS, JsonObject
from driver.errors import ClusterError
from localcluster.realstack import RealStack
from tests.e2e.conftest import E2E_NS
from tests.e2e.helpers import (
    apply,
    claim_template,
    classic_pod,
    dra_pod,
    get_pod,
    is_gated,
    running,
    wait_for,
)
from tests.real.conftest import logs_dir

OTHER_CLASS = "gpu.example.com"
RUNNING_TIMEOUT_S = 180.0
"""kube-scheduler's retry of an unschedulable pod, the claim's preparation and the kubelet's sync,
on a loaded machine."""


def _webhook_child(stack: RealStack) -> int:
    """The pid of the webhook process the first controller replica started (kube-apiserver calls
    that replica's port)."""
    controller = stack.controller
    assert controller is not None
    assert controller.pid is not None
    # a thread of the controller starts it: each thread's children are listed under its own task
    tasks = Path(f"/proc/{controller.pid}/task")
    children: list[str] = []
    for task in tasks.iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            children += (task / "children").read_text().split()
    for child in children:
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        if b"controller.webhook.process" in cmdline:
            return int(child)
    raise AssertionError(f"controller {controller.pid} has no webhook process: {children}")


def _other_driver_pod(stack: RealStack, name: str) -> JsonObject:
    claim: JsonObject = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": E2E_NS},
        "spec": {
            "devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": OTHER_CLASS}}]}
        },
    }
    stack.api.create(RESOURCE_CLAIMS, claim, namespace=E2E_NS)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": E2E_NS},
        "spec": {
            "resourceClaims": [{"name": "dev", "resourceClaimName": name}],
            "containers": [
                {"name": "app", "image": "busybox:1.36", "resources": {"claims": [{"name": "dev"}]}}
            ],
        },
    }


def _create(stack: RealStack, pod: JsonObject) -> tuple[float, str | None]:
    """(seconds the call took, the API server's error or None)."""
    started = time.monotonic()
    try:
        stack.api.create(PODS, pod, namespace=E2E_NS)
    except ClusterError as exc:
        return time.monotonic() - started, str(exc)
    return time.monotonic() - started, None


def _outage(stack: RealStack, tag: str) -> dict[str, Any]:
    """The three pods created during an outage; outcomes asserted, call durations returned."""
    other_s, other_error = _create(stack, _other_driver_pod(stack, f"other-{tag}"))
    classic_s, classic_error = _create(
        stack, classic_pod(f"classic-{tag}", profile="1g.5gb", namespace=E2E_NS)
    )
    ours_s, ours_error = _create(
        stack, dra_pod(f"ours-{tag}", template="outage-1g", namespace=E2E_NS)
    )

    assert other_error is None, other_error
    assert not is_gated(get_pod(stack, E2E_NS, f"other-{tag}"))
    assert classic_error is not None, "a classic pod was admitted while our webhook was out"
    assert "pod-gate.instaslice.dev" in classic_error
    assert get_pod(stack, E2E_NS, f"classic-{tag}") is None
    assert ours_error is None, ours_error
    assert not is_gated(get_pod(stack, E2E_NS, f"ours-{tag}"))
    return {
        "other_driver_claim_pod": {"admitted": True, "create_s": round(other_s, 2)},
        "classic_pod": {
            "admitted": False,
            "create_s": round(classic_s, 2),
            "error": classic_error[-300:],
        },
        "our_claim_pod": {"admitted": True, "gated": False, "create_s": round(ours_s, 2)},
    }


def _wait_running(stack: RealStack, name: str) -> JsonObject:
    deadline = time.monotonic() + RUNNING_TIMEOUT_S
    while True:
        pod = get_pod(stack, E2E_NS, name)
        if running(pod):
            assert pod is not None
            return pod
        assert time.monotonic() < deadline, f"{name} is not running: {pod}"
        time.sleep(1.0)


@pytest.fixture
def outage(cluster: RealStack) -> Iterator[RealStack]:
    """The cluster with another driver's DeviceClass; afterwards every controller replica is
    started again (controller mode) and serving the webhook."""
    cluster.kubectl_apply(
        [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": OTHER_CLASS},
                "spec": {
                    "selectors": [{"cel": {"expression": f'device.driver == "{OTHER_CLASS}"'}}]
                },
            }
        ]
    )
    apply(cluster, [claim_template("outage-1g", profile="1g.5gb", namespace=E2E_NS)])
    try:
        yield cluster
    finally:
        cluster.set_allocation_mode("controller")
        wait_for(
            cluster, lambda: cluster.webhook_serving() or None, message="webhook not serving again"
        )
        cluster.kubectl(["delete", "deviceclass", OTHER_CLASS, "--ignore-not-found"])


def test_a_webhook_outage_refuses_only_classic_pods_and_admits_claim_pods_ungated(
    outage: RealStack,
) -> None:
    stack = outage
    wait_for(stack, lambda: stack.webhook_serving() or None, message="webhook not serving")
    figures: dict[str, Any] = {"date": time.strftime("%Y-%m-%d", time.gmtime())}

    child = _webhook_child(stack)
    os.kill(child, signal.SIGSTOP)
    try:
        figures["hung"] = _outage(stack, "hung")
    finally:
        os.kill(child, signal.SIGCONT)

    for process in stack.controllers:
        process.stop()
    wait_for(stack, lambda: not stack.webhook_serving() or None, message="the webhook still serves")
    figures["down"] = _outage(stack, "down")

    # With no controller at all, kube-scheduler allocates our claims of the pods admitted ungated,
    # and they run on our slices. (stack.wait_for would fail on the stopped controllers.)
    for tag in ("hung", "down"):
        pod = _wait_running(stack, f"ours-{tag}")
        (status,) = pod["status"]["resourceClaimStatuses"]
        claim = stack.api.get(RESOURCE_CLAIMS, name=status["resourceClaimName"], namespace=E2E_NS)
        results = claim["status"]["allocation"]["devices"]["results"]
        assert [r["driver"] for r in results] == [DRIVER_NAME]
        assert pod["spec"]["nodeName"] in stack.node_names
    print(json.dumps(figures))
    out = logs_dir()
    out.mkdir(parents=True, exist_ok=True)
    (out / "webhook-outage.json").write_text(json.dumps(figures, indent=2) + "\n")
