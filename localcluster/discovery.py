"""Read-only documents besides objects: discovery (``/api``, ``/apis``, ``/version``, …) and the
``meta.k8s.io/v1`` ``Table`` form ``kubectl get`` asks for."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from localcluster import errors, resources
from localcluster.resources import PODS, ResourceType

JsonObj = dict[str, Any]


def document(parts: list[str], server_address: str) -> JsonObj | None:
    """The discovery document a path names; None when the path names objects instead."""
    if not parts:
        paths = ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/readyz", "/version"]
        for group in resources.api_group_list()["groups"]:
            paths += [
                f"/apis/{group['name']}",
                f"/apis/{group['preferredVersion']['groupVersion']}",
            ]
        return {"paths": sorted(paths)}
    if parts == ["version"]:
        return dict(resources.SERVER_VERSION)
    if parts == ["api"]:
        return resources.api_versions(server_address)
    if parts == ["apis"]:
        return resources.api_group_list()
    if parts[:2] == ["openapi", "v3"]:
        return _openapi_v3(parts[2:])
    if parts[0] == "openapi":
        raise errors.resource_not_found()
    if parts[0] == "api" and len(parts) == 2:
        found = resources.api_resource_list("", parts[1])
    elif parts[0] == "apis" and len(parts) == 2:
        found = resources.api_group(parts[1])
    elif parts[0] == "apis" and len(parts) == 3:
        found = resources.api_resource_list(parts[1], parts[2])
    else:
        return None
    if found is None:
        raise errors.resource_not_found()
    return found


def _openapi_v3(gv_parts: list[str]) -> JsonObj:
    """Just enough OpenAPI v3 for kubectl: each PATCH operation declares ``fieldValidation``, so
    kubectl leaves validation to the server instead of demanding full schemas."""
    if not gv_parts:
        index = {"api/v1": {"serverRelativeURL": "/openapi/v3/api/v1"}}
        for group in resources.api_group_list()["groups"]:
            gv = group["preferredVersion"]["groupVersion"]
            index[f"apis/{gv}"] = {"serverRelativeURL": f"/openapi/v3/apis/{gv}"}
        return {"paths": index}
    if gv_parts[0] == "api" and len(gv_parts) == 2:
        group, version = "", gv_parts[1]
    elif gv_parts[0] == "apis" and len(gv_parts) == 3:
        group, version = gv_parts[1], gv_parts[2]
    else:
        raise errors.resource_not_found()
    served = [r for r in resources.RESOURCES if r.group == group and r.version == version]
    if not served:
        raise errors.resource_not_found()
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    paths: JsonObj = {}
    for r in served:
        scope = "/namespaces/{namespace}" if r.namespaced else ""
        paths[f"{prefix}{scope}/{r.plural}/{{name}}"] = {
            "patch": {
                "operationId": f"patch{r.kind}",
                "parameters": [
                    {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                    {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                ],
                "requestBody": {"content": {"application/merge-patch+json": {"schema": {}}}},
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": {
                    "group": r.group,
                    "version": r.version,
                    "kind": r.kind,
                },
            }
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": resources.SERVER_VERSION["gitVersion"]},
        "paths": paths,
        "components": {"schemas": {}},
    }


def _age(timestamp: str | None, now: datetime) -> str:
    if not timestamp:
        return "<unknown>"
    created = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    seconds = max(0, int((now - created).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * 2 or (unit == "m" and seconds >= 120):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def table(resource: ResourceType, items: list[JsonObj], rv: int) -> JsonObj:
    """A minimal Table: name (+ phase and node for pods) and age."""
    columns: list[JsonObj] = [
        {
            "name": "Name",
            "type": "string",
            "format": "name",
            "priority": 0,
            "description": "Name of the object",
        }
    ]
    if resource is PODS:
        columns += [
            {
                "name": "Status",
                "type": "string",
                "format": "",
                "priority": 0,
                "description": "phase",
            },
            {"name": "Node", "type": "string", "format": "", "priority": 0, "description": "node"},
        ]
    columns.append(
        {
            "name": "Age",
            "type": "string",
            "format": "",
            "priority": 0,
            "description": "time since creation",
        }
    )
    now = datetime.now(UTC)
    rows = []
    for obj in items:
        metadata = obj.get("metadata") or {}
        cells: list[Any] = [metadata.get("name")]
        if resource is PODS:
            phase = (obj.get("status") or {}).get("phase", "")
            status = "Terminating" if metadata.get("deletionTimestamp") else phase
            if (obj.get("spec") or {}).get("schedulingGates"):
                status = "SchedulingGated"
            cells += [status, (obj.get("spec") or {}).get("nodeName") or "<none>"]
        cells.append(_age(metadata.get("creationTimestamp"), now))
        rows.append(
            {
                "cells": cells,
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": metadata,
                },
            }
        )
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": str(rv)},
        "columnDefinitions": columns,
        "rows": rows,
    }
