"""The emulated kubelet's device manager with a device plugin: registration and ListAndWatch into
node allocatable, Allocate per container, pod-resources, admission failures and kubelet restarts."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from driver.cluster.port import NODES, PODS
from driver.errors import ApiNotFoundError
from localcluster.cluster.kubelet import NodeSpec
from localcluster.cluster.runner import LocalCluster
from protos.deviceplugin.v1beta1 import api_pb2 as dp
from protos.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from protos.podresources.v1 import api_pb2 as pr
from protos.podresources.v1 import api_pb2_grpc as pr_grpc
from tests.localcluster_cluster.conftest import NS, pod
from tests.localcluster_cluster.fakes import FakeDevicePlugin

RESOURCE = "nvidia.com/mig-1g.5gb"


@pytest.fixture
def cluster(make_cluster: Callable[..., LocalCluster]) -> LocalCluster:
    return make_cluster((NodeSpec("node-a"),))


@pytest.fixture
def plugin_factory(cluster: LocalCluster) -> Iterator[Callable[..., FakeDevicePlugin]]:
    made: list[FakeDevicePlugin] = []

    def make(**options: Any) -> FakeDevicePlugin:
        fake = FakeDevicePlugin(cluster.kubelet("node-a").root, **options).start()
        made.append(fake)
        fake.register()
        return fake

    yield make
    for fake in made:
        fake.stop()


def _allocatable(cluster: LocalCluster, resource: str = RESOURCE) -> tuple[str | None, str | None]:
    assert cluster.api is not None
    status = cluster.api.get(NODES, name="node-a")["status"]
    return status["capacity"].get(resource), status["allocatable"].get(resource)


def _pod(cluster: LocalCluster, name: str) -> dict[str, Any] | None:
    assert cluster.api is not None
    try:
        return cluster.api.get(PODS, name=name, namespace=NS)
    except ApiNotFoundError:
        return None


def _list(cluster: LocalCluster) -> pr.ListPodResourcesResponse:
    channel = grpc.insecure_channel(f"unix:{cluster.kubelet('node-a').pod_resources_socket}")
    try:
        return pr_grpc.PodResourcesListerStub(channel).List(pr.ListPodResourcesRequest(), timeout=5)
    finally:
        channel.close()


def _two_container_pod(name: str, **spec: Any) -> dict[str, Any]:
    body = pod(name, limits={RESOURCE: "1"}, **spec)
    second = {"name": "d", "image": "busybox:1", "resources": {"limits": {RESOURCE: "1"}}}
    body["spec"]["containers"].append(second)
    return body


def test_list_and_watch_sets_node_capacity_and_allocatable(
    cluster: LocalCluster, plugin_factory: Callable[..., FakeDevicePlugin]
) -> None:
    plugin = plugin_factory(devices=("d0", "d1", "d2"))
    cluster.wait_for(lambda: _allocatable(cluster) == ("3", "3"))
    plugin.set_devices(("d0",))
    cluster.wait_for(lambda: _allocatable(cluster) == ("1", "1"))


@pytest.mark.parametrize(
    ("version", "resource", "error"),
    [
        ("v1alpha", RESOURCE, "requested device plugin version v1alpha is not supported"),
        ("v1beta1", "cpu", "invalid name of device plugin socket: cpu"),
    ],
    ids=["version", "not-extended"],
)
def test_bad_registration_is_refused(
    cluster: LocalCluster, version: str, resource: str, error: str
) -> None:
    channel = grpc.insecure_channel(
        f"unix:{cluster.kubelet('node-a').device_plugins_dir / 'kubelet.sock'}"
    )
    try:
        with pytest.raises(grpc.RpcError) as raised:
            dp_grpc.RegistrationStub(channel).Register(
                dp.RegisterRequest(version=version, endpoint="x.sock", resource_name=resource),
                timeout=5,
            )
    finally:
        channel.close()
    assert error in str(raised.value.details())


@pytest.mark.parametrize(
    ("preferred", "pre_start"),
    [(False, False), (True, True)],
    ids=["plain", "preferred-and-pre-start"],
)
def test_allocate_per_container_and_pod_resources(
    cluster: LocalCluster,
    plugin_factory: Callable[..., FakeDevicePlugin],
    preferred: bool,
    pre_start: bool,
) -> None:
    plugin = plugin_factory(devices=("d0", "d1", "d2"), preferred=preferred, pre_start=pre_start)
    cluster.wait_for(lambda: _allocatable(cluster) == ("3", "3"))
    assert cluster.api is not None
    created = cluster.api.create(PODS, _two_container_pod("p"))
    cluster.wait_for(lambda: (_pod(cluster, "p") or {}).get("status", {}).get("phase") == "Running")

    assert len(plugin.allocations) == 2
    first, second = plugin.allocations
    assert len(first) == len(second) == 1
    assert set(first).isdisjoint(second)
    if preferred:
        assert plugin.preferred_requests == [(("d0", "d1", "d2"), 1), (("d0", "d1"), 1)]
        assert plugin.allocations == [("d2",), ("d1",)]
        assert plugin.pre_starts == [("d2",), ("d1",)]
        # what the shim relies on: after Allocate, pod-resources names the pod holding the ids
        assert plugin.seen_at_pre_start[0] == [("p", "c", ("d2",)), ("p", "d", ("d1",))]
    else:
        assert plugin.preferred_requests == []
        assert plugin.pre_starts == []
    kubelet = cluster.kubelet("node-a")
    cdi_ids, envs = kubelet.container_devices(created["metadata"]["uid"], "c")
    assert cdi_ids == (f"fake.dev/dev={first[0]}",)
    assert envs["FAKE_DEVICES"] == first[0]

    (listed,) = _list(cluster).pod_resources
    by_container = {
        c.name: [(d.resource_name, tuple(d.device_ids)) for d in c.devices]
        for c in listed.containers
    }
    assert by_container == {"c": [(RESOURCE, first)], "d": [(RESOURCE, second)]}

    channel = grpc.insecure_channel(f"unix:{kubelet.pod_resources_socket}")
    try:
        stub = pr_grpc.PodResourcesListerStub(channel)
        got = stub.Get(pr.GetPodResourcesRequest(pod_name="p", pod_namespace=NS), timeout=5)
        assert got.pod_resources == listed
        with pytest.raises(grpc.RpcError) as missing:
            stub.Get(pr.GetPodResourcesRequest(pod_name="nope", pod_namespace=NS), timeout=5)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        channel.close()

    cluster.api.delete(PODS, name="p", namespace=NS)
    cluster.wait_for(lambda: _pod(cluster, "p") is None)
    assert _list(cluster).pod_resources == []


def test_pod_resources_lists_a_pod_from_its_own_admission_turn_not_while_it_waits(
    cluster: LocalCluster, plugin_factory: Callable[..., FakeDevicePlugin]
) -> None:
    # The kubelet adds a pod to its pod manager right before admitting it, one pod at a time: a
    # plugin's Allocate sees the pod it serves (no devices yet) and no pod admitted after it.
    plugin = plugin_factory(devices=("d0", "d1"))
    gate = threading.Event()
    plugin.allocate_gate = gate
    cluster.wait_for(lambda: _allocatable(cluster) == ("2", "2"))
    assert cluster.api is not None
    kubelet = cluster.kubelet("node-a")
    try:
        cluster.api.create(PODS, pod("first", limits={RESOURCE: "1"}, nodeName="node-a"))
        assert plugin.allocate_started.wait(timeout=10)
        cluster.api.create(PODS, pod("second", limits={RESOURCE: "1"}, nodeName="node-a"))
        cluster.wait_for(lambda: kubelet.waiting_for_admission() == [f"{NS}/second"])
        assert plugin.listed() == [("first", "c", ())]
    finally:
        gate.set()
    for name in ("first", "second"):
        cluster.wait_for(
            lambda n=name: (_pod(cluster, n) or {}).get("status", {}).get("phase") == "Running"  # type: ignore[misc]
        )
    (first_ids,), second_call = plugin.allocations[0], plugin.seen_at_allocate[1]
    assert plugin.seen_at_allocate[0] == [("first", "c", ())]
    assert second_call == [("first", "c", (first_ids,)), ("second", "c", ())]
    assert kubelet.waiting_for_admission() == []


def test_not_enough_devices_rejects_the_pod(
    cluster: LocalCluster, plugin_factory: Callable[..., FakeDevicePlugin]
) -> None:
    plugin_factory(devices=("d0",))
    cluster.wait_for(lambda: _allocatable(cluster) == ("1", "1"))
    assert cluster.api is not None
    cluster.api.create(PODS, _two_container_pod("p", nodeName="node-a"))
    status = cluster.wait_for(
        lambda: (s := (_pod(cluster, "p") or {}).get("status", {})).get("phase") == "Failed" and s
    )
    assert status["reason"] == "UnexpectedAdmissionError"
    assert status["message"] == (
        "Pod was rejected: Allocate failed due to requested number of devices unavailable for "
        f"{RESOURCE}. Requested: 1, Available: 0, which is unexpected"
    )
    # the first container's device was given back: another pod gets it
    cluster.api.create(PODS, pod("next", limits={RESOURCE: "1"}))
    cluster.wait_for(
        lambda: (_pod(cluster, "next") or {}).get("status", {}).get("phase") == "Running"
    )


def test_failing_allocate_rejects_the_pod(
    cluster: LocalCluster, plugin_factory: Callable[..., FakeDevicePlugin]
) -> None:
    plugin = plugin_factory(devices=("d0",))
    plugin.fail_allocate = True
    cluster.wait_for(lambda: _allocatable(cluster) == ("1", "1"))
    assert cluster.api is not None
    cluster.api.create(PODS, pod("p", limits={RESOURCE: "1"}))
    status = cluster.wait_for(
        lambda: (s := (_pod(cluster, "p") or {}).get("status", {})).get("phase") == "Failed" and s
    )
    assert status["reason"] == "UnexpectedAdmissionError"
    assert "injected Allocate failure" in status["message"]


def test_allocatable_resources(
    cluster: LocalCluster, plugin_factory: Callable[..., FakeDevicePlugin]
) -> None:
    plugin_factory(devices=("d1", "d0"))
    cluster.wait_for(lambda: _allocatable(cluster) == ("2", "2"))
    channel = grpc.insecure_channel(f"unix:{cluster.kubelet('node-a').pod_resources_socket}")
    try:
        answer = pr_grpc.PodResourcesListerStub(channel).GetAllocatableResources(
            pr.AllocatableResourcesRequest(), timeout=5
        )
    finally:
        channel.close()
    assert [(d.resource_name, list(d.device_ids)) for d in answer.devices] == [
        (RESOURCE, ["d0", "d1"])
    ]


def test_kubelet_restart_requires_registration_again(
    cluster: LocalCluster, plugin_factory: Callable[..., FakeDevicePlugin]
) -> None:
    plugin = plugin_factory(devices=("d0", "d1"))
    cluster.wait_for(lambda: _allocatable(cluster) == ("2", "2"))
    kubelet = cluster.kubelet("node-a")
    before = kubelet.device_manager.socket_path.stat()

    kubelet.restart_device_manager()
    assert not plugin.path.exists()  # the kubelet wipes the plugin sockets too
    after = kubelet.device_manager.socket_path.stat()
    assert (after.st_ino, after.st_mtime_ns) != (before.st_ino, before.st_mtime_ns)
    cluster.wait_for(lambda: _allocatable(cluster) == ("0", "0"))

    plugin.stop()
    plugin.start()
    plugin.register()
    cluster.wait_for(lambda: _allocatable(cluster) == ("2", "2"))
