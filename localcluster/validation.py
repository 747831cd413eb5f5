"""The validation rules of kube-apiserver that our components can trip over.

Not a full port of Kubernetes validation: names, labels and finalizers for every kind; for pods the
update rules (scheduling gates only removable, ``nodeSelector`` only while gated, spec otherwise
immutable but for images, tolerations additions and ``activeDeadlineSeconds``); for
``resource.k8s.io`` the claim/template spec immutability, the set-once allocation and the
ResourceSlice shape rules (devices xor sharedCounters, per-slice limits); webhook configurations'
required fields; PodDisruptionBudgets' spec and status (``policy/validation.py``);
PriorityClasses (``scheduling/validation.py``). Each function returns the list of violations; empty
means valid.
"""

from __future__ import annotations

import re
from typing import Any

from localcluster import validation_dra as dra
from localcluster.errors import FieldError
from localcluster.names import name_errors, qualified_name_errors
from localcluster.policy import validation as policy
from localcluster.resources import ResourceType
from localcluster.scheduling import validation as scheduling

JsonObj = dict[str, Any]

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_LABEL_KINDS = {("", "namespaces"), ("", "services")}

POD_UPDATE_FORBIDDEN = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
    "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
    "(allow it to be set to 1 if it was previously negative)"
)


def validate_create(resource: ResourceType, obj: JsonObj) -> list[FieldError]:
    errors = _metadata(resource, obj)
    errors += _KIND_CREATE.get((resource.group, resource.plural), _none)(obj)
    return errors


def validate_update(
    resource: ResourceType, old: JsonObj, new: JsonObj, *, subresource: str | None
) -> list[FieldError]:
    errors = _metadata(resource, new) + _finalizers_update(old, new)
    key = (resource.group, resource.plural)
    if subresource == "status":
        check = _KIND_STATUS_UPDATE.get(key)
        return errors + (check(old, new) if check else [])
    if key not in _CREATE_RULES_ON_CREATE_ONLY:
        errors += _KIND_CREATE.get(key, _none)(new)
    check = _KIND_UPDATE.get(key)
    return errors + (check(old, new) if check else [])


def _none(_: JsonObj) -> list[FieldError]:
    return []


def _metadata(resource: ResourceType, obj: JsonObj) -> list[FieldError]:
    meta = obj.get("metadata") or {}
    errors: list[FieldError] = []
    name = meta.get("name")
    if not name:
        errors.append(FieldError("Required", "metadata.name", "name or generateName is required"))
    elif resource.plural != "events":
        label = (resource.group, resource.plural) in _DNS_LABEL_KINDS
        errors += name_errors("metadata.name", str(name), label=label)
    for key, value in (meta.get("labels") or {}).items():
        errors += qualified_name_errors("metadata.labels", str(key))
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            errors.append(
                FieldError(
                    "Invalid",
                    "metadata.labels",
                    "a valid label must be an "
                    "empty string or consist of alphanumeric characters, '-', "
                    "'_' or '.' (at most 63 characters)",
                    value,
                )
            )
    for key in meta.get("annotations") or {}:
        errors += qualified_name_errors("metadata.annotations", str(key))
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for field in ("apiVersion", "kind", "name", "uid"):
            if not (isinstance(ref, dict) and ref.get(field)):
                errors.append(FieldError("Required", f"metadata.ownerReferences[{i}].{field}"))
    return errors


def _finalizers_update(old: JsonObj, new: JsonObj) -> list[FieldError]:
    old_meta = old.get("metadata") or {}
    if not old_meta.get("deletionTimestamp"):
        return []
    before = set(old_meta.get("finalizers") or [])
    added = [f for f in (new.get("metadata") or {}).get("finalizers") or [] if f not in before]
    if added:
        return [
            FieldError(
                "Forbidden",
                "metadata.finalizers",
                f"no new finalizers can be added if the object is being deleted, "
                f"found new finalizers {added!r}",
            )
        ]
    return []


# --- pods ---------------------------------------------------------------------------------------


def _gate_names(spec: JsonObj) -> list[str]:
    return [str(g.get("name")) for g in spec.get("schedulingGates") or [] if isinstance(g, dict)]


def _pod_create(pod: JsonObj) -> list[FieldError]:
    spec = pod.get("spec") or {}
    errors: list[FieldError] = []
    containers = spec.get("containers") or []
    if not containers:
        errors.append(FieldError("Required", "spec.containers"))
    seen: set[str] = set()
    for field in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(field) or []):
            path = f"spec.{field}[{i}]"
            if not isinstance(container, dict):
                errors.append(FieldError("Invalid", path, "must be an object"))
                continue
            name = str(container.get("name") or "")
            if not name:
                errors.append(FieldError("Required", f"{path}.name"))
            elif name in seen:
                errors.append(FieldError("Duplicate", f"{path}.name", value=name))
            else:
                errors += name_errors(f"{path}.name", name, label=True)
            seen.add(name)
            if field == "containers" and not container.get("image"):
                errors.append(FieldError("Required", f"{path}.image"))
    gates = _gate_names(spec)
    if gates and spec.get("nodeName"):
        errors.append(
            FieldError(
                "Forbidden",
                "spec.nodeName",
                "cannot be set until all schedulingGates have been cleared",
            )
        )
    for i, gate in enumerate(gates):
        if gate in gates[:i]:
            errors.append(FieldError("Duplicate", f"spec.schedulingGates[{i}]", value=gate))
        errors += qualified_name_errors(f"spec.schedulingGates[{i}].name", gate)
    return errors


def _pod_update(old: JsonObj, new: JsonObj) -> list[FieldError]:
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    errors: list[FieldError] = []
    old_gates = _gate_names(old_spec)
    for gate in _gate_names(new_spec):
        if gate not in old_gates:
            errors.append(
                FieldError(
                    "Forbidden",
                    "spec.schedulingGates",
                    f"only deletion is allowed, but found new scheduling gate '{gate}'",
                )
            )
    gated = bool(old_gates)
    old_selector = old_spec.get("nodeSelector") or {}
    new_selector = new_spec.get("nodeSelector") or {}
    if gated and any(new_selector.get(k) != v for k, v in old_selector.items()):
        errors.append(
            FieldError(
                "Invalid",
                "spec.nodeSelector",
                "only additions to spec.nodeSelector are allowed (no mutations or deletions)",
                new_selector,
            )
        )
    old_tolerations = old_spec.get("tolerations") or []
    new_tolerations = new_spec.get("tolerations") or []
    tolerations_ok = all(t in new_tolerations for t in old_tolerations)
    if _masked_pod_spec(old_spec, gated=gated) != _masked_pod_spec(new_spec, gated=gated) or (
        not tolerations_ok
    ):
        errors.append(FieldError("Forbidden", "spec", POD_UPDATE_FORBIDDEN))
    return errors


def _masked_pod_spec(spec: JsonObj, *, gated: bool) -> JsonObj:
    masked = {
        k: v
        for k, v in spec.items()
        if k not in ("activeDeadlineSeconds", "tolerations", "schedulingGates")
    }
    if gated:
        masked.pop("nodeSelector", None)
        masked.pop("affinity", None)
    for field in ("containers", "initContainers"):
        if field in masked:
            masked[field] = [
                {k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c
                for c in masked[field]
            ]
    return masked


# --- events -------------------------------------------------------------------------------------


def _core_event(event: JsonObj) -> list[FieldError]:
    """core/v1 Event: old-style (no ``eventTime``) or new-style, as ``legacyValidateEvent``."""
    return _event_rules(
        event,
        subject=event.get("involvedObject") or {},
        subject_field="involvedObject.namespace",
        controller_field="reportingComponent",
    )


def _new_event(event: JsonObj) -> list[FieldError]:
    """events.k8s.io/v1 Event: always new-style, so eventTime and type are required too."""
    errors = _event_rules(
        event,
        subject=event.get("regarding") or {},
        subject_field="regarding.namespace",
        controller_field="reportingController",
    )
    if not event.get("eventTime"):
        errors.append(FieldError("Required", "eventTime"))
    if event.get("type") not in ("Normal", "Warning"):
        errors.append(FieldError("Invalid", "type", "has invalid value", event.get("type", "")))
    return errors


def _event_rules(
    event: JsonObj, *, subject: JsonObj, subject_field: str, controller_field: str
) -> list[FieldError]:
    errors: list[FieldError] = []
    namespace = str((event.get("metadata") or {}).get("namespace") or "")
    subject_ns = str(subject.get("namespace") or "")
    mismatch = FieldError("Invalid", subject_field, "does not match event.namespace", subject_ns)
    if not event.get("eventTime"):
        if (subject_ns and subject_ns != namespace) or (
            not subject_ns and namespace not in ("", "default")
        ):
            errors.append(mismatch)
        return errors
    if not subject_ns and namespace not in ("default", "kube-system"):
        errors.append(mismatch)
    for name in (controller_field, "reportingInstance", "action", "reason"):
        if not event.get(name):
            errors.append(FieldError("Required", name))
    return errors


# --- admission configuration --------------------------------------------------------------------


def _webhook_configuration(config: JsonObj) -> list[FieldError]:
    errors: list[FieldError] = []
    names: set[str] = set()
    for i, hook in enumerate(config.get("webhooks") or []):
        path = f"webhooks[{i}]"
        name = str((hook or {}).get("name") or "")
        if not name:
            errors.append(FieldError("Required", f"{path}.name"))
        elif name in names:
            errors.append(FieldError("Duplicate", f"{path}.name", value=name))
        names.add(name)
        client = (hook or {}).get("clientConfig") or {}
        if bool(client.get("url")) == bool(client.get("service")):
            errors.append(
                FieldError(
                    "Required", f"{path}.clientConfig", "exactly one of url or service is required"
                )
            )
        if (hook or {}).get("sideEffects") not in ("None", "NoneOnDryRun"):
            errors.append(
                FieldError(
                    "Required", f"{path}.sideEffects", 'must be one of "None", "NoneOnDryRun"'
                )
            )
        if "v1" not in ((hook or {}).get("admissionReviewVersions") or []):
            errors.append(
                FieldError(
                    "Required", f"{path}.admissionReviewVersions", "must include at least one of v1"
                )
            )
    return errors


_KIND_CREATE = {
    ("", "pods"): _pod_create,
    ("resource.k8s.io", "resourceclaims"): dra.claim_create,
    ("resource.k8s.io", "resourceclaimtemplates"): dra.template_create,
    ("resource.k8s.io", "resourceslices"): dra.slice_create,
    ("resource.k8s.io", "deviceclasses"): dra.device_class,
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): _webhook_configuration,
    ("", "events"): _core_event,
    ("events.k8s.io", "events"): _new_event,
    ("scheduling.k8s.io", "priorityclasses"): scheduling.priority_class,
    ("policy", "poddisruptionbudgets"): policy.budget,
}
_KIND_UPDATE = {
    ("", "pods"): _pod_update,
    ("resource.k8s.io", "resourceclaims"): dra.spec_immutable,
    ("resource.k8s.io", "resourceclaimtemplates"): dra.spec_immutable,
    ("resource.k8s.io", "resourceslices"): dra.slice_update,
    ("resource.k8s.io", "deviceclasses"): dra.device_class_update,
    ("scheduling.k8s.io", "priorityclasses"): scheduling.priority_class_update,
}
_CREATE_RULES_ON_CREATE_ONLY = frozenset({("scheduling.k8s.io", "priorityclasses")})
"""Kinds whose update validation does not repeat the create rules: kube's
``ValidatePriorityClassUpdate`` checks only immutability (and metadata)."""
_KIND_STATUS_UPDATE = {
    ("resource.k8s.io", "resourceclaims"): dra.claim_status_update,
    ("policy", "poddisruptionbudgets"): policy.status_update,
}
