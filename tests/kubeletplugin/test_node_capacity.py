"""With the classic shim off, the plugin keeps ``nvidia.com/mig-*`` out of its Node's status
(docs/design.md F13): once at start, and again each time the kubelet writes the stale entries back."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from driver.cluster.kube import KubeClusterApi, connect
from driver.cluster.port import NODES, JsonObject
from kubeletplugin.deviceplugin.podresources import ContainerKey, Holdings, PodResourcesError
from kubeletplugin.node.capacity import (
    KUBELET_CHECKPOINT,
    StaleCapacityCleaner,
    remembered_resources,
    removal_patch,
    stale_resources,
)
from localcluster.apiserver import LocalApiServer

NODE = "node-cap"
PREFIX = "nvidia.com/mig-"
BASE = {"cpu": "8", "memory": "32Gi", "pods": "110", "example.com/fpga": "2"}
WAIT_S = 20.0


def _wait(predicate: Callable[[], bool], message: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, message
        time.sleep(0.02)


@pytest.fixture
def api(apiserver: LocalApiServer) -> Iterator[KubeClusterApi]:
    with connect(url=apiserver.url) as client:
        yield client


def _write_status(api: KubeClusterApi, extra: dict[str, str]) -> None:
    """What the kubelet does: write its whole capacity/allocatable, stale entries included."""
    node = api.get(NODES, name=NODE)
    resources = {**BASE, **extra}
    node["status"] = {**(node.get("status") or {}), "capacity": resources, "allocatable": resources}
    api.update_status(NODES, node)


def _status(api: KubeClusterApi) -> tuple[JsonObject, JsonObject]:
    status = api.get(NODES, name=NODE).get("status") or {}
    return dict(status.get("capacity") or {}), dict(status.get("allocatable") or {})


def _create_node(api: KubeClusterApi) -> None:
    api.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({}, []),
        ({"capacity": {"cpu": "1"}, "allocatable": {"cpu": "1"}}, []),
        (
            {"capacity": {"nvidia.com/mig-1g.5gb": "0", "cpu": "1"}, "allocatable": {"cpu": "1"}},
            ["nvidia.com/mig-1g.5gb"],
        ),
        (
            {
                "capacity": {"nvidia.com/mig-3g.20gb": "2"},
                "allocatable": {"nvidia.com/mig-1g.5gb-me": "1", "nvidia.com/gpu": "1"},
            },
            ["nvidia.com/mig-1g.5gb-me", "nvidia.com/mig-3g.20gb"],
        ),
    ],
    ids=["no-status", "nothing-stale", "capacity-only", "both-lists-other-vendor-kept"],
)
def test_stale_resources_are_the_prefixed_names_of_either_list(
    status: JsonObject, expected: list[str]
) -> None:
    assert stale_resources({"status": status}, prefix=PREFIX) == expected


def test_removal_patch_nulls_each_name_in_both_lists() -> None:
    assert removal_patch(["nvidia.com/mig-1g.5gb"]) == {
        "status": {
            "capacity": {"nvidia.com/mig-1g.5gb": None},
            "allocatable": {"nvidia.com/mig-1g.5gb": None},
        }
    }


def test_cleaner_removes_stale_entries_at_start_and_whenever_the_kubelet_writes_them_back(
    api: KubeClusterApi,
) -> None:
    _create_node(api)
    _write_status(api, {"nvidia.com/mig-1g.5gb": "0", "nvidia.com/mig-3g.20gb": "4"})
    cleaner = StaleCapacityCleaner(api=api, node_name=NODE, resource_prefix=PREFIX)
    cleaner.start()
    try:
        # The first pass is synchronous: nothing is served before the Node is clean.
        assert _status(api) == (BASE, BASE)
        assert sorted(cleaner.removed) == ["nvidia.com/mig-1g.5gb", "nvidia.com/mig-3g.20gb"]

        _write_status(api, {"nvidia.com/mig-1g.5gb": "0"})
        _wait(lambda: _status(api) == (BASE, BASE), "the re-added stale resource stayed")
        _wait(lambda: cleaner.removed.count("nvidia.com/mig-1g.5gb") == 2, "removed once more")

        # A status write without our resources is left alone (no patch, nothing removed).
        removed = len(cleaner.removed)
        _write_status(api, {"example.com/other": "1"})
        _wait(lambda: "example.com/other" in _status(api)[0], "the kubelet's write was lost")
        time.sleep(0.2)
        assert _status(api)[0] == {**BASE, "example.com/other": "1"}
        assert len(cleaner.removed) == removed
    finally:
        cleaner.stop()


def test_cleaner_started_before_its_node_exists_cleans_once_the_kubelet_registers_it(
    api: KubeClusterApi,
) -> None:
    cleaner = StaleCapacityCleaner(api=api, node_name=NODE, resource_prefix=PREFIX)
    cleaner.start()
    try:
        assert cleaner.removed == []
        _create_node(api)
        _write_status(api, {"nvidia.com/mig-2g.10gb": "0"})
        _wait(lambda: _status(api) == (BASE, BASE), "the new node's stale resource stayed")
    finally:
        cleaner.stop()


def test_cleaner_honours_a_custom_prefix_and_leaves_nvidia_names_alone(
    api: KubeClusterApi,
) -> None:
    _create_node(api)
    _write_status(api, {"nvidia.com/mig-1g.5gb": "1", "example.com/slice-1g.5gb": "0"})
    cleaner = StaleCapacityCleaner(api=api, node_name=NODE, resource_prefix="example.com/slice-")
    assert cleaner.clean_once() == ["example.com/slice-1g.5gb"]
    assert _status(api)[0] == {**BASE, "nvidia.com/mig-1g.5gb": "1"}


def _kubelet_checkpoint(path: Path, resources: list[str]) -> None:
    """The kubelet device manager's checkpoint as it writes it (AllocResp bytes are base64)."""
    data = {
        "Data": {"PodDeviceEntries": [], "RegisteredDevices": {r: [] for r in resources}},
        "Checksum": 1234,
    }
    path.write_text(json.dumps(data), encoding="utf-8")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, frozenset()),
        (
            '{"Data": {"PodDeviceEntries": [], "RegisteredDevices": null}, "Checksum": 1}',
            frozenset(),
        ),
        (
            '{"Data": {"RegisteredDevices": {"nvidia.com/mig-1g.5gb": []}}, "Checksum": 1}',
            frozenset({"nvidia.com/mig-1g.5gb"}),
        ),
        ("not json", None),
        ('{"Data": {"RegisteredDevices": ["x"]}}', None),
        ('{"Checksum": 1}', None),
    ],
    ids=["no-checkpoint", "none-registered", "one-remembered", "garbage", "wrong-type", "no-data"],
)
def test_remembered_resources_reads_the_kubelet_checkpoint(
    tmp_path: Path, content: str | None, expected: frozenset[str] | None
) -> None:
    path = tmp_path / KUBELET_CHECKPOINT
    if content is not None:
        path.write_text(content, encoding="utf-8")
    assert remembered_resources(path) == expected


def test_entries_the_kubelet_still_remembers_stay_until_it_forgets_them(
    api: KubeClusterApi, tmp_path: Path
) -> None:
    """While the kubelet remembers the device plugin it fails pods asking for the resource outside
    it: the entry (allocatable 0) stays, so kube-scheduler makes such pods wait instead."""
    checkpoint = tmp_path / KUBELET_CHECKPOINT
    _kubelet_checkpoint(checkpoint, ["nvidia.com/mig-1g.5gb", "example.com/fpga"])
    _create_node(api)
    _write_status(api, {"nvidia.com/mig-1g.5gb": "0", "nvidia.com/mig-3g.20gb": "0"})
    cleaner = StaleCapacityCleaner(
        api=api,
        node_name=NODE,
        resource_prefix=PREFIX,
        kubelet_checkpoint=checkpoint,
        recheck_seconds=0.1,
    )
    cleaner.start()
    try:
        assert _status(api)[0] == {**BASE, "nvidia.com/mig-1g.5gb": "0"}
        assert cleaner.waiting == ["nvidia.com/mig-1g.5gb"]
        # The kubelet forgets it (grace period over) and rewrites its checkpoint; no Node event.
        _kubelet_checkpoint(checkpoint, ["example.com/fpga"])
        _wait(lambda: _status(api) == (BASE, BASE), "the forgotten resource stayed")
        _wait(lambda: cleaner.waiting == [], "still waiting")
    finally:
        cleaner.stop()


def test_an_unreadable_kubelet_checkpoint_removes_nothing(
    api: KubeClusterApi, tmp_path: Path
) -> None:
    checkpoint = tmp_path / KUBELET_CHECKPOINT
    checkpoint.write_text("{truncated", encoding="utf-8")
    _create_node(api)
    _write_status(api, {"nvidia.com/mig-1g.5gb": "0"})
    cleaner = StaleCapacityCleaner(
        api=api, node_name=NODE, resource_prefix=PREFIX, kubelet_checkpoint=checkpoint
    )
    assert cleaner.clean_once() == []
    assert "nvidia.com/mig-1g.5gb" in _status(api)[0]


class _PodResources:
    """The kubelet's pod-resources answer: which device-plugin devices live pods hold."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, str], ContainerKey] = {}
        self.down = False
        self.closed = False

    def list_holdings(self, resources: Sequence[str] | None) -> Holdings:
        if self.down:
            raise PodResourcesError("kubelet restarting")
        return Holdings(containers=tuple(self.held.values()), holders=dict(self.held))

    def close(self) -> None:
        self.closed = True


def test_a_resource_a_live_pod_still_holds_through_the_device_manager_stays(
    api: KubeClusterApi, tmp_path: Path
) -> None:
    """A classic pod the shim served before the switch still runs: the kubelet keeps treating its
    resource as a device-plugin one (a DRA-bound pod would fail), so the entry stays until it ends."""
    pod_resources = _PodResources()
    pod_resources.held[("nvidia.com/mig-1g.5gb", "1g-5gb-0")] = ContainerKey("ns", "old", "app")
    _create_node(api)
    _write_status(api, {"nvidia.com/mig-1g.5gb": "0", "nvidia.com/mig-2g.10gb": "0"})
    cleaner = StaleCapacityCleaner(
        api=api,
        node_name=NODE,
        resource_prefix=PREFIX,
        kubelet_checkpoint=tmp_path / KUBELET_CHECKPOINT,  # none: nothing registered
        pod_resources=pod_resources,
        recheck_seconds=0.1,
    )
    cleaner.start()
    try:
        assert _status(api)[0] == {**BASE, "nvidia.com/mig-1g.5gb": "0"}
        pod_resources.down = True  # cannot be asked: nothing more is removed, nothing breaks
        pod_resources.held.clear()
        time.sleep(0.3)
        assert _status(api)[0] == {**BASE, "nvidia.com/mig-1g.5gb": "0"}
        pod_resources.down = False  # the old pod has ended
        _wait(lambda: _status(api) == (BASE, BASE), "the entry stayed after the pod ended")
    finally:
        cleaner.stop()
    assert pod_resources.closed
