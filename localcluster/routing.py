"""Resource URLs: which resource, namespace, name and subresource a path names.

``/api/v1/namespaces/{ns}/pods/{name}/status``, ``/apis/{group}/{version}/{plural}``, the legacy
``/watch/`` prefix; anything else is a 404 ``Status``.
"""

from __future__ import annotations

from dataclasses import dataclass

from localcluster import errors, resources
from localcluster.resources import ResourceType


@dataclass(frozen=True, slots=True)
class Target:
    """What a resource URL names."""

    resource: ResourceType
    namespace: str | None
    name: str | None
    subresource: str
    watch_path: bool


def parse_target(parts: list[str]) -> Target:
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise errors.resource_not_found()
    watch_path = bool(rest) and rest[0] == "watch"
    if watch_path:
        rest = rest[1:]
    namespace: str | None = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        candidate = resources.lookup(group, version, rest[2])
        if candidate is not None and candidate.namespaced:
            namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        raise errors.resource_not_found()
    resource = resources.lookup(group, version, rest[0])
    if resource is None:
        raise errors.resource_not_found()
    if namespace is not None and not resource.namespaced:
        raise errors.resource_not_found()
    name = rest[1] if len(rest) > 1 else None
    subresource = rest[2] if len(rest) > 2 else ""
    if subresource and subresource not in resource.subresources:
        raise errors.resource_not_found()
    return Target(resource, namespace, name, subresource, watch_path)
