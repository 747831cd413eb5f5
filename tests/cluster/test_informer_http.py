"""Informers on the local API server over HTTP: every event, resume after a restart, re-list on 410,
bounded cache, backoff while the server is away."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from driver.cluster.indexes import BY_CLAIM, BY_NODE, pod_claim_keys, spec_node_name
from driver.cluster.informer import Backoff, Informer, ListWatch, Transform
from driver.cluster.kube import KubeClusterApi
from driver.cluster.port import (
    NODES,
    PODS,
    RESOURCE_SLICES,
    JsonObject,
    ObjectList,
    PatchType,
    Resource,
    WatchStream,
    resource_version_of,
)
from driver.cluster.throttle import ClientSettings
from localcluster.apiserver import LocalApiServer
from tests.cluster import objects
from tests.cluster.conftest import make_api


def wait_until(predicate: Callable[[], bool], *, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


class Journal:
    """What the handlers were told, per object: the resourceVersions in order, then deletion."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.versions: dict[str, list[str]] = {}
        self.deleted: list[str] = []
        self.calls: list[tuple[str, str]] = []

    def attach(self, informer: Informer) -> None:
        informer.add_handler(on_add=self._add, on_update=self._update, on_delete=self._delete)

    def _add(self, obj: JsonObject) -> None:
        with self.lock:
            self.versions.setdefault(obj["metadata"]["name"], []).append(resource_version_of(obj))
            self.calls.append(("add", obj["metadata"]["name"]))

    def _update(self, old: JsonObject, new: JsonObject) -> None:
        with self.lock:
            self.versions.setdefault(new["metadata"]["name"], []).append(resource_version_of(new))
            self.calls.append(("update", new["metadata"]["name"]))

    def _delete(self, obj: JsonObject) -> None:
        with self.lock:
            self.deleted.append(obj["metadata"]["name"])
            self.calls.append(("delete", obj["metadata"]["name"]))


class GatedListWatch:
    """Holds new lists/watches while ``open`` is clear: a deterministic 'disconnected' window."""

    def __init__(self, inner: ListWatch) -> None:
        self.inner = inner
        self.open = threading.Event()
        self.open.set()
        self.held = threading.Event()
        self.watch_versions: list[str] = []

    def list_objects(self, *, transform: Transform | None = None) -> ObjectList:
        self._pass()
        return self.inner.list_objects(transform=transform)

    def watch(self, *, resource_version: str, timeout_seconds: int) -> WatchStream:
        self._pass()
        stream = self.inner.watch(
            resource_version=resource_version, timeout_seconds=timeout_seconds
        )
        self.watch_versions.append(resource_version)  # the server has accepted the watch
        return stream

    def _pass(self) -> None:
        if not self.open.is_set():
            self.held.set()
            self.open.wait(30)


def _cache_state(informer: Informer) -> dict[str, str]:
    return {o["metadata"]["name"]: resource_version_of(o) for o in informer.list()}


def _server_state(api: KubeClusterApi, resource: Resource) -> dict[str, str]:
    return {o["metadata"]["name"]: resource_version_of(o) for o in api.list_objects(resource).items}


@pytest.fixture
def running() -> Iterator[list[Informer]]:
    started: list[Informer] = []
    yield started
    for informer in started:
        informer.stop()


def test_informer_sees_every_event(api: KubeClusterApi, running: list[Informer]) -> None:
    informer = Informer(source=ListWatch(api=api, resource=NODES), name="nodes")
    journal = Journal()
    journal.attach(informer)
    informer.start()
    running.append(informer)
    assert informer.wait_for_sync(timeout=10)

    written: dict[str, list[str]] = {}
    for i in range(15):
        created = api.create(NODES, objects.node(f"n{i}"))
        written[f"n{i}"] = [resource_version_of(created)]
    for round_ in range(2):
        for i in range(0, 15, 2):
            patched = api.patch(
                NODES,
                name=f"n{i}",
                patch={"metadata": {"labels": {"round": str(round_)}}},
                patch_type=PatchType.MERGE,
            )
            written[f"n{i}"].append(resource_version_of(patched))
    for i in range(0, 15, 3):
        api.delete(NODES, name=f"n{i}")

    server = _server_state(api, NODES)
    assert wait_until(lambda: _cache_state(informer) == server)
    assert wait_until(lambda: len(journal.deleted) == 5)
    with journal.lock:
        assert journal.versions == written  # every version of every object, in order
        assert sorted(journal.deleted) == sorted(f"n{i}" for i in range(0, 15, 3))
    assert informer.relists == 1


def _start_gated(
    api: KubeClusterApi, running: list[Informer]
) -> tuple[Informer, GatedListWatch, Journal]:
    source = GatedListWatch(ListWatch(api=api, resource=NODES))
    informer = Informer(
        source=source, name="nodes", backoff=Backoff(initial=0.05, maximum=0.5, jitter=0.1)
    )
    journal = Journal()
    journal.attach(informer)
    informer.start()
    running.append(informer)
    assert informer.wait_for_sync(timeout=10)
    assert wait_until(lambda: len(source.watch_versions) == 1)
    return informer, source, journal


def test_informer_resumes_after_api_server_restart_without_missing_events(
    apiserver: LocalApiServer, api: KubeClusterApi, running: list[Informer]
) -> None:
    for name in ("keep", "change", "drop"):
        api.create(NODES, objects.node(name))
    informer, source, journal = _start_gated(api, running)
    assert wait_until(lambda: len(informer.list()) == 3)
    version_before = informer.last_resource_version

    source.open.clear()
    apiserver.restart()  # every watch stream and connection is cut
    assert source.held.wait(10)  # the informer is trying to watch again, held back
    with make_api(apiserver.url) as writer:  # changes made while the informer was away
        writer.create(NODES, objects.node("new"))
        writer.create(NODES, objects.node("short-lived"))
        writer.delete(NODES, name="short-lived")
        writer.patch(
            NODES,
            name="change",
            patch={"metadata": {"labels": {"v": "2"}}},
            patch_type=PatchType.MERGE,
        )
        writer.delete(NODES, name="drop")
    source.open.set()

    server = _server_state(api, NODES)
    assert wait_until(lambda: _cache_state(informer) == server)
    assert wait_until(lambda: "drop" in journal.deleted)
    assert informer.relists == 1  # resumed from the last version: no re-list was needed
    assert version_before in source.watch_versions[1:]
    with journal.lock:
        assert ("add", "short-lived") in journal.calls  # even the object that came and went
        assert sorted(journal.deleted) == ["drop", "short-lived"]


def test_informer_relists_on_410_after_compaction_and_reconciles_handlers(
    apiserver: LocalApiServer, api: KubeClusterApi, running: list[Informer]
) -> None:
    for name in ("keep", "change", "drop"):
        api.create(NODES, objects.node(name))
    informer, source, journal = _start_gated(api, running)
    assert wait_until(lambda: len(informer.list()) == 3)

    source.open.clear()
    apiserver.restart()
    assert source.held.wait(10)
    api.create(NODES, objects.node("new"))
    api.patch(
        NODES, name="change", patch={"metadata": {"labels": {"v": "2"}}}, patch_type=PatchType.MERGE
    )
    api.delete(NODES, name="drop")
    apiserver.compact()  # the history the informer would resume from is gone: 410
    source.open.set()

    server = _server_state(api, NODES)
    assert wait_until(lambda: _cache_state(informer) == server)
    assert wait_until(lambda: informer.relists == 2)
    with journal.lock:
        assert journal.deleted == ["drop"]
        assert ("add", "new") in journal.calls
        assert journal.versions["change"][-1] == server["change"]
        assert journal.versions["keep"] == [server["keep"]]  # unchanged: no spurious update


def test_cache_and_indexes_stay_bounded_through_churn(
    api: KubeClusterApi, running: list[Informer]
) -> None:
    slices = Informer(source=ListWatch(api=api, resource=RESOURCE_SLICES), name="slices")
    slices.add_index(BY_NODE, spec_node_name)
    pods = Informer(source=ListWatch(api=api, resource=PODS), name="pods")
    pods.add_index(BY_CLAIM, pod_claim_keys)
    for informer in (slices, pods):
        informer.start()
        running.append(informer)
        assert informer.wait_for_sync(timeout=10)
    baseline = (slices.cache.footprint(), pods.cache.footprint())

    for round_ in range(4):
        for i in range(12):
            api.create(
                RESOURCE_SLICES, objects.resource_slice(f"s{round_}-{i}", node_name=f"node-{i % 3}")
            )
            pod = objects.pod(f"p{round_}-{i}", gates=[])
            pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"claim-{i}"}]
            api.create(PODS, pod)
        assert wait_until(lambda: len(slices.list()) == 12 and len(pods.list()) == 12)
        assert len(slices.by_index(BY_NODE, "node-1")) == 4
        assert len(pods.by_index(BY_CLAIM, f"{objects.NAMESPACE}/claim-5")) == 1
        for i in range(12):
            api.delete(RESOURCE_SLICES, name=f"s{round_}-{i}")
            api.delete(PODS, name=f"p{round_}-{i}", namespace=objects.NAMESPACE)
        assert wait_until(lambda: len(slices.list()) == 0)
        assert wait_until(lambda: len(pods.list()) == len(api.list_objects(PODS).items))

    assert wait_until(lambda: len(api.list_objects(PODS).items) == 0 and len(pods.list()) == 0)
    assert (slices.cache.footprint(), pods.cache.footprint()) == baseline
    assert slices.cache.index_values(BY_NODE) == []
    assert pods.cache.index_values(BY_CLAIM) == []


def test_informer_backs_off_while_the_server_is_down_and_syncs_when_it_comes(
    running: list[Informer],
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with make_api(
        f"http://127.0.0.1:{port}", settings=ClientSettings(qps=0, connect_timeout=1)
    ) as api:
        informer = Informer(
            source=ListWatch(api=api, resource=NODES),
            name="nodes",
            backoff=Backoff(initial=0.05, factor=2.0, maximum=0.4, jitter=0.0),
        )
        informer.start()
        running.append(informer)
        assert wait_until(lambda: informer.failures >= 3)
        assert not informer.has_synced()
        with LocalApiServer(host="127.0.0.1", port=port) as server:
            with make_api(server.url) as writer:
                writer.create(NODES, objects.node("late"))
            assert informer.wait_for_sync(timeout=10)
            assert wait_until(lambda: informer.get("late") is not None)
            assert informer.failures == 0
            informer.stop()
