"""The validation rules of kube-apiserver that our components can trip over.

Not a full port of Kubernetes validation: names, labels and finalizers for every kind; for pods the
update rules (scheduling gates only removable, ``nodeSelector`` only while gated, spec otherwise
immutable but for images, tolerations additions and ``activeDeadlineSeconds``); for
``resource.k8s.io`` the claim/template spec immutability, the set-once allocation and the
ResourceSlice shape rules (devices xor sharedCounters, per-slice limits); webhook configurations'
required fields. Each function returns the list of violations; empty means valid.
"""

from __future__ import annotations

import re
from typing import Any

from localcluster.errors import FieldError
from localcluster.resources import ResourceType

JsonObj = dict[str, Any]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_LABEL_KINDS = {("", "namespaces"), ("", "services")}

POD_UPDATE_FORBIDDEN = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
    "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
    "(allow it to be set to 1 if it was previously negative)"
)
IMMUTABLE = "field is immutable"
MAX_SLICE_DEVICES = 128
MAX_SLICE_DEVICES_WITH_COUNTERS = 64


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
    errors += _KIND_CREATE.get(key, _none)(new)
    check = _KIND_UPDATE.get(key)
    return errors + (check(old, new) if check else [])


def _none(_: JsonObj) -> list[FieldError]:
    return []


def _name_errors(field: str, name: str, *, label: bool) -> list[FieldError]:
    pattern, limit = (_DNS_LABEL, 63) if label else (_DNS_SUBDOMAIN, 253)
    if len(name) > limit or not pattern.match(name):
        chars = "'-'" if label else "'-' or '.'"
        kind = "label" if label else "subdomain"
        detail = (
            f"a lowercase RFC 1123 {kind} must consist of lower case alphanumeric characters, "
            f"{chars}, and must start and end with an alphanumeric character (at most {limit} "
            "characters)"
        )
        return [FieldError("Invalid", field, detail, name)]
    return []


def _qualified_name_errors(field: str, key: str) -> list[FieldError]:
    prefix, slash, name = key.rpartition("/")
    bad = not _QUALIFIED_NAME.match(name) or len(name) > 63
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        bad = True
    if bad:
        return [
            FieldError(
                "Invalid",
                field,
                "name part must consist of alphanumeric characters, "
                "'-', '_' or '.', and must start and end with an alphanumeric "
                "character",
                key,
            )
        ]
    return []


def _metadata(resource: ResourceType, obj: JsonObj) -> list[FieldError]:
    meta = obj.get("metadata") or {}
    errors: list[FieldError] = []
    name = meta.get("name")
    if not name:
        errors.append(FieldError("Required", "metadata.name", "name or generateName is required"))
    elif resource.plural != "events":
        label = (resource.group, resource.plural) in _DNS_LABEL_KINDS
        errors += _name_errors("metadata.name", str(name), label=label)
    for key, value in (meta.get("labels") or {}).items():
        errors += _qualified_name_errors("metadata.labels", str(key))
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
        errors += _qualified_name_errors("metadata.annotations", str(key))
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
                errors += _name_errors(f"{path}.name", name, label=True)
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
        errors += _qualified_name_errors(f"spec.schedulingGates[{i}].name", gate)
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


# --- resource.k8s.io ----------------------------------------------------------------------------


def _claim_spec(spec: Any, path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    devices = spec.get("devices") if isinstance(spec, dict) else None
    requests = (devices or {}).get("requests") or []
    names: list[str] = []
    for i, request in enumerate(requests):
        rpath = f"{path}.devices.requests[{i}]"
        name = str(request.get("name") or "") if isinstance(request, dict) else ""
        if not name:
            errors.append(FieldError("Required", f"{rpath}.name"))
        elif name in names:
            errors.append(FieldError("Duplicate", f"{rpath}.name", value=name))
        names.append(name)
        if not isinstance(request, dict):
            continue
        exactly, first = request.get("exactly"), request.get("firstAvailable")
        if (exactly is None) == (first is None):
            errors.append(
                FieldError(
                    "Required", rpath, "exactly one of `exactly` or `firstAvailable` is required"
                )
            )
        elif isinstance(exactly, dict):
            if not exactly.get("deviceClassName"):
                errors.append(FieldError("Required", f"{rpath}.exactly.deviceClassName"))
            mode = exactly.get("allocationMode", "ExactCount")
            if mode not in ("ExactCount", "All"):
                errors.append(
                    FieldError(
                        "NotSupported",
                        f"{rpath}.exactly.allocationMode",
                        'supported values: "All", "ExactCount"',
                        mode,
                    )
                )
    if len(requests) > 32:
        errors.append(
            FieldError(
                "TooMany", f"{path}.devices.requests", "must have at most 32 items", len(requests)
            )
        )
    return errors


def _claim_create(claim: JsonObj) -> list[FieldError]:
    return _claim_spec(claim.get("spec") or {}, "spec")


def _spec_immutable(old: JsonObj, new: JsonObj) -> list[FieldError]:
    if old.get("spec") != new.get("spec"):
        return [FieldError("Invalid", "spec", IMMUTABLE, new.get("spec"))]
    return []


def _claim_status_update(old: JsonObj, new: JsonObj) -> list[FieldError]:
    errors: list[FieldError] = []
    old_alloc = (old.get("status") or {}).get("allocation")
    status = new.get("status") or {}
    alloc = status.get("allocation")
    if old_alloc is not None and alloc is not None and old_alloc != alloc:
        errors.append(FieldError("Invalid", "status.allocation", IMMUTABLE, alloc))
    reserved = status.get("reservedFor") or []
    if reserved and alloc is None:
        errors.append(
            FieldError(
                "Forbidden",
                "status.reservedFor",
                "may not be specified when `allocated` is not set",
            )
        )
    uids = [r.get("uid") for r in reserved if isinstance(r, dict)]
    for i, uid in enumerate(uids):
        if uid in uids[:i]:
            errors.append(FieldError("Duplicate", f"status.reservedFor[{i}]", value=uid))
    if len(reserved) > 256:
        errors.append(
            FieldError(
                "TooMany", "status.reservedFor", "must have at most 256 items", len(reserved)
            )
        )
    if isinstance(alloc, dict) and alloc != old_alloc:
        requests = ((new.get("spec") or {}).get("devices") or {}).get("requests") or []
        names = {r.get("name") for r in requests if isinstance(r, dict)}
        results = (alloc.get("devices") or {}).get("results") or []
        for i, result in enumerate(results):
            request = str((result or {}).get("request") or "").split("/", 1)[0]
            if request not in names:
                errors.append(
                    FieldError(
                        "Invalid",
                        f"status.allocation.devices.results[{i}].request",
                        "must be the name of a request in the "
                        "claim or the name of a request and a subrequest "
                        "separated by '/'",
                        request,
                    )
                )
    return errors


def _template_create(template: JsonObj) -> list[FieldError]:
    return _claim_spec(((template.get("spec") or {}).get("spec")) or {}, "spec.spec")


def _slice_create(slice_: JsonObj) -> list[FieldError]:
    spec = slice_.get("spec") or {}
    errors: list[FieldError] = []
    if not spec.get("driver"):
        errors.append(FieldError("Required", "spec.driver"))
    pool = spec.get("pool") or {}
    if not pool.get("name"):
        errors.append(FieldError("Required", "spec.pool.name"))
    if int(pool.get("resourceSliceCount") or 0) <= 0:
        errors.append(
            FieldError(
                "Invalid",
                "spec.pool.resourceSliceCount",
                "must be greater than zero",
                pool.get("resourceSliceCount"),
            )
        )
    selectors = [
        k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)
    ]
    if len(selectors) != 1:
        errors.append(
            FieldError(
                "Invalid",
                "spec",
                "exactly one of `nodeName`, "
                "`nodeSelector`, `allNodes`, `perDeviceNodeSelection` is "
                "required",
                selectors,
            )
        )
    devices = spec.get("devices") or []
    counters = spec.get("sharedCounters") or []
    if devices and counters:
        errors.append(
            FieldError("Invalid", "spec", "only one of `devices` and `sharedCounters` can be set")
        )
    if len(counters) > 8:
        errors.append(
            FieldError("TooMany", "spec.sharedCounters", "must have at most 8 items", len(counters))
        )
    counted = any(
        isinstance(d, dict) and (d.get("consumesCounters") or d.get("taints")) for d in devices
    )
    limit = MAX_SLICE_DEVICES_WITH_COUNTERS if counted else MAX_SLICE_DEVICES
    if len(devices) > limit:
        errors.append(
            FieldError("TooMany", "spec.devices", f"must have at most {limit} items", len(devices))
        )
    names: set[str] = set()
    for i, device in enumerate(devices):
        name = str((device or {}).get("name") or "")
        if not name:
            errors.append(FieldError("Required", f"spec.devices[{i}].name"))
        elif name in names:
            errors.append(FieldError("Duplicate", f"spec.devices[{i}].name", value=name))
        else:
            errors += _name_errors(f"spec.devices[{i}].name", name, label=True)
        names.add(name)
        attributes = (device or {}).get("attributes") or {}
        capacity = (device or {}).get("capacity") or {}
        if len(attributes) + len(capacity) > 32:
            errors.append(
                FieldError(
                    "TooMany",
                    f"spec.devices[{i}]",
                    "attributes and capacity must have at most 32 entries combined",
                    len(attributes) + len(capacity),
                )
            )
        for key, attribute in attributes.items():
            if not isinstance(attribute, dict) or len(attribute) != 1:
                errors.append(
                    FieldError(
                        "Invalid",
                        f"spec.devices[{i}].attributes[{key}]",
                        "exactly one value must be specified",
                    )
                )
        if len((device or {}).get("consumesCounters") or []) > 2:
            errors.append(
                FieldError(
                    "TooMany", f"spec.devices[{i}].consumesCounters", "must have at most 2 items"
                )
            )
    return errors


def _slice_update(old: JsonObj, new: JsonObj) -> list[FieldError]:
    errors: list[FieldError] = []
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    for field in ("driver", "nodeName"):
        if old_spec.get(field) != new_spec.get(field):
            errors.append(FieldError("Invalid", f"spec.{field}", IMMUTABLE, new_spec.get(field)))
    return errors


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
    ("resource.k8s.io", "resourceclaims"): _claim_create,
    ("resource.k8s.io", "resourceclaimtemplates"): _template_create,
    ("resource.k8s.io", "resourceslices"): _slice_create,
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): _webhook_configuration,
    ("", "events"): _core_event,
    ("events.k8s.io", "events"): _new_event,
}
_KIND_UPDATE = {
    ("", "pods"): _pod_update,
    ("resource.k8s.io", "resourceclaims"): _spec_immutable,
    ("resource.k8s.io", "resourceclaimtemplates"): _spec_immutable,
    ("resource.k8s.io", "resourceslices"): _slice_update,
}
_KIND_STATUS_UPDATE = {
    ("resource.k8s.io", "resourceclaims"): _claim_status_update,
}
