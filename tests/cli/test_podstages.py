"""The stages the demo prints for each pod."""

from __future__ import annotations

from typing import Any

import pytest

from localcluster import podstages
from localcluster.podstages import stage_changes


def _pod(name: str = "p", **spec_status: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": spec_status.pop("resources", {})}]
    }
    for key in ("schedulingGates", "nodeName", "resourceClaims"):
        if key in spec_status:
            spec[key] = spec_status.pop(key)
    meta: dict[str, Any] = {"name": name, "namespace": "ns"}
    if spec_status.pop("deleting", False):
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": spec, "status": spec_status}


MIG = {"limits": {"nvidia.com/mig-1g.5gb": 1}}
CLAIMS = [{"name": "mig", "resourceClaimTemplateName": "t"}]


@pytest.mark.parametrize(
    ("pod", "stage"),
    [
        (_pod(), "Pending"),
        (_pod(resources=MIG, schedulingGates=[{"name": "instaslice.dev/placement"}]), "gated"),
        (
            _pod(schedulingGates=[{"name": "kueue.x-k8s.io/admission"}, {"name": "instaslice.dev/placement"}]),
            "gated",
        ),
        (_pod(schedulingGates=[{"name": "kueue.x-k8s.io/admission"}]), "held"),
        (_pod(resources=MIG), "placed"),
        (_pod(resourceClaims=CLAIMS), "placed"),
        (_pod(conditions=[{"type": "instaslice.dev/Placement", "status": "False"}], resourceClaims=CLAIMS), "Pending"),
        (_pod(resources=MIG, nodeName="node-0"), "bound"),
        (_pod(resources=MIG, nodeName="node-0", phase="Running"), "Running"),
        (_pod(nodeName="node-0", phase="Succeeded"), "Succeeded"),
        (_pod(resources=MIG, nodeName="node-0", phase="Running", deleting=True), "terminating"),
    ],
    ids=[
        "plain-pending", "gated", "gated-beside-kueue", "held-by-kueue", "classic-placed",
        "dra-placed", "placement-refused", "bound", "running", "succeeded", "terminating",
    ],
)  # fmt: skip
def test_pod_stage(pod: dict[str, Any], stage: str) -> None:
    assert podstages.pod_stage(pod) == stage


def test_stage_changes_report_new_pods_from_pending_and_vanished_pods_as_gone() -> None:
    gated = _pod("a", schedulingGates=[{"name": "instaslice.dev/placement"}])
    stages, changes = stage_changes({}, {"ns/a": gated, "ns/b": _pod("b")})
    assert stages == {"ns/a": "gated", "ns/b": "Pending"}
    assert [(c.pod, c.before, c.after) for c in changes] == [("ns/a", "Pending", "gated")]

    running = _pod("a", resources=MIG, nodeName="n", phase="Running")
    stages, changes = stage_changes(stages, {"ns/a": running})
    assert stages == {"ns/a": "Running"}
    assert [(c.pod, c.before, c.after) for c in changes] == [
        ("ns/a", "gated", "Running"),
        ("ns/b", "Pending", "gone"),
    ]
    assert changes[1].pod_object is None
    assert stage_changes(stages, {"ns/a": running}) == ({"ns/a": "Running"}, [])
