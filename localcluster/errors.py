"""API errors as kube-apiserver reports them: an HTTP code plus a ``Status`` object.

Every failure the local API server answers goes through :class:`ApiError`, so clients (the
``kubernetes`` package turns the body into ``ApiException``; kubectl prints ``message``) see the same
``reason``/``code``/``message``/``details`` shape as from a real control plane.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from localcluster.resources import ResourceType

JsonObj = dict[str, Any]

_CAUSE_REASONS = {
    "Invalid": "FieldValueInvalid",
    "Forbidden": "FieldValueForbidden",
    "Required": "FieldValueRequired",
    "Duplicate": "FieldValueDuplicate",
    "TooMany": "FieldValueTooMany",
    "TooLong": "FieldValueTooLong",
    "NotSupported": "FieldValueNotSupported",
}


@dataclass(frozen=True, slots=True)
class FieldError:
    """One validation failure, formatted like apimachinery's ``field.Error``."""

    kind: str  # Invalid | Forbidden | Required | Duplicate | TooMany | TooLong | NotSupported
    field: str
    detail: str = ""
    value: Any = None

    def message(self) -> str:
        return f"{self.field}: {self.body()}"

    def body(self) -> str:
        """The message without the field path, as kube puts it in ``details.causes``."""
        if self.kind == "Required":
            body = "Required value"
        elif self.kind == "Forbidden":
            body = "Forbidden"
        elif self.kind == "TooMany":
            body = f"Too many: {_render(self.value)}"
        elif self.kind == "TooLong":
            body = "Too long"
        elif self.kind == "Duplicate":
            body = f"Duplicate value: {_render(self.value)}"
        elif self.kind == "NotSupported":
            body = f"Unsupported value: {_render(self.value)}"
        else:
            body = f"Invalid value: {_render(self.value)}"
        return f"{body}: {self.detail}" if self.detail else body


def _render(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if value is None:
        return "null"
    return '"object"'


@dataclass(slots=True)
class ApiError(Exception):
    """An error answer: ``code`` is the HTTP status, the rest fills the ``Status`` body."""

    code: int
    reason: str
    message: str
    details: JsonObj = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def status(self) -> JsonObj:
        body: JsonObj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def qualified(resource: ResourceType) -> str:
    """``pods`` or ``resourceclaims.resource.k8s.io``, as kube names a resource in messages."""
    return f"{resource.plural}.{resource.group}" if resource.group else resource.plural


def _details(resource: ResourceType, name: str) -> JsonObj:
    details: JsonObj = {"name": name, "kind": resource.plural}
    if resource.group:
        details["group"] = resource.group
    return details


def not_found(resource: ResourceType, name: str) -> ApiError:
    return ApiError(
        404, "NotFound", f'{qualified(resource)} "{name}" not found', _details(resource, name)
    )


def namespace_not_found(namespace: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'namespaces "{namespace}" not found',
        {"name": namespace, "kind": "namespaces"},
    )


def already_exists(resource: ResourceType, name: str, *, being_deleted: bool = False) -> ApiError:
    prefix = "object is being deleted: " if being_deleted else ""
    return ApiError(
        409,
        "AlreadyExists",
        f'{prefix}{qualified(resource)} "{name}" already exists',
        _details(resource, name),
    )


def conflict(resource: ResourceType, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(resource)} "{name}": {why}',
        _details(resource, name),
    )


def forbidden(resource: ResourceType, name: str, why: str) -> ApiError:
    """``apierrors.NewForbidden``: what an admission plugin or a kind's own rule refuses."""
    if not name:
        return ApiError(403, "Forbidden", f"{qualified(resource)} is forbidden: {why}")
    return ApiError(
        403,
        "Forbidden",
        f'{qualified(resource)} "{name}" is forbidden: {why}',
        _details(resource, name),
    )


STALE = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def invalid(resource: ResourceType, name: str, errors: list[FieldError]) -> ApiError:
    messages = [err.message() for err in errors]
    joined = messages[0] if len(messages) == 1 else "[" + ", ".join(messages) + "]"
    kind = f"{resource.kind}.{resource.group}" if resource.group else resource.kind
    details: JsonObj = {
        "name": name,
        "kind": resource.kind,
        "causes": [
            {
                "reason": _CAUSE_REASONS.get(err.kind, "FieldValueInvalid"),
                "message": err.body(),
                "field": err.field,
            }
            for err in errors
        ],
    }
    if resource.group:
        details["group"] = resource.group
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {joined}', details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def resource_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def method_not_allowed(method: str) -> ApiError:
    return ApiError(
        405,
        "MethodNotAllowed",
        f"the server does not allow this method on the requested resource ({method})",
    )


def unsupported_media_type(content_type: str) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format: {content_type}",
    )


def too_large(limit: int) -> ApiError:
    return ApiError(413, "RequestEntityTooLarge", f"Request entity too large: limit is {limit}")


def expired(requested: int, oldest: int) -> ApiError:
    return ApiError(410, "Expired", f"too old resource version: {requested} ({oldest})")


def internal(message: str) -> ApiError:
    return ApiError(500, "InternalError", f"Internal error occurred: {message}")
