"""Builders for the PriorityClass and Priority admission tests: class bodies, and raw HTTP for
bodies the ``kubernetes`` client will not send (a class without ``value``, fields of the wrong
type)."""

from __future__ import annotations

import http.client
import json
from typing import Any

from localcluster.apiserver import LocalApiServer

CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"
PODS = "/api/v1/namespaces/default/pods"
SYSTEM_CLASSES = {"system-node-critical": 2_000_001_000, "system-cluster-critical": 2_000_000_000}


def priority_class(name: str, value: int | None = 1000, **fields: Any) -> dict[str, Any]:
    """A ``scheduling.k8s.io/v1`` PriorityClass; ``value=None`` leaves the field out."""
    body: dict[str, Any] = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        **fields,
    }
    if value is not None:
        body["value"] = value
    return body


def call(
    apiserver: LocalApiServer, method: str, path: str, body: Any = None
) -> tuple[int, dict[str, Any]]:
    """One request with a JSON body as given; the status code and the decoded answer."""
    connection = http.client.HTTPConnection("127.0.0.1", apiserver.port, timeout=10)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        answer: dict[str, Any] = json.loads(response.read())
        return response.status, answer
    finally:
        connection.close()
