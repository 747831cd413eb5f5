"""What the churn creates: claim templates, Deployments, Jobs and single pods of mixed profiles, DRA
and classic, all in one namespace and labelled with their kind.

Every pod tolerates a not-ready or unreachable Node for ``EVICT_AFTER_S`` only (the default is five
minutes), so a Node that goes NotReady has its pods evicted within the soak, and ends quickly
(``GRACE_S``). The fake container runtime ends a container after the seconds its pod's
``fake-cri/exit.<container>`` annotation says: that is how a Job's pods finish and a single pod
lives its lifetime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from api import names
from driver.cluster.port import JsonObject
from localcluster.realstack import EXIT_ANNOTATION_PREFIX

NAMESPACE: Final = "soak"
KIND_LABEL: Final = "soak.instaslice.dev/kind"
CONTAINER: Final = "app"
EVICT_AFTER_S: Final = 15
GRACE_S: Final = 2


@dataclass(frozen=True, slots=True)
class Shape:
    """What one pod asks for: a claim template (DRA) or a classic extended resource."""

    name: str
    profile: str
    count: int = 1
    classic: bool = False

    @property
    def template(self) -> str:
        return f"tmpl-{self.name}"

    def needs(self) -> dict[str, int]:
        """Slices by profile, all on one node."""
        return {self.profile: self.count}


SHAPES: Final = {
    shape.name: shape
    for shape in (
        Shape("dra-1g5", "1g.5gb"),
        Shape("dra-1g10", "1g.10gb"),
        Shape("dra-2g10", "2g.10gb"),
        Shape("dra-3g20", "3g.20gb"),
        Shape("dra-2x1g5", "1g.5gb", count=2),
        Shape("classic-1g5", "1g.5gb", classic=True),
        Shape("classic-2g10", "2g.10gb", classic=True),
    )
}


def claim_templates() -> list[JsonObject]:
    templates = []
    for shape in SHAPES.values():
        if shape.classic:
            continue
        exactly: JsonObject = {"deviceClassName": names.profile_device_class(shape.profile)}
        if shape.count != 1:
            exactly.update(allocationMode="ExactCount", count=shape.count)
        templates.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": shape.template, "namespace": NAMESPACE},
                "spec": {"spec": {"devices": {"requests": [{"name": "mig", "exactly": exactly}]}}},
            }
        )
    return templates


def pod_spec(shape: Shape, *, restart: str) -> JsonObject:
    resources: JsonObject = {"requests": {"cpu": "10m"}}
    spec: JsonObject = {
        "restartPolicy": restart,
        "terminationGracePeriodSeconds": GRACE_S,
        "tolerations": [
            {
                "key": key,
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": EVICT_AFTER_S,
            }
            for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
        ],
        "containers": [{"name": CONTAINER, "image": "busybox:1.36", "resources": resources}],
    }
    if shape.classic:
        resources["limits"] = {names.classic_resource_name(shape.profile): shape.count}
    else:
        spec["resourceClaims"] = [{"name": "mig", "resourceClaimTemplateName": shape.template}]
        resources["claims"] = [{"name": "mig"}]
    return spec


def _metadata(kind: str, shape: Shape, *, lifetime_s: float | None) -> JsonObject:
    meta: JsonObject = {"labels": {KIND_LABEL: kind, "soak.instaslice.dev/shape": shape.name}}
    if lifetime_s is not None:
        meta["annotations"] = {f"{EXIT_ANNOTATION_PREFIX}{CONTAINER}": f"{lifetime_s:g}"}
    return meta


def single_pod(name: str, shape: Shape, *, lifetime_s: float) -> JsonObject:
    meta = _metadata("pod", shape, lifetime_s=lifetime_s)
    meta.update(name=name, namespace=NAMESPACE)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": pod_spec(shape, restart="Never"),
    }


def deployment(name: str, shape: Shape, *, replicas: int) -> JsonObject:
    labels = {"app": name}
    template_meta = _metadata("deployment", shape, lifetime_s=None)
    template_meta["labels"].update(labels)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            # replaced pods go first: a rollout never needs twice the slices
            "strategy": {"type": "Recreate"},
            "template": {"metadata": template_meta, "spec": pod_spec(shape, restart="Always")},
        },
    }


def job(name: str, shape: Shape, *, pods: int, lifetime_s: float) -> JsonObject:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "completions": pods,
            "parallelism": pods,
            "backoffLimit": 2,
            "ttlSecondsAfterFinished": 20,
            "template": {
                "metadata": _metadata("job", shape, lifetime_s=lifetime_s),
                "spec": pod_spec(shape, restart="Never"),
            },
        },
    }


def shape_of(pod: JsonObject) -> Shape | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return SHAPES.get(str(labels.get("soak.instaslice.dev/shape") or ""))
