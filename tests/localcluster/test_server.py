"""The Python API of the server itself: lifecycle, options, kubeconfig, and odd-but-valid inputs."""

from __future__ import annotations

import http.client
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client import ApiException

from localcluster.apiserver import LocalApiServer
from localcluster.resources import PODS
from localcluster.testing import api_client, close_client
from tests.localcluster.helpers import NS, pod, watch_events


def _server_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("localcluster")}


def test_stop_leaves_no_threads_behind() -> None:
    before = _server_threads()
    with LocalApiServer() as server:
        api = api_client(server)
        core: Any = client.CoreV1Api(api)
        core.create_namespaced_pod(NS, pod("p"))
        stream = watch_events(core.list_namespaced_pod, NS, timeout_seconds=30)
        next(stream)  # a watch is open while the server stops
        during = _server_threads()
    stream.close()  # type: ignore[attr-defined]
    close_client(api)

    assert during - before
    assert _server_threads() == before


def test_restart_keeps_port_and_data(apiserver: LocalApiServer, kube_client: Any) -> None:
    core: Any = client.CoreV1Api(kube_client)
    core.create_namespaced_pod(NS, pod("p"))
    port = apiserver.port

    apiserver.restart()

    assert apiserver.port == port
    assert core.read_namespaced_pod("p", NS).metadata.name == "p"


def test_kubeconfig_loads_into_the_client(apiserver: LocalApiServer, tmp_path: Path) -> None:
    path = apiserver.write_kubeconfig(tmp_path / "kube" / "config")
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(path), client_configuration=configuration)  # type: ignore[no-untyped-call]
    api = client.ApiClient(configuration)
    try:
        namespaces: Any = client.CoreV1Api(api).list_namespace()
    finally:
        close_client(api)

    assert configuration.host == apiserver.url
    assert "default" in [n.metadata.name for n in namespaces.items]


def test_namespaces_can_be_required() -> None:
    with LocalApiServer(require_namespaces=True) as server:
        api = api_client(server)
        try:
            core: Any = client.CoreV1Api(api)
            with pytest.raises(ApiException) as caught:
                core.create_namespaced_pod("missing", pod("p"))
            core.create_namespaced_pod(NS, pod("p"))
        finally:
            close_client(api)

    assert caught.value.status == 404
    assert json.loads(caught.value.body or "{}")["message"] == 'namespaces "missing" not found'


def test_yaml_body_is_accepted(apiserver: LocalApiServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", apiserver.port, timeout=10)
    try:
        conn.request(
            "POST",
            f"/api/v1/namespaces/{NS}/configmaps",
            body=yaml.safe_dump({"metadata": {"name": "from-yaml"}, "data": {"k": "v"}}),
            headers={"Content-Type": "application/yaml"},
        )
        response = conn.getresponse()
        created = json.loads(response.read())
    finally:
        conn.close()

    assert response.status == 201
    assert created["data"] == {"k": "v"}


def test_secret_string_data_is_folded_into_data(kube_client: Any) -> None:
    core: Any = client.CoreV1Api(kube_client)

    created = core.create_namespaced_secret(
        NS, {"metadata": {"name": "s"}, "stringData": {"a": "b"}}
    )

    assert created.data == {"a": "Yg=="}
    assert created.string_data is None


def test_pod_in_grace_period_survives_status_updates() -> None:
    with LocalApiServer(graceful_pod_deletion=True) as server:
        api = api_client(server)
        try:
            core: Any = client.CoreV1Api(api)
            core.create_namespaced_pod(NS, pod("p", nodeName="node-1"))
            core.delete_namespaced_pod("p", NS)

            core.patch_namespaced_pod_status("p", NS, {"status": {"phase": "Succeeded"}})
            still_there = core.read_namespaced_pod("p", NS)
        finally:
            close_client(api)

    assert still_there.status.phase == "Succeeded"
    assert still_there.metadata.deletion_timestamp is not None


def test_unbound_pod_is_deleted_at_once_even_when_graceful() -> None:
    with LocalApiServer(graceful_pod_deletion=True) as server:
        api = api_client(server)
        try:
            core: Any = client.CoreV1Api(api)
            core.create_namespaced_pod(NS, pod("p"))
            core.delete_namespaced_pod("p", NS)
            listed = core.list_namespaced_pod(NS)
        finally:
            close_client(api)

    assert listed.items == []


def test_internal_store_writes_reach_watchers(apiserver: LocalApiServer, kube_client: Any) -> None:
    core: Any = client.CoreV1Api(kube_client)
    start = core.list_namespaced_pod(NS).metadata.resource_version
    apiserver.store.create(PODS, NS, pod("direct"))
    stream = watch_events(core.list_namespaced_pod, NS, resource_version=start, timeout_seconds=5)
    event = next(stream)
    stream.close()  # type: ignore[attr-defined]

    assert (event["type"], event["object"].metadata.name) == ("ADDED", "direct")
