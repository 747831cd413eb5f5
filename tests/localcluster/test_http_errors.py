"""Contract: bad requests get proper ``Status`` errors (never a traceback), and the server lives on."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from localcluster.apiserver import LocalApiServer

PODS = "/api/v1/namespaces/default/pods"


@pytest.fixture
def conn(apiserver: LocalApiServer) -> Iterator[http.client.HTTPConnection]:
    connection = http.client.HTTPConnection("127.0.0.1", apiserver.port, timeout=10)
    try:
        yield connection
    finally:
        connection.close()


def _call(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    body: bytes | None = None,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    headers = {"Content-Type": content_type} if body is not None else {}
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    data = response.read()
    if response.getheader("Connection") == "close":
        conn.close()
    return response.status, json.loads(data)


def _pod(name: str = "p", **meta: Any) -> bytes:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, **meta},
            "spec": {"containers": [{"name": "c", "image": "i:1"}]},
        }
    ).encode()


@pytest.mark.parametrize(
    ("method", "path", "body", "code", "reason"),
    [
        ("POST", PODS, b'{"metadata": {"name": ', 400, "BadRequest"),
        ("POST", PODS, b"[1, 2]", 400, "BadRequest"),
        (
            "POST",
            PODS,
            json.dumps({"kind": "Node", "metadata": {"name": "x"}}).encode(),
            400,
            "BadRequest",
        ),
        ("POST", PODS, _pod(namespace="other"), 400, "BadRequest"),
        ("POST", PODS, _pod(resourceVersion="5"), 400, "BadRequest"),
        ("GET", "/api/v1/widgets", None, 404, "NotFound"),
        ("GET", "/apis/nope.example.com/v1/things", None, 404, "NotFound"),
        ("GET", "/api/v1/namespaces/default/nodes", None, 404, "NotFound"),
        ("GET", "/no/such/path", None, 404, "NotFound"),
        ("PUT", PODS, _pod(), 405, "MethodNotAllowed"),
        ("OPTIONS", PODS, None, 405, "MethodNotAllowed"),
        ("POST", "/api/v1/pods", _pod(), 405, "MethodNotAllowed"),
        ("GET", PODS + "?labelSelector=a%20in%20(b", None, 400, "BadRequest"),
        ("GET", PODS + "?watch=true&resourceVersion=abc", None, 400, "BadRequest"),
    ],
    ids=[
        "malformed-json",
        "json-not-an-object",
        "kind-mismatch",
        "namespace-mismatch",
        "resource-version-on-create",
        "unknown-resource",
        "unknown-group",
        "cluster-scoped-under-namespace",
        "unknown-path",
        "put-on-collection",
        "options",
        "create-without-namespace",
        "bad-label-selector",
        "bad-watch-resource-version",
    ],
)
def test_bad_requests_get_status_errors(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    body: bytes | None,
    code: int,
    reason: str,
) -> None:
    status, answer = _call(conn, method, path, body)

    assert status == code
    assert answer["kind"] == "Status"
    assert answer["status"] == "Failure"
    assert answer["code"] == code
    assert answer["reason"] == reason
    assert "Traceback" not in answer["message"]


def test_update_with_other_name_is_bad_request(conn: http.client.HTTPConnection) -> None:
    _call(conn, "POST", PODS, _pod("a"))

    status, answer = _call(conn, "PUT", PODS + "/a", _pod("b"))

    assert status == 400
    assert "does not match the name on the URL" in answer["message"]


def test_oversized_body_is_rejected_and_server_keeps_serving(
    apiserver: LocalApiServer, conn: http.client.HTTPConnection
) -> None:
    big = json.dumps({"metadata": {"name": "big"}, "data": {"k": "x" * (3 * 1024 * 1024)}}).encode()

    status, answer = _call(conn, "POST", "/api/v1/namespaces/default/configmaps", big)
    after, _ = _call(conn, "GET", PODS)

    assert status == 413
    assert answer["reason"] == "RequestEntityTooLarge"
    assert after == 200


def test_unknown_patch_type_is_unsupported(conn: http.client.HTTPConnection) -> None:
    _call(conn, "POST", PODS, _pod("a"))

    status, answer = _call(conn, "PATCH", PODS + "/a", b"{}", content_type="text/plain")

    assert status == 415
    assert answer["reason"] == "UnsupportedMediaType"


def test_chunked_request_body_is_read(apiserver: LocalApiServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", apiserver.port, timeout=10)
    try:
        conn.request(
            "POST", PODS, body=iter([_pod("chunked")]),
            headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
            encode_chunked=True,
        )  # fmt: skip
        response = conn.getresponse()
        created = json.loads(response.read())
    finally:
        conn.close()

    assert response.status == 201
    assert created["metadata"]["name"] == "chunked"


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/api", "APIVersions"),
        ("/apis", "APIGroupList"),
        ("/api/v1", "APIResourceList"),
        ("/apis/resource.k8s.io", "APIGroup"),
        ("/apis/resource.k8s.io/v1", "APIResourceList"),
    ],
    ids=["api", "apis", "core-v1", "resource-group", "resource-v1"],
)
def test_discovery_documents(conn: http.client.HTTPConnection, path: str, kind: str) -> None:
    status, answer = _call(conn, "GET", path)

    assert status == 200
    assert answer["kind"] == kind


def test_discovery_lists_subresources(conn: http.client.HTTPConnection) -> None:
    _, answer = _call(conn, "GET", "/api/v1")

    names = {r["name"] for r in answer["resources"]}
    assert {"pods", "pods/status", "pods/binding", "nodes/status", "namespaces"} <= names


def test_version(conn: http.client.HTTPConnection) -> None:
    status, answer = _call(conn, "GET", "/version")

    assert status == 200
    assert answer["major"] == "1"
