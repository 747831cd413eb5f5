"""Contract: watch streams — resourceVersion resume, BOOKMARK, 410 Gone, selectors, restart."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from localcluster.apiserver import LocalApiServer
from localcluster.testing import api_client, close_client
from tests.localcluster.helpers import NS, pod, resource, watch_events

CONFIG_MAPS = resource("", "v1", "configmaps")


@pytest.fixture
def core(kube_client: Any) -> Any:
    return client.CoreV1Api(kube_client)


def _events(stream: Iterator[dict[str, Any]], count: int) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    for event in stream:
        seen.append((event["type"], event["raw_object"]["metadata"].get("name", "")))
        if len(seen) == count:
            break
    return seen


def test_watch_from_resource_version_replays_later_changes(core: Any) -> None:
    start = core.list_namespaced_pod(NS).metadata.resource_version
    core.create_namespaced_pod(NS, pod("a"))
    core.patch_namespaced_pod("a", NS, {"metadata": {"labels": {"x": "1"}}})
    core.delete_namespaced_pod("a", NS)

    stream = watch_events(core.list_namespaced_pod, NS, resource_version=start, timeout_seconds=5)

    assert _events(stream, 3) == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]


def test_watch_without_resource_version_starts_with_current_state(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("old"))

    stream = watch_events(core.list_namespaced_pod, NS, timeout_seconds=5)
    first = _events(stream, 1)
    core.create_namespaced_pod(NS, pod("new"))
    second = _events(stream, 1)

    assert first == [("ADDED", "old")]
    assert second == [("ADDED", "new")]


def test_watch_from_compacted_version_is_gone(apiserver: LocalApiServer, core: Any) -> None:
    start = core.list_namespaced_pod(NS).metadata.resource_version
    core.create_namespaced_pod(NS, pod("a"))
    apiserver.compact()

    with pytest.raises(ApiException) as caught:
        list(watch_events(core.list_namespaced_pod, NS, resource_version=start, timeout_seconds=5))

    assert caught.value.status == 410
    assert "Expired" in str(caught.value.reason)


def test_watch_history_is_bounded() -> None:
    with LocalApiServer(watch_history=3) as server:
        start = server.store.resource_version
        for i in range(5):
            server.store.create(CONFIG_MAPS, NS, {"metadata": {"name": f"cm{i}"}})
        api = api_client(server)
        try:
            core: Any = client.CoreV1Api(api)
            with pytest.raises(ApiException) as caught:
                list(
                    watch_events(
                        core.list_namespaced_config_map,
                        NS,
                        resource_version=str(start),
                        timeout_seconds=5,
                    )
                )
        finally:
            close_client(api)
    assert caught.value.status == 410


def test_bookmarks_carry_the_current_resource_version() -> None:
    with LocalApiServer(bookmark_interval=0.05) as server:
        api = api_client(server)
        try:
            core: Any = client.CoreV1Api(api)
            created = core.create_namespaced_pod(NS, pod("a"))
            core.create_namespaced_config_map(NS, {"metadata": {"name": "unrelated"}})
            latest = core.list_namespaced_config_map(NS).metadata.resource_version

            stream = watch_events(
                core.list_namespaced_pod,
                NS,
                resource_version=created.metadata.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=5,
            )
            event = next(stream)
            stream.close()  # type: ignore[attr-defined]
        finally:
            close_client(api)

    assert event["type"] == "BOOKMARK"
    assert event["raw_object"]["metadata"]["resourceVersion"] == latest


def test_field_selector_watch_reports_leaving_as_deleted(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("a", nodeName="node-1"))
    start = core.list_namespaced_pod(NS).metadata.resource_version
    core.create_namespaced_pod(NS, pod("b", nodeName="node-2"))
    core.patch_namespaced_pod_status("a", NS, {"status": {"phase": "Running"}})

    stream = watch_events(
        core.list_namespaced_pod,
        NS,
        field_selector="status.phase=Pending",
        resource_version=start,
        timeout_seconds=5,
    )

    assert _events(stream, 2) == [("ADDED", "b"), ("DELETED", "a")]


def test_restart_ends_open_watches_and_keeps_data(apiserver: LocalApiServer, core: Any) -> None:
    start = core.list_namespaced_pod(NS).metadata.resource_version
    core.create_namespaced_pod(NS, pod("kept"))
    opened, ended = threading.Event(), threading.Event()

    def consume() -> None:
        for _ in watch_events(
            core.list_namespaced_pod, NS, resource_version=start, timeout_seconds=30
        ):
            opened.set()
        ended.set()

    thread = threading.Thread(target=consume)
    thread.start()
    assert opened.wait(timeout=10)
    apiserver.restart()
    thread.join(timeout=10)

    assert ended.is_set()
    assert core.read_namespaced_pod("kept", NS).metadata.name == "kept"


def test_watch_timeout_ends_stream(core: Any) -> None:
    events = list(watch_events(core.list_namespaced_pod, NS, timeout_seconds=1))

    assert events == []


def test_send_initial_events_ends_with_an_annotated_bookmark(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("a"))

    stream = watch_events(
        core.list_namespaced_pod,
        NS,
        send_initial_events=True,
        resource_version_match="NotOlderThan",
        allow_watch_bookmarks=True,
        timeout_seconds=5,
    )
    first, second = next(stream), next(stream)
    stream.close()  # type: ignore[attr-defined]

    assert (first["type"], first["raw_object"]["metadata"]["name"]) == ("ADDED", "a")
    assert second["type"] == "BOOKMARK"
    annotations = second["raw_object"]["metadata"]["annotations"]
    assert annotations == {"k8s.io/initial-events-end": "true"}


def test_legacy_watch_path_for_one_object(apiserver: LocalApiServer) -> None:
    start = apiserver.store.resource_version
    apiserver.store.create(CONFIG_MAPS, NS, {"metadata": {"name": "wanted"}})
    apiserver.store.create(CONFIG_MAPS, NS, {"metadata": {"name": "other"}})
    conn = http.client.HTTPConnection("127.0.0.1", apiserver.port, timeout=10)
    try:
        conn.request(
            "GET",
            f"/api/v1/watch/namespaces/{NS}/configmaps/wanted?resourceVersion={start}"
            "&timeoutSeconds=1",
        )
        response = conn.getresponse()
        lines = response.read().splitlines()
    finally:
        conn.close()

    events = [json.loads(line) for line in lines]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "wanted")]
    assert response.getheader("Transfer-Encoding") == "chunked"
