"""The ``kubernetes``-client adapter against the local API server over real HTTP."""

from __future__ import annotations

import copy
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from api.names import SCHEDULING_GATE
from driver.cluster.kube import KubeClusterApi, connect, load_configuration
from driver.cluster.port import (
    DEVICE_CLASSES,
    EVENTS,
    LEASES,
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    JsonObject,
    PatchType,
    Resource,
    WatchEventType,
    resource_version_of,
)
from driver.cluster.throttle import ClientSettings
from driver.errors import (
    AlreadyExistsError,
    ApiNotFoundError,
    ClusterError,
    ConfigError,
    ConflictError,
    GoneError,
    InvalidError,
)
from localcluster.apiserver import LocalApiServer
from tests.cluster import objects
from tests.cluster.conftest import make_api

KINDS: list[tuple[Resource, Callable[[str], JsonObject]]] = [
    (PODS, objects.pod),
    (NODES, objects.node),
    (RESOURCE_CLAIMS, objects.claim),
    (RESOURCE_CLAIM_TEMPLATES, objects.claim_template),
    (RESOURCE_SLICES, lambda name: objects.resource_slice(name, node_name="node-a")),
    (DEVICE_CLASSES, objects.device_class),
    (EVENTS, objects.event),
    (LEASES, objects.lease),
]
KIND_IDS = [resource.plural for resource, _ in KINDS]


def _namespace(resource: Resource) -> str | None:
    return objects.NAMESPACE if resource.namespaced else None


@pytest.mark.parametrize(("resource", "build"), KINDS, ids=KIND_IDS)
def test_crud_round_trip_and_error_mapping(
    api: KubeClusterApi, resource: Resource, build: Callable[[str], JsonObject]
) -> None:
    namespace = _namespace(resource)
    sent = build("one")
    sent["metadata"].setdefault("labels", {})["suite"] = "crud"
    created = api.create(resource, sent)
    assert created["kind"] == resource.kind
    assert created["apiVersion"] == resource.api_version
    assert resource_version_of(created)
    # every field we sent comes back as we sent it (the wire JSON, camelCase, nothing dropped)
    for key, value in sent.items():
        if key not in ("metadata", "status"):
            assert _subset(value, created[key]), key
    assert created["metadata"]["labels"]["suite"] == "crud"

    got = api.get(resource, name="one", namespace=namespace)
    assert got["metadata"]["uid"] == created["metadata"]["uid"]

    with pytest.raises(AlreadyExistsError):
        api.create(resource, build("one"))

    listed = api.list_objects(resource, namespace=namespace, label_selector="suite=crud")
    assert [o["metadata"]["name"] for o in listed.items] == ["one"]
    assert listed.items[0]["kind"] == resource.kind  # list items are given their kind too
    assert listed.resource_version

    changed = copy.deepcopy(got)
    changed["metadata"]["labels"]["touched"] = "yes"
    updated = api.update(resource, changed)
    assert updated["metadata"]["labels"]["touched"] == "yes"
    assert resource_version_of(updated) != resource_version_of(got)

    stale = copy.deepcopy(got)
    stale["metadata"]["labels"]["touched"] = "stale"
    with pytest.raises(ConflictError) as conflict:
        api.update(resource, stale)
    assert not isinstance(conflict.value, AlreadyExistsError)
    assert conflict.value.retryable

    with pytest.raises(ConflictError):
        api.delete(resource, name="one", namespace=namespace, uid="not-the-uid")
    api.delete(resource, name="one", namespace=namespace, uid=created["metadata"]["uid"])
    if resource is not PODS:  # pods may linger in graceful termination
        with pytest.raises(ApiNotFoundError) as missing:
            api.get(resource, name="one", namespace=namespace)
        assert not missing.value.retryable
    with pytest.raises(ApiNotFoundError):
        api.get(resource, name="never", namespace=namespace)


def _subset(sent: Any, got: Any) -> bool:
    if isinstance(sent, dict):
        return isinstance(got, dict) and all(
            k in got and _subset(v, got[k]) for k, v in sent.items()
        )
    if isinstance(sent, list):
        return (
            isinstance(got, list)
            and len(sent) == len(got)
            and all(_subset(a, b) for a, b in zip(sent, got, strict=True))
        )
    return bool(sent == got)


def test_list_pages_through_continue_tokens(apiserver: LocalApiServer) -> None:
    with make_api(apiserver.url, settings=ClientSettings(qps=0, page_size=3)) as api:
        for i in range(8):
            api.create(DEVICE_CLASSES, objects.device_class(f"class-{i}"))
        first = api._json("GET", DEVICE_CLASSES.path(), query=[("limit", "3")])
        assert len(first["items"]) == 3
        assert first["metadata"]["continue"]
        listed = api.list_objects(DEVICE_CLASSES)
        seen: list[int] = []

        def transform(obj: JsonObject) -> JsonObject:
            seen.append(len(seen))
            return {**obj, "transformed": True}

        paged = api.list_objects(DEVICE_CLASSES, page_size=5, transform=transform)
    assert sorted(o["metadata"]["name"] for o in listed.items) == [f"class-{i}" for i in range(8)]
    assert [o["metadata"]["name"] for o in paged.items] == [
        o["metadata"]["name"] for o in listed.items
    ]
    assert all(o["transformed"] and o["kind"] == "DeviceClass" for o in paged.items)
    assert len(seen) == 8
    assert paged.resource_version == listed.resource_version


def test_every_page_reports_the_first_pages_version(apiserver: LocalApiServer) -> None:
    with make_api(apiserver.url, settings=ClientSettings(qps=0)) as api:
        for i in range(4):
            api.create(DEVICE_CLASSES, objects.device_class(f"class-{i}"))
        first = api._json("GET", DEVICE_CLASSES.path(), query=[("limit", "2")])
        api.create(DEVICE_CLASSES, objects.device_class("class-9"))
        token = first["metadata"]["continue"]
        second = api._json(
            "GET", DEVICE_CLASSES.path(), query=[("limit", "2"), ("continue", token)]
        )
        third = api._json(
            "GET",
            DEVICE_CLASSES.path(),
            query=[("limit", "2"), ("continue", second["metadata"]["continue"])],
        )
        with pytest.raises(ClusterError, match="continue"):
            api._json("GET", DEVICE_CLASSES.path(), query=[("continue", "not-a-token")])
    versions = {page["metadata"]["resourceVersion"] for page in (first, second, third)}
    assert len(versions) == 1
    names = [o["metadata"]["name"] for page in (first, second, third) for o in page["items"]]
    assert names == ["class-0", "class-1", "class-2", "class-3", "class-9"]
    assert "continue" not in third["metadata"]


def test_slices_of_one_node_by_field_selector(api: KubeClusterApi) -> None:
    api.create(RESOURCE_SLICES, objects.resource_slice("a-0", node_name="node-a"))
    api.create(RESOURCE_SLICES, objects.resource_slice("b-0", node_name="node-b"))
    listed = api.list_objects(RESOURCE_SLICES, field_selector="spec.nodeName=node-b")
    assert [o["metadata"]["name"] for o in listed.items] == ["b-0"]


def test_invalid_object_maps_to_invalid_error_with_the_server_message(api: KubeClusterApi) -> None:
    bad = objects.claim("bad")
    del bad["spec"]["devices"]["requests"][0]["exactly"]
    with pytest.raises(InvalidError) as invalid:
        api.create(RESOURCE_CLAIMS, bad)
    assert "spec.devices.requests[0]" in str(invalid.value)
    assert not invalid.value.retryable


def test_claim_spec_is_immutable(api: KubeClusterApi) -> None:
    created = api.create(RESOURCE_CLAIMS, objects.claim("c"))
    changed = copy.deepcopy(created)
    changed["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    with pytest.raises(InvalidError):
        api.update(RESOURCE_CLAIMS, changed)


def test_status_subresource_writes_status_only_and_checks_resource_version(
    api: KubeClusterApi,
) -> None:
    created = api.create(RESOURCE_CLAIMS, objects.claim("c"))
    with_status = copy.deepcopy(created)
    with_status["status"] = {"reservedFor": []}
    with_status["metadata"]["labels"] = {"ignored": "by-status"}
    api.update_status(RESOURCE_CLAIMS, with_status)
    after = api.get(RESOURCE_CLAIMS, name="c", namespace=objects.NAMESPACE)
    assert "ignored" not in (after["metadata"].get("labels") or {})
    with pytest.raises(ConflictError):
        api.update_status(RESOURCE_CLAIMS, with_status)  # its resourceVersion is stale now


def test_patch_types(api: KubeClusterApi) -> None:
    api.create(NODES, objects.node("n1"))
    merged = api.patch(
        NODES, name="n1", patch={"metadata": {"labels": {"a": "1"}}}, patch_type=PatchType.MERGE
    )
    assert merged["metadata"]["labels"]["a"] == "1"
    patched = api.patch(
        NODES,
        name="n1",
        patch=[{"op": "add", "path": "/metadata/labels/b", "value": "2"}],
        patch_type=PatchType.JSON,
    )
    assert patched["metadata"]["labels"]["b"] == "2"
    with pytest.raises(InvalidError):
        api.patch(
            NODES,
            name="n1",
            patch=[{"op": "test", "path": "/metadata/labels/a", "value": "other"}],
            patch_type=PatchType.JSON,
        )
    with pytest.raises(ValueError, match="JSON patch"):
        api.patch(NODES, name="n1", patch={"a": 1}, patch_type=PatchType.JSON)


def test_watch_streams_events_from_a_version_and_410_after_compaction(
    apiserver: LocalApiServer, api: KubeClusterApi
) -> None:
    start = api.list_objects(NODES).resource_version
    api.create(NODES, objects.node("w1"))
    api.patch(
        NODES, name="w1", patch={"metadata": {"labels": {"x": "y"}}}, patch_type=PatchType.MERGE
    )
    api.delete(NODES, name="w1")
    seen: list[tuple[WatchEventType, str]] = []
    with api.watch(NODES, resource_version=start, timeout_seconds=5) as stream:
        for event in stream:
            if event.type is not WatchEventType.BOOKMARK:
                seen.append((event.type, event.object["metadata"]["name"]))
                assert event.object["kind"] == "Node"
            if len(seen) == 3:
                break
    assert seen == [
        (WatchEventType.ADDED, "w1"),
        (WatchEventType.MODIFIED, "w1"),
        (WatchEventType.DELETED, "w1"),
    ]
    apiserver.compact()
    # the 410 may come as the answer to the request or as an ERROR event in the stream
    with pytest.raises(GoneError):
        _drain_watch(api, start)


def _drain_watch(api: KubeClusterApi, version: str) -> None:
    with api.watch(NODES, resource_version=version, timeout_seconds=5) as stream:
        for _ in stream:
            pass


def test_watch_close_from_another_thread_ends_iteration(api: KubeClusterApi) -> None:
    version = api.list_objects(NODES).resource_version
    stream = api.watch(NODES, resource_version=version, timeout_seconds=30, allow_bookmarks=False)
    ended = threading.Event()

    def consume() -> None:
        for _ in stream:
            pass
        ended.set()

    thread = threading.Thread(target=consume)
    thread.start()
    time.sleep(0.1)
    stream.close()
    thread.join(5)
    assert ended.is_set()


def test_network_errors_are_retryable_cluster_errors() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with (
        make_api(
            f"http://127.0.0.1:{port}", settings=ClientSettings(qps=0, connect_timeout=1)
        ) as api,
        pytest.raises(ClusterError) as failed,
    ):
        api.get(NODES, name="x")
    assert failed.value.retryable
    assert type(failed.value) is ClusterError


def test_kubeconfig_loading(apiserver: LocalApiServer, tmp_path: Path) -> None:
    path = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with connect(kubeconfig=str(path)) as api:
        api.create(NODES, objects.node("via-kubeconfig"))
        assert api.get(NODES, name="via-kubeconfig")["metadata"]["name"] == "via-kubeconfig"
    with pytest.raises(ConfigError):
        load_configuration(kubeconfig=str(tmp_path / "missing"))


def test_client_side_rate_limit_holds_requests_to_qps(apiserver: LocalApiServer) -> None:
    settings = ClientSettings(qps=20, burst=1)
    with make_api(apiserver.url, settings=settings) as api:
        started = time.monotonic()
        for _ in range(6):
            api.list_objects(NODES)
        elapsed = time.monotonic() - started
    assert elapsed >= 5 / 20 * 0.95  # 1 burst token, then one per 1/20 s


def test_gate_sample_object_round_trips(api: KubeClusterApi) -> None:
    created = api.create(PODS, objects.pod("g", gates=[SCHEDULING_GATE, "other.example/gate"]))
    assert [g["name"] for g in created["spec"]["schedulingGates"]] == [
        SCHEDULING_GATE,
        "other.example/gate",
    ]
