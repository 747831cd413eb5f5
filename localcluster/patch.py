"""The three patch types kube-apiserver accepts for built-in kinds.

* JSON merge patch (RFC 7386): maps merge, ``null`` deletes, lists replace.
* Strategic merge patch: like merge patch, but the lists Kubernetes tags ``patchStrategy=merge``
  (containers by ``name``, conditions by ``type``, schedulingGates by ``name``, …) merge element by
  element on their merge key; directives ``$patch: replace|delete``, ``$retainKeys`` and
  ``$deleteFromPrimitiveList/<field>`` are honoured, ``$setElementOrder/<field>`` is accepted and
  ignored (merged lists keep the stored order, new elements appended).
* JSON patch (RFC 6902), including ``test``.

Functions never mutate their inputs: stored objects are shared and must stay unchanged.
"""

from __future__ import annotations

import copy
from typing import Any

from localcluster.errors import ApiError, bad_request

JsonObj = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"

# Merge keys of the lists Kubernetes' Go types tag ``patchStrategy:"merge"``, by field name.
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "volumes": "name",
    "schedulingGates": "name",
    "conditions": "type",
    "imagePullSecrets": "name",
    "resourceClaims": "name",
    "resourceClaimStatuses": "name",
    "hostAliases": "ip",
    "ownerReferences": "uid",
    "addresses": "type",
    "taints": "key",
    "reservedFor": "uid",
    "topologySpreadConstraints": "topologyKey",
    "podIPs": "ip",
    "readinessGates": "conditionType",
}
_CONTAINER_LISTS = {"containers", "initContainers", "ephemeralContainers"}
_PRIMITIVE_MERGE = {("metadata", "finalizers")}


class PatchFailedError(ApiError):
    """A well-formed patch that cannot be applied to this object (kube answers 422)."""

    def __init__(self, message: str) -> None:
        super().__init__(422, "Invalid", message)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return patch
    result: JsonObj = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _merge_key(path: tuple[str, ...]) -> str | None:
    name = path[-1]
    if name == "ports":
        return "containerPort" if len(path) > 1 and path[-2] in _CONTAINER_LISTS else "port"
    return _MERGE_KEYS.get(name)


def strategic_merge_patch(original: JsonObj, patch: Any) -> JsonObj:
    if not isinstance(patch, dict):
        raise bad_request("strategic merge patch must be a JSON object")
    merged = _merge_map(original, patch, ())
    if merged is None:
        raise bad_request("a strategic merge patch cannot delete the whole object")
    return merged


def _strip(value: Any) -> Any:
    """A patch value stored as is: drop directives a new subtree may carry."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not k.startswith("$") and v is not None}
    if isinstance(value, list):
        return [_strip(v) for v in value if not (isinstance(v, dict) and "$patch" in v)]
    return value


def _merge_map(original: JsonObj, patch: JsonObj, path: tuple[str, ...]) -> JsonObj | None:
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    if directive == "replace":
        return _strip(patch)  # type: ignore[no-any-return]
    if directive is not None:
        raise bad_request(f"unknown patch directive {directive!r} at {'.'.join(path) or '<root>'}")
    result: JsonObj = dict(original)
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            doomed = value if isinstance(value, list) else []
            result[field] = [v for v in result.get(field) or [] if v not in doomed]
            continue
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
            continue
        child = (*path, key)
        current = result.get(key)
        if isinstance(value, dict):
            if isinstance(current, dict):
                merged = _merge_map(current, value, child)
                if merged is None:
                    result.pop(key, None)
                else:
                    result[key] = merged
            elif value.get("$patch") != "delete":
                result[key] = _strip(value)
        elif isinstance(value, list):
            result[key] = _merge_list(current if isinstance(current, list) else [], value, child)
        else:
            result[key] = value
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(original: list[Any], patch: list[Any], path: tuple[str, ...]) -> list[Any]:
    if path in _PRIMITIVE_MERGE:
        return original + [v for v in patch if v not in original]
    key = _merge_key(path)
    if key is None:
        return _strip(patch)  # type: ignore[no-any-return]
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [_strip(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    result = list(original)
    for item in patch:
        if not isinstance(item, dict):
            raise bad_request(f"{'.'.join(path)}: list of maps expected by merge key {key!r}")
        index = next(
            (
                i
                for i, cur in enumerate(result)
                if isinstance(cur, dict) and cur.get(key) == item.get(key)
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append(_strip(item))
        else:
            merged = _merge_map(result[index], item, path)
            if merged is None:
                del result[index]
            else:
                result[index] = merged
    return result


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise bad_request(f"invalid JSON pointer {path!r}")
    if not path:
        return []
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], raw: str) -> Any:
    current = doc
    for part in parts[:-1]:
        current = _child(current, part, raw)
    return current


def _child(current: Any, part: str, raw: str) -> Any:
    if isinstance(current, dict):
        if part not in current:
            raise PatchFailedError(f"jsonpatch: path {raw!r} does not exist")
        return current[part]
    if isinstance(current, list):
        return current[_index(current, part, raw, allow_end=False)]
    raise PatchFailedError(f"jsonpatch: path {raw!r} does not exist")


def _index(items: list[Any], part: str, raw: str, *, allow_end: bool) -> int:
    if part == "-" and allow_end:
        return len(items)
    if not part.isdigit() or (len(part) > 1 and part.startswith("0")):
        raise PatchFailedError(f"jsonpatch: invalid array index in {raw!r}")
    index = int(part)
    limit = len(items) if allow_end else len(items) - 1
    if index > limit:
        raise PatchFailedError(f"jsonpatch: array index out of range in {raw!r}")
    return index


def _get(doc: Any, raw: str) -> Any:
    current = doc
    for part in _pointer(raw):
        current = _child(current, part, raw)
    return current


def _add(doc: Any, raw: str, value: Any) -> Any:
    parts = _pointer(raw)
    if not parts:
        return value
    parent = _parent(doc, parts, raw)
    if isinstance(parent, dict):
        parent[parts[-1]] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, parts[-1], raw, allow_end=True), value)
    else:
        raise PatchFailedError(f"jsonpatch: cannot add at {raw!r}")
    return doc


def _remove(doc: Any, raw: str) -> tuple[Any, Any]:
    parts = _pointer(raw)
    if not parts:
        raise PatchFailedError("jsonpatch: cannot remove the whole document")
    parent = _parent(doc, parts, raw)
    if isinstance(parent, dict):
        if parts[-1] not in parent:
            raise PatchFailedError(f"jsonpatch: remove of missing path {raw!r}")
        return doc, parent.pop(parts[-1])
    if isinstance(parent, list):
        return doc, parent.pop(_index(parent, parts[-1], raw, allow_end=False))
    raise PatchFailedError(f"jsonpatch: remove of missing path {raw!r}")


def json_patch(original: JsonObj, operations: Any) -> Any:
    """RFC 6902; the original is deep-copied first."""
    if not isinstance(operations, list):
        raise bad_request("json patch must be a JSON array of operations")
    doc: Any = copy.deepcopy(original)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"invalid JSON patch operation: {op!r}")
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise bad_request(f"jsonpatch {kind} operation does not have a value")
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            doc, _ = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)  # must exist
            if _pointer(path):
                doc, _ = _remove(doc, path)
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind in ("move", "copy"):
            source = op.get("from")
            if not isinstance(source, str):
                raise bad_request(f"jsonpatch {kind} operation does not have a from")
            if kind == "move":
                doc, value = _remove(doc, source)
            else:
                value = copy.deepcopy(_get(doc, source))
            doc = _add(doc, path, value)
        elif kind == "test":
            if _get(doc, path) != op["value"]:
                raise PatchFailedError(f"jsonpatch: test operation failed at {path!r}")
        else:
            raise bad_request(f"unexpected jsonpatch operation {kind!r}")
    return doc
