"""The ``resource.k8s.io/v1`` defaults kube-apiserver applies on every write that matter to us.

A device taint without ``timeAdded`` gets the time of the write (whole seconds,
``SetDefaults_DeviceTaint``); a toleration without ``operator`` gets ``Equal`` (the ``+default``
of ``DeviceToleration.operator``), in claims and in claim templates; an exact ``count: 0`` (the
field's zero value) becomes 1 (seen on a real 1.36 API server).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

JsonObj = dict[str, Any]


def apply_dra_defaults(plural: str, obj: JsonObj) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if plural == "resourceslices":
        _default_taints(spec)
    elif plural == "resourceclaims":
        _default_tolerations(spec)
    elif plural == "resourceclaimtemplates" and isinstance(spec.get("spec"), dict):
        _default_tolerations(spec["spec"])


def _default_taints(spec: JsonObj) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for device in spec.get("devices") or []:
        if not isinstance(device, dict) or not isinstance(device.get("taints"), list):
            continue
        for taint in device["taints"]:
            if isinstance(taint, dict) and not taint.get("timeAdded"):
                taint["timeAdded"] = now


def _default_tolerations(claim_spec: JsonObj) -> None:
    devices = claim_spec.get("devices")
    if not isinstance(devices, dict):
        return
    for request in devices.get("requests") or []:
        if not isinstance(request, dict):
            continue
        bodies = [request.get("exactly"), *(request.get("firstAvailable") or [])]
        for body in bodies:
            if isinstance(body, dict) and body.get("count") == 0:
                body["count"] = 1
            if not isinstance(body, dict) or not isinstance(body.get("tolerations"), list):
                continue
            for toleration in body["tolerations"]:
                if isinstance(toleration, dict) and not toleration.get("operator"):
                    toleration["operator"] = "Equal"
