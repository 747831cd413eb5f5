"""The ``resource.k8s.io/v1`` rules of kube-apiserver that matter to a DRA driver.

A claim's (and a template's) spec is immutable; a claim's ``status.allocation`` can be set once and
cleared, never replaced, ``reservedFor`` needs an allocation and each result must name a request,
each ``status.devices`` entry must name an allocated device;
a ResourceSlice holds either ``devices`` or ``sharedCounters``, at most 128 devices (64 when any
device consumes counters or has taints), and its driver and node are immutable. CEL selectors of
requests and DeviceClasses must compile (kube-apiserver compiles them on create: a claim with a
malformed selector never reaches an allocator), and an exact count must be positive (``0`` is
defaulted to 1 before: ``defaults_dra``). Device taints
(``key`` a label key, ``value`` a label value, ``effect`` one of NoSchedule/NoExecute/None, at most
16) and request tolerations (operator ``Exists`` without a value or ``Equal``, at most 16) are
checked as kube-apiserver's ``validateDeviceTaint``/``validateDeviceToleration`` do.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from controller.allocation.selectors import SelectorCompileError, compile_selector
from localcluster.errors import FieldError
from localcluster.names import label_value_errors, name_errors, qualified_name_errors

JsonObj = dict[str, Any]

IMMUTABLE = "field is immutable"
MAX_SLICE_DEVICES = 128
MAX_SLICE_DEVICES_WITH_COUNTERS = 64
MAX_TAINTS = 16
MAX_TOLERATIONS = 16
TAINT_EFFECTS = ("NoExecute", "NoSchedule", "None")
TOLERATION_OPERATORS = ("Equal", "Exists")


def _effect_errors(path: str, effect: Any, *, required: bool) -> list[FieldError]:
    if not effect:
        return [FieldError("Required", path)] if required else []
    if effect not in TAINT_EFFECTS:
        supported = ", ".join(f'"{e}"' for e in TAINT_EFFECTS)
        return [FieldError("NotSupported", path, f"supported values: {supported}", effect)]
    return []


def _taint_errors(taints: Any, path: str) -> list[FieldError]:
    if not isinstance(taints, list):
        return [FieldError("Invalid", path, "must be a list", taints)]
    errors: list[FieldError] = []
    if len(taints) > MAX_TAINTS:
        errors.append(FieldError("TooMany", path, f"must have at most {MAX_TAINTS} items"))
    for i, taint in enumerate(taints):
        tpath = f"{path}[{i}]"
        if not isinstance(taint, dict):
            errors.append(FieldError("Invalid", tpath, "must be an object", taint))
            continue
        key = str(taint.get("key") or "")
        if not key:
            errors.append(FieldError("Required", f"{tpath}.key"))
        else:
            errors += qualified_name_errors(f"{tpath}.key", key)
        if taint.get("value"):
            errors += label_value_errors(f"{tpath}.value", str(taint["value"]))
        errors += _effect_errors(f"{tpath}.effect", taint.get("effect"), required=True)
        added = taint.get("timeAdded")
        if added is not None and not _is_time(added):
            errors.append(FieldError("Invalid", f"{tpath}.timeAdded", "must be RFC 3339", added))
    return errors


def _is_time(value: Any) -> bool:
    try:
        datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def _toleration_errors(tolerations: Any, path: str) -> list[FieldError]:
    if not isinstance(tolerations, list):
        return [FieldError("Invalid", path, "must be a list", tolerations)]
    errors: list[FieldError] = []
    if len(tolerations) > MAX_TOLERATIONS:
        errors.append(FieldError("TooMany", path, f"must have at most {MAX_TOLERATIONS} items"))
    for i, toleration in enumerate(tolerations):
        tpath = f"{path}[{i}]"
        if not isinstance(toleration, dict):
            errors.append(FieldError("Invalid", tpath, "must be an object", toleration))
            continue
        if toleration.get("key"):
            errors += qualified_name_errors(f"{tpath}.key", str(toleration["key"]))
        operator = toleration.get("operator") or "Equal"  # defaulted, as kube-apiserver does
        value = str(toleration.get("value") or "")
        if operator == "Exists" and value:
            errors.append(
                FieldError(
                    "Invalid", f"{tpath}.value", "must be empty for operator `Exists`", value
                )
            )
        elif operator == "Equal":
            errors += label_value_errors(f"{tpath}.value", value)
        elif operator not in TOLERATION_OPERATORS:
            supported = ", ".join(f'"{o}"' for o in TOLERATION_OPERATORS)
            errors.append(
                FieldError(
                    "NotSupported", f"{tpath}.operator", f"supported values: {supported}", operator
                )
            )
        errors += _effect_errors(f"{tpath}.effect", toleration.get("effect"), required=False)
    return errors


def _request_tolerations(request: JsonObj, rpath: str) -> list[FieldError]:
    errors: list[FieldError] = []
    exactly = request.get("exactly")
    if isinstance(exactly, dict) and "tolerations" in exactly:
        errors += _toleration_errors(exactly["tolerations"], f"{rpath}.exactly.tolerations")
    for j, sub in enumerate(request.get("firstAvailable") or []):
        if isinstance(sub, dict) and "tolerations" in sub:
            errors += _toleration_errors(
                sub["tolerations"], f"{rpath}.firstAvailable[{j}].tolerations"
            )
    return errors


def _selectors(selectors: Any, path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    for i, selector in enumerate(selectors if isinstance(selectors, list) else []):
        expression = ((selector or {}).get("cel") or {}).get("expression")
        epath = f"{path}[{i}].cel.expression"
        if not isinstance(expression, str) or not expression:
            errors.append(FieldError("Required", epath))
            continue
        try:
            compile_selector(expression)
        except SelectorCompileError as exc:
            errors.append(FieldError("Invalid", epath, f"compilation failed: {exc}", expression))
    return errors


def _exact(exactly: JsonObj, path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    if not exactly.get("deviceClassName"):
        errors.append(FieldError("Required", f"{path}.deviceClassName"))
    mode = exactly.get("allocationMode", "ExactCount")
    if mode not in ("ExactCount", "All"):
        errors.append(
            FieldError(
                "NotSupported",
                f"{path}.allocationMode",
                'supported values: "All", "ExactCount"',
                mode,
            )
        )
    count = exactly.get("count")
    if mode == "ExactCount" and count is not None and (not isinstance(count, int) or count < 1):
        errors.append(FieldError("Invalid", f"{path}.count", "must be greater than zero", count))
    return errors + _selectors(exactly.get("selectors"), f"{path}.selectors")


def device_class(obj: JsonObj) -> list[FieldError]:
    return _selectors((obj.get("spec") or {}).get("selectors"), "spec.selectors")


def device_class_update(old: JsonObj, new: JsonObj) -> list[FieldError]:
    del old
    return device_class(new)


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
        errors += _request_tolerations(request, rpath)
        exactly, first = request.get("exactly"), request.get("firstAvailable")
        if (exactly is None) == (first is None):
            errors.append(
                FieldError(
                    "Required", rpath, "exactly one of `exactly` or `firstAvailable` is required"
                )
            )
        elif isinstance(exactly, dict):
            errors += _exact(exactly, f"{rpath}.exactly")
        elif isinstance(first, list):
            for j, sub in enumerate(first):
                if isinstance(sub, dict):
                    errors += _exact(sub, f"{rpath}.firstAvailable[{j}]")
    if len(requests) > 32:
        errors.append(
            FieldError(
                "TooMany", f"{path}.devices.requests", "must have at most 32 items", len(requests)
            )
        )
    return errors


def claim_create(claim: JsonObj) -> list[FieldError]:
    return _claim_spec(claim.get("spec") or {}, "spec")


def spec_immutable(old: JsonObj, new: JsonObj) -> list[FieldError]:
    if old.get("spec") != new.get("spec"):
        return [FieldError("Invalid", "spec", IMMUTABLE, new.get("spec"))]
    return []


def claim_status_update(old: JsonObj, new: JsonObj) -> list[FieldError]:
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
    errors += _device_statuses(status.get("devices") or [], alloc)
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


def _device_statuses(devices: list[Any], alloc: Any) -> list[FieldError]:
    """``status.devices`` (DRAResourceClaimDeviceStatus): each entry names an allocated device
    (driver, pool, device, shareID) once; ``data`` is a JSON object."""
    results = ((alloc or {}).get("devices") or {}).get("results") or []
    allocated = {
        (r.get("driver"), r.get("pool"), r.get("device"), r.get("shareID"))
        for r in results
        if isinstance(r, dict)
    }
    errors: list[FieldError] = []
    seen: list[tuple[Any, ...]] = []
    for i, entry in enumerate(devices):
        path = f"status.devices[{i}]"
        if not isinstance(entry, dict):
            errors.append(FieldError("Invalid", path, "must be an object", entry))
            continue
        key = (entry.get("driver"), entry.get("pool"), entry.get("device"), entry.get("shareID"))
        if key not in allocated:
            errors.append(
                FieldError("Invalid", path, "must be an allocated device in the claim", key[:3])
            )
        elif key in seen:
            errors.append(FieldError("Duplicate", path, value=key[:3]))
        seen.append(key)
        if "data" in entry and not isinstance(entry["data"], dict):
            errors.append(
                FieldError("Invalid", f"{path}.data", "must be a valid JSON object", entry["data"])
            )
    return errors


def template_create(template: JsonObj) -> list[FieldError]:
    return _claim_spec(((template.get("spec") or {}).get("spec")) or {}, "spec.spec")


def slice_create(slice_: JsonObj) -> list[FieldError]:
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
            errors += name_errors(f"spec.devices[{i}].name", name, label=True)
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
        if isinstance(device, dict) and device.get("taints") is not None:
            errors += _taint_errors(device["taints"], f"spec.devices[{i}].taints")
        if len((device or {}).get("consumesCounters") or []) > 2:
            errors.append(
                FieldError(
                    "TooMany", f"spec.devices[{i}].consumesCounters", "must have at most 2 items"
                )
            )
    return errors


def slice_update(old: JsonObj, new: JsonObj) -> list[FieldError]:
    errors: list[FieldError] = []
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    for field in ("driver", "nodeName"):
        if old_spec.get(field) != new_spec.get(field):
            errors.append(FieldError("Invalid", f"spec.{field}", IMMUTABLE, new_spec.get(field)))
    return errors
