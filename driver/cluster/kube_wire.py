"""The API server's wire JSON as our values: a ``Status`` body as our error tree, objects with kind.

Shared by the request path (``kube``) and the watch stream (``kube_watch``); pure functions, no I/O
and no ``kubernetes`` import.
"""

from __future__ import annotations

import json
from typing import overload

from api import wire
from driver.cluster.port import Body, JsonObject, Resource
from driver.errors import (
    AlreadyExistsError,
    ApiNotFoundError,
    ClusterError,
    ConflictError,
    ForbiddenError,
    GoneError,
    InvalidError,
    TooManyRequestsError,
)


def status_error(method: str, path: str, code: int, body: bytes) -> ClusterError:
    """Map an API ``Status`` to our error tree; the message keeps the server's own words."""
    reason = ""
    message = body.decode("utf-8", "replace")[:500]
    try:
        status: wire.Status = json.loads(body)
        if isinstance(status, dict):
            reason = str(status.get("reason") or "")
            message = str(status.get("message") or message)
    except ValueError:
        pass
    text = f"{method} {path}: {code} {reason}: {message}".replace(" : ", ": ")
    error: ClusterError
    if code == 409:
        error = AlreadyExistsError(text) if reason == "AlreadyExists" else ConflictError(text)
    elif code == 404:
        error = ApiNotFoundError(text)
    elif code in (400, 422):
        error = InvalidError(text)
    elif code == 410:
        error = GoneError(text)
    elif code == 429:
        error = TooManyRequestsError(text)
    elif code == 403:
        error = ForbiddenError(text)
    else:
        error = ClusterError(text)
        if code in (401, 405, 406, 415):
            error.retryable = False
    return error


@overload
def with_kind(resource: Resource, obj: JsonObject) -> JsonObject: ...


@overload
def with_kind(resource: Resource, obj: Body) -> Body: ...


def with_kind(resource: Resource, obj: Body) -> Body:
    """List items come without ``kind``/``apiVersion``; give every object both, as watches do
    (and every body we send, which may leave them out)."""
    if obj.get("kind") != resource.kind or obj.get("apiVersion") != resource.api_version:
        kinded = {"apiVersion": resource.api_version, "kind": resource.kind, **obj}
        kinded["apiVersion"] = resource.api_version
        kinded["kind"] = resource.kind
        return kinded
    return obj
