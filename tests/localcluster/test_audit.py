"""The audit facility: RBAC request attributes from a URL, and the records the server keeps."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from driver.cluster.kube import KubeClusterApi, configuration_for_url
from driver.cluster.port import LEASES, PODS, RESOURCE_CLAIMS, PatchType
from driver.cluster.throttle import ClientSettings
from driver.errors import ApiNotFoundError
from localcluster.apiserver import LocalApiServer
from localcluster.audit import (
    AuditLog,
    AuditRecord,
    JsonLinesAuditFile,
    RequestAttributes,
    read_json_lines,
    record_request,
    request_attributes,
    user_agent_product,
)

RC = "/apis/resource.k8s.io/v1"

CASES = [
    ("GET", "/api/v1/pods", {}, RequestAttributes("list", "", "pods")),
    ("GET", "/api/v1/pods", {"watch": "true"}, RequestAttributes("watch", "", "pods")),
    ("GET", "/api/v1/watch/pods", {}, RequestAttributes("watch", "", "pods")),
    (
        "GET",
        "/api/v1/watch/namespaces/ns/pods/p",
        {},
        RequestAttributes("watch", "", "pods", namespace="ns", name="p"),
    ),
    (
        "GET",
        "/api/v1/namespaces/ns/pods/p",
        {},
        RequestAttributes("get", "", "pods", "", "ns", "p"),
    ),
    (
        "HEAD",
        "/api/v1/namespaces/ns/pods/p",
        {},
        RequestAttributes("get", "", "pods", "", "ns", "p"),
    ),
    ("POST", "/api/v1/namespaces/ns/pods", {}, RequestAttributes("create", "", "pods", "", "ns")),
    (
        "POST",
        "/api/v1/namespaces/ns/pods/p/binding",
        {},
        RequestAttributes("create", "", "pods", "binding", "ns", "p"),
    ),
    (
        "PUT",
        f"{RC}/namespaces/ns/resourceclaims/c/status",
        {},
        RequestAttributes("update", "resource.k8s.io", "resourceclaims", "status", "ns", "c"),
    ),
    (
        "PATCH",
        "/api/v1/namespaces/ns/pods/p",
        {},
        RequestAttributes("patch", "", "pods", "", "ns", "p"),
    ),
    (
        "DELETE",
        f"{RC}/resourceslices/s",
        {},
        RequestAttributes("delete", "resource.k8s.io", "resourceslices", name="s"),
    ),
    (
        "DELETE",
        f"{RC}/resourceslices",
        {"labelSelector": "a=b"},
        RequestAttributes("deletecollection", "resource.k8s.io", "resourceslices"),
    ),
    (
        "GET",
        f"{RC}/resourceslices",
        {"fieldSelector": "spec.driver=x,metadata.name=s1"},
        RequestAttributes("list", "resource.k8s.io", "resourceslices", name="s1"),
    ),
    (
        "GET",
        f"{RC}/resourceslices",
        {"fieldSelector": "metadata.name!=s1", "watch": "1"},
        RequestAttributes("watch", "resource.k8s.io", "resourceslices"),
    ),
    (
        "GET",
        "/api/v1/namespaces/ns",
        {},
        RequestAttributes("get", "", "namespaces", namespace="ns", name="ns"),
    ),
    (
        "PUT",
        "/api/v1/namespaces/ns/finalize",
        {},
        RequestAttributes("update", "", "namespaces", "finalize", "ns", "ns"),
    ),
    ("GET", "/api/v1/namespaces", {}, RequestAttributes("list", "", "namespaces")),
    (
        "GET",
        "/apis/unknown.example.com/v1/namespaces/ns/widgets",
        {},
        RequestAttributes("list", "unknown.example.com", "widgets", namespace="ns"),
    ),
    ("GET", "/healthz", {}, RequestAttributes("get", path="/healthz")),
    ("GET", "/apis", {}, RequestAttributes("get", path="/apis")),
    (
        "GET",
        "/apis/resource.k8s.io/v1",
        {},
        RequestAttributes("get", path="/apis/resource.k8s.io/v1"),
    ),
]


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    CASES,
    ids=[f"{m} {p}{'?' + '&'.join(q) if q else ''}" for m, p, q, _ in CASES],
)
def test_request_attributes_as_rbac_sees_them(
    method: str, path: str, query: dict[str, str], expected: RequestAttributes
) -> None:
    attributes = request_attributes(method, path, query)
    assert attributes == RequestAttributes(
        verb=expected.verb,
        api_group=expected.api_group,
        resource=expected.resource,
        subresource=expected.subresource,
        namespace=expected.namespace,
        name=expected.name,
        path=path,
    )
    assert attributes.is_resource_request == bool(expected.resource)


@pytest.mark.parametrize(
    ("agent", "product"),
    [
        ("instaslice-controller/0.1.0 (linux/amd64)", "instaslice-controller"),
        ("kubelet/node-0", "kubelet"),
        ("OpenAPI-Generator/31.0.0/python", "OpenAPI-Generator"),
        ("", ""),
    ],
    ids=["versioned", "slash", "client-default", "empty"],
)
def test_user_agent_product(agent: str, product: str) -> None:
    assert user_agent_product(agent) == product


def test_the_log_is_bounded_and_counts_what_it_dropped() -> None:
    log = AuditLog(capacity=2)
    for code in (200, 201, 404):
        log(record_request(method="GET", path="/api/v1/pods", query={}, user_agent="a", code=code))
    assert [r.code for r in log.records()] == [201, 404]
    assert log.dropped == 1
    log.clear()
    assert log.records() == []
    assert log.dropped == 0
    with pytest.raises(ValueError, match="capacity"):
        AuditLog(capacity=0)


def test_the_server_records_each_request_with_its_user_agent_and_code() -> None:
    log = AuditLog()
    with LocalApiServer(audit=log) as server:
        settings = ClientSettings(qps=0, request_timeout=10.0, user_agent="tester/1.0")
        with KubeClusterApi(
            configuration=configuration_for_url(server.url), settings=settings
        ) as api:
            lease = {"metadata": {"name": "l", "namespace": "ns"}, "spec": {}}
            created = api.create(LEASES, lease)
            api.update(LEASES, created)
            api.patch(
                LEASES,
                name="l",
                namespace="ns",
                patch={"spec": {"holderIdentity": "me"}},
                patch_type=PatchType.MERGE,
            )
            with pytest.raises(ApiNotFoundError):
                api.get(RESOURCE_CLAIMS, name="missing", namespace="ns")
            listed = api.list_objects(LEASES, namespace="ns")
            with api.watch(
                LEASES, namespace="ns", resource_version=listed.resource_version, timeout_seconds=1
            ):
                pass
            api.delete(LEASES, name="l", namespace="ns")
    seen = [
        (r.attributes.verb, r.attributes.resource_path, r.attributes.namespace, r.code)
        for r in log.records()
        if r.user_agent == "tester/1.0"
    ]
    assert seen == [
        ("create", "leases", "ns", 201),
        ("update", "leases", "ns", 200),
        ("patch", "leases", "ns", 200),
        ("get", "resourceclaims", "ns", 404),
        ("list", "leases", "ns", 200),
        ("watch", "leases", "ns", 200),
        ("delete", "leases", "ns", 200),
    ]
    assert {r.attributes.api_group for r in log.records()} >= {"coordination.k8s.io"}


def test_json_lines_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "audit" / "log.jsonl"
    record = record_request(
        method="PUT",
        path=f"{RC}/namespaces/ns/resourceclaims/c/status",
        query={},
        user_agent="instaslice-controller",
        code=409,
    )
    with JsonLinesAuditFile(path) as sink:
        sink(record)
        sink(record)
    sink(record)  # after close: dropped, not an error
    assert read_json_lines(path) == [record, record]
    first = json.loads(path.read_text().splitlines()[0])
    assert first["verb"] == "update"
    assert first["apiGroup"] == "resource.k8s.io"
    assert first["subresource"] == "status"
    assert first["userAgent"] == "instaslice-controller"
    assert "409" in record.describe()
    assert "resourceclaims/status" in record.describe()


def test_python_m_localcluster_writes_the_audit_log(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "localcluster",
            "--audit-log",
            str(log_path),
            "--kubeconfig",
            str(tmp_path / "kubeconfig"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().split()[-1]
        settings = ClientSettings(qps=0, request_timeout=10.0, user_agent="cli-test")
        with KubeClusterApi(configuration=configuration_for_url(url), settings=settings) as api:
            api.list_objects(PODS, namespace="default")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (log_path.exists() and log_path.read_text()):
            time.sleep(0.05)
    finally:
        process.terminate()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()
    records = read_json_lines(log_path)
    assert [(r.user_agent, r.attributes.verb, r.attributes.resource) for r in records] == [
        ("cli-test", "list", "pods")
    ]
    assert isinstance(records[0], AuditRecord)
