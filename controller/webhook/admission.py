"""The pod webhook's decision: gate pods that will need MIG slices, refuse MIG requests that can't work.

Pure: an ``AdmissionReview`` (dict) and a read-only ``AdmissionContext`` (informer caches) in, the
``AdmissionReview`` answer out. ``webhook_server`` only moves bytes.

On pod CREATE the webhook adds the scheduling gate ``instaslice.dev/placement`` (appended after any
gate already there, e.g. Kueue's, never duplicated) when the pod

- references a ResourceClaim or ResourceClaimTemplate (``spec.resourceClaims[]``) whose requests use
  one of our DeviceClasses (``exactly.deviceClassName`` or any ``firstAvailable`` alternative), or
- requests ``nvidia.com/mig-<profile>`` in any container or init container (limits or requests).

It refuses (``allowed: false``, message naming the resource) a classic request for an unknown
profile (``nvidia.com/mig-9g.99gb``), a count larger than any GPU in the cluster holds (8 of
``1g.5gb`` where the biggest GPU has 7 placements), a non-integer or negative count, requests that
differ from limits, or requests without limits (extended resources cannot be overcommitted).
Everything else is allowed unchanged. Skipped outright: system namespaces (``kube-system``,
``kube-public``, ``kube-node-lease``, ``instaslice-system``), pods that already carry our gate, and
pods created with ``spec.nodeName`` (mirror pods; kube-apiserver refuses gates on them anyway).

**Claims that do not exist yet.** Kubernetes lets a pod be created before its ResourceClaim or
ResourceClaimTemplate. Not gating such a pod would let kube-scheduler allocate our devices itself if
the claim turns out to be ours, and a gate cannot be added later (docs/design.md F4); so a reference we
cannot resolve is gated, with an admission warning. Rule for the allocation loop: **the controller
must lift our gate from a gated pod once all of its claims are known and none uses one of our
DeviceClasses and it has no classic MIG request** (only our gate; other gates are someone else's).
The same applies to pods whose claims were deleted and recreated for another driver.

**Claims: the delete-protection finalizer at creation.** On ResourceClaim CREATE (webhook 3 of
deploy/base/webhook.yaml) a claim whose requests name one of our DeviceClasses gets
``resource.kubernetes.io/delete-protection`` in ``metadata.finalizers``: the finalizer the allocator
must write before an allocation (docs/design.md F3), added here instead of by an update of its own
once the claim's pod arrives — one write per placed pod fewer for the controller and for
kube-apiserver (F25). Nothing relies on it: a claim admitted without it (an outage; that webhook
fails open) gets it from the controller's own update. A claim being deleted that was never allocated
loses it to kube-controller-manager (its resourceclaim controller lifts the finalizer of an
unreserved claim being deleted, allocated or not), so it never blocks a deletion. Claims of other
drivers, of system namespaces and with the finalizer already are left unchanged.

Failure policy (deploy/base/webhook.yaml): ``failurePolicy: Fail`` narrowed by ``matchConditions``
to pods that reference claims or request ``nvidia.com/mig-*``, because a MIG pod admitted without the
gate cannot be repaired and kube-scheduler would race our allocator. Each replica serves the webhook
from its caches, so an answer never waits for the leader.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from api import wire
from api.names import (
    CLASSIC_RESOURCE_PREFIX,
    DELETE_PROTECTION_FINALIZER,
    SCHEDULING_GATE,
    SYSTEM_NAMESPACE,
    classic_resource_name,
    is_our_device_class_name,
)
from controller.allocation.cel_library import Quantity
from driver.cluster import views
from driver.cluster.views import ClaimSpecView, PodView
from driver.errors import ConfigError, DriverError

_log = logging.getLogger(__name__)

SKIPPED_NAMESPACES: Final = frozenset(
    {"kube-system", "kube-public", "kube-node-lease", SYSTEM_NAMESPACE}
)
ADMISSION_API_VERSION: Final = "admission.k8s.io/v1"


class MalformedReviewError(ConfigError):
    """The body is not an ``AdmissionReview`` with a request we can answer (HTTP 400)."""


class AdmissionContext(Protocol):
    """What the webhook reads from the cluster; implementations answer from informer caches."""

    def claim_device_classes(self, *, namespace: str, name: str) -> Sequence[str] | None:
        """DeviceClass names used by a ResourceClaim's requests; ``None`` if there is no such claim."""
        ...

    def template_device_classes(self, *, namespace: str, name: str) -> Sequence[str] | None:
        """The same for a ResourceClaimTemplate; ``None`` if there is no such template."""
        ...

    def our_device_classes(self) -> frozenset[str]:
        """Names of the DeviceClasses our driver serves."""
        ...

    def known_profiles(self) -> frozenset[str]:
        """MIG profile names that exist: published by any node, or in the built-in catalog."""
        ...

    def max_slices_per_gpu(self, profile: str) -> int:
        """The most slices of ``profile`` one published GPU can hold; 0 when no GPU offers it now."""
        ...


def device_classes_of_claim_spec(spec: Mapping[str, Any]) -> list[str]:
    """Every DeviceClass a ``ResourceClaimSpec`` names (``exactly`` and ``firstAvailable``; v1beta1
    flat ``deviceClassName`` too), for ``AdmissionContext`` implementations."""
    return list(ClaimSpecView.parse(spec).device_class_names())


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    allowed: bool
    patch: list[wire.JsonPatchOperation] | None = None
    message: str = ""
    warnings: tuple[str, ...] = field(default=())


def review_pod(review: Mapping[str, Any], context: AdmissionContext) -> wire.AdmissionReview:
    """Answer one ``AdmissionReview`` (v1) for a pod or a ResourceClaim; ``MalformedReviewError``
    if it is not one."""
    request = views.path(review, "request")
    uid = views.path(request, "uid")
    if not isinstance(request, Mapping) or not isinstance(uid, str):
        raise MalformedReviewError("body is not an AdmissionReview with request.uid")
    decision = decide(request, context)
    response: wire.AdmissionResponse = {"uid": uid, "allowed": decision.allowed}
    if decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(decision.patch).encode()).decode()
    if not decision.allowed:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": decision.message}
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": response}


def decide(request: Mapping[str, Any], context: AdmissionContext) -> AdmissionDecision:
    """The decision for one ``AdmissionReview.request`` (an envelope, read leniently; the pod
    through ``PodView``, which never fails on an unvalidated object)."""
    obj = views.path(request, "object")
    kind = views.path(request, "kind")
    if views.path(request, "operation") != "CREATE" or not isinstance(obj, Mapping):
        return AdmissionDecision(allowed=True)
    if isinstance(kind, Mapping) and views.path(kind, "kind") == "ResourceClaim":
        return _protect_claim(request, obj, context)
    if isinstance(kind, Mapping) and views.path(kind, "kind") not in (None, "Pod"):
        return AdmissionDecision(allowed=True)
    pod = PodView.of(dict(obj))
    namespace = views.text(views.path(request, "namespace")) or pod.namespace or "default"
    if namespace in SKIPPED_NAMESPACES or not isinstance(views.path(obj, "spec"), Mapping):
        return AdmissionDecision(allowed=True)
    if pod.gated_by(SCHEDULING_GATE) or pod.node_name:
        return AdmissionDecision(allowed=True)

    problems, classic = _classic_requests(pod, context)
    if problems:
        return AdmissionDecision(allowed=False, message="; ".join(problems))
    ours, warnings = _references_our_claims(pod, namespace, context)
    if not (classic or ours):
        return AdmissionDecision(allowed=True)
    # JSONPatch appends to an array that exists; otherwise it must create the array
    gate: wire.PodSchedulingGate = {"name": SCHEDULING_GATE}
    patch: list[wire.JsonPatchOperation]
    if isinstance(views.path(obj, "spec", "schedulingGates"), list):
        patch = [{"op": "add", "path": "/spec/schedulingGates/-", "value": gate}]
    else:
        patch = [{"op": "add", "path": "/spec/schedulingGates", "value": [gate]}]
    _log.debug("gating pod %s/%s", namespace, pod.name or "<generated>")
    return AdmissionDecision(allowed=True, patch=patch, warnings=tuple(warnings))


def _protect_claim(
    request: Mapping[str, Any], obj: Mapping[str, Any], context: AdmissionContext
) -> AdmissionDecision:
    """Add the delete-protection finalizer to a new claim of ours (the module docstring)."""
    metadata = views.path(obj, "metadata")
    namespace = views.text(views.path(request, "namespace")) or views.text(
        views.path(metadata, "namespace")
    )
    spec = views.path(obj, "spec")
    if namespace in SKIPPED_NAMESPACES or not isinstance(spec, Mapping):
        return AdmissionDecision(allowed=True)
    finalizers = views.path(metadata, "finalizers")
    if isinstance(finalizers, list) and DELETE_PROTECTION_FINALIZER in finalizers:
        return AdmissionDecision(allowed=True)
    if not _names_our_class(device_classes_of_claim_spec(spec), context.our_device_classes()):
        return AdmissionDecision(allowed=True)
    patch: list[wire.JsonPatchOperation]
    if isinstance(finalizers, list):
        patch = [
            {"op": "add", "path": "/metadata/finalizers/-", "value": DELETE_PROTECTION_FINALIZER}
        ]
    else:
        patch = [
            {"op": "add", "path": "/metadata/finalizers", "value": [DELETE_PROTECTION_FINALIZER]}
        ]
    return AdmissionDecision(allowed=True, patch=patch)


def _classic_requests(pod: PodView, context: AdmissionContext) -> tuple[list[str], bool]:
    """(problems, whether any container asks for a MIG slice)."""
    problems: list[str] = []
    wants = False
    profiles_by_resource: dict[str, str] | None = None
    for container in pod.all_containers:
        where = f"container {container.name or '?'!r}"
        limits, requests = container.limits, container.requests
        for resource in sorted(container.resource_names()):
            if not resource.startswith(CLASSIC_RESOURCE_PREFIX):
                continue
            if profiles_by_resource is None:
                profiles_by_resource = {
                    classic_resource_name(profile): profile for profile in context.known_profiles()
                }
            count, problem = _count(resource, limits.get(resource), requests.get(resource))
            if problem:
                problems.append(f"{where}: {problem}")
                continue
            if count == 0:
                continue
            profile = profiles_by_resource.get(resource)
            if profile is None:
                known = ", ".join(sorted(profiles_by_resource)) or "none"
                problems.append(f"{where}: {resource} is an unknown MIG profile (known: {known})")
                continue
            largest = context.max_slices_per_gpu(profile)
            if 0 < largest < count:
                problems.append(
                    f"{where}: {resource}: {count} slices can never fit, the largest GPU in the "
                    f"cluster holds {largest} of profile {profile}"
                )
                continue
            wants = True
    return problems, wants


def _count(resource: str, limit: str | None, request: str | None) -> tuple[int, str]:
    if limit is None:
        return (
            0,
            f"{resource} is requested without a limit (extended resources need limits == requests)",
        )
    parsed_limit = _whole_number(limit)
    if parsed_limit is None:
        return 0, f"{resource} must be a non-negative whole number, got {limit!r}"
    if request is not None:
        parsed_request = _whole_number(request)
        if parsed_request != parsed_limit:
            return 0, f"{resource}: requests ({request!r}) must equal limits ({limit!r})"
    return parsed_limit, ""


def _whole_number(value: str) -> int | None:
    try:
        number = Quantity.parse(value).value
    except ValueError:
        return None
    if number.denominator != 1 or number < 0:
        return None
    return int(number)


def _references_our_claims(
    pod: PodView, namespace: str, context: AdmissionContext
) -> tuple[bool, list[str]]:
    """(whether the pod uses one of our classes — or might, see the module docstring; warnings)."""
    if not pod.claim_refs:
        return False, []
    ours = context.our_device_classes()
    warnings: list[str] = []
    for reference in pod.claim_refs:
        try:
            if reference.claim_name:
                kind, name = "ResourceClaim", reference.claim_name
                classes = context.claim_device_classes(namespace=namespace, name=name)
            elif reference.template_name:
                kind, name = "ResourceClaimTemplate", reference.template_name
                classes = context.template_device_classes(namespace=namespace, name=name)
            else:
                continue
        except DriverError as exc:
            _log.warning("cannot resolve a claim of a pod in %s, gating it: %s", namespace, exc)
            classes = None
        if classes is None:
            warnings.append(
                f"{kind} {namespace}/{name} does not exist yet; the pod waits behind the "
                f"{SCHEDULING_GATE} gate until the InstaSlice controller has seen it"
            )
            return True, warnings
        if _names_our_class(classes, ours):
            return True, warnings
    return False, warnings


def _names_our_class(classes: Sequence[str], ours: frozenset[str]) -> bool:
    """Whether ``classes`` name one of our DeviceClasses — a class of our domain that does not
    exist (yet) is ours too, as for the controller."""
    return bool(ours.intersection(classes)) or any(is_our_device_class_name(c) for c in classes)
