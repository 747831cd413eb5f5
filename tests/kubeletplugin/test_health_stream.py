"""The DRA resource-health stream over a real unix socket, read with the generated gRPC stubs the
way the kubelet's health client reads it (``NodeWatchResources``, drahealth v1alpha1)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from driver.gpu.emulated import EmulatedGpuBackend
from kubeletplugin.health.stream import DeviceHealthBoard, DraHealthServicer, add_health_service
from kubeletplugin.node.inventory import NodeInventory, build_inventory
from kubeletplugin.sockets import UnixGrpcServer
from tests.kubeletplugin.harness import HealthWatch

NODE = "node-s"
A100_40GB_DEVICES = 25


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def inventory(*, unhealthy: dict[int, str] | None = None) -> NodeInventory:
    gpus = EmulatedGpuBackend(node_name=NODE, spec="2xA100-40GB").gpus()
    marks = unhealthy or {}
    return build_inventory(
        replace(g, healthy=False, health_reason=marks[g.index], health_code="X")
        if g.index in marks
        else g
        for g in gpus
    )


class Served:
    def __init__(self, socket: Path, *, clock: Clock, resend: float, max_watchers: int) -> None:
        self.board = DeviceHealthBoard(pool=NODE, stale_after_seconds=120, clock=clock)
        self.servicer = DraHealthServicer(
            self.board, resend_seconds=resend, timeout_seconds=45, max_watchers=max_watchers
        )
        self.server = UnixGrpcServer(
            path=socket, register=lambda s: add_health_service(s, self.servicer), name="health"
        )
        self.server.start()
        self.watches: list[HealthWatch] = []

    def watch(self) -> HealthWatch:
        watch = HealthWatch(str(self.server.path))
        self.watches.append(watch)
        return watch

    def close(self) -> None:
        self.board.close()
        for watch in self.watches:
            watch.cancel()
        self.server.stop()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def served(tmp_path: Path, clock: Clock) -> Iterator[Served]:
    served = Served(tmp_path / "dra.sock", clock=clock, resend=3600, max_watchers=3)
    served.board.inventory_read(inventory())
    try:
        yield served
    finally:
        served.close()


def test_the_full_state_comes_on_connect_with_our_pool_and_device_names(
    served: Served, clock: Clock
) -> None:
    watch = served.watch()
    health = watch.wait_for(lambda h: len(h) == 2 * A100_40GB_DEVICES, what="every device")
    assert set(health) == set(inventory().devices)
    assert {h for h, _ in health.values()} == {"HEALTHY"}
    (first,) = watch.responses
    assert {d.device.pool_name for d in first.devices} == {NODE}
    assert {d.health_check_timeout_seconds for d in first.devices} == {45}
    assert {d.last_updated_time for d in first.devices} == {int(clock.now)}


def test_every_change_sends_the_full_state_again(served: Served, clock: Clock) -> None:
    watch = served.watch()
    watch.wait_for(lambda h: len(h) == 2 * A100_40GB_DEVICES, what="the first state")
    clock.now += 30
    served.board.inventory_read(inventory(unhealthy={1: "XID 79: fell off the bus"}))
    health = watch.wait_for(lambda h: h["gpu-1-1g-5gb-0"][0] == "UNHEALTHY", what="GPU 1 down")
    assert len(health) == 2 * A100_40GB_DEVICES  # the complete list, not just what changed
    unhealthy = {n for n, (h, _) in health.items() if h == "UNHEALTHY"}
    assert unhealthy == {n for n in health if n.startswith("gpu-1-")}
    assert "XID 79: fell off the bus" in health["gpu-1-1g-5gb-0"][1]
    latest = watch.responses[-1]
    times = {d.device.device_name: d.last_updated_time for d in latest.devices}
    assert times["gpu-1-1g-5gb-0"] == int(clock.now)  # changed now
    assert times["gpu-0-1g-5gb-0"] == int(clock.now) - 30  # unchanged since the first read

    served.board.inventory_failed("reading the GPUs failed: NVML gone")
    health = watch.wait_for(lambda h: h["gpu-0-1g-5gb-0"][0] == "UNKNOWN", what="unknown")
    assert {h for h, _ in health.values()} == {"UNKNOWN"}
    assert health["gpu-0-1g-5gb-0"][1] == "reading the GPUs failed: NVML gone"


def test_several_watchers_each_get_every_change(served: Served) -> None:
    watches = [served.watch(), served.watch()]
    for watch in watches:
        watch.wait_for(lambda h: len(h) == 2 * A100_40GB_DEVICES, what="the first state")
    served.board.inventory_read(inventory(unhealthy={0: "lost"}))
    for watch in watches:
        watch.wait_for(lambda h: h["gpu-0-7g-40gb-0"][0] == "UNHEALTHY", what="the change")


def test_watchers_beyond_the_cap_are_refused_and_a_gone_one_frees_its_place(
    served: Served,
) -> None:
    watches = [served.watch() for _ in range(3)]
    for watch in watches:
        watch.wait_for(bool, what="the first state")
    extra = served.watch()
    assert extra.ended.wait(10)
    assert extra.status == grpc.StatusCode.RESOURCE_EXHAUSTED
    watches[0].cancel()  # the client goes away: its stream ends and its place is free
    deadline = time.monotonic() + 10
    while served.servicer.watchers != 2:
        assert time.monotonic() < deadline, "the gone watcher still holds its place"
        time.sleep(0.01)
    served.watch().wait_for(bool, what="a new watcher's first state")
    assert served.servicer.watchers == 3


def test_closing_ends_every_stream_cleanly(served: Served) -> None:
    watch = served.watch()
    watch.wait_for(bool, what="the first state")
    served.board.close()
    assert watch.ended.wait(10)
    assert watch.status == grpc.StatusCode.OK  # the kubelet sees EOF and reconnects later


def test_the_state_is_repeated_while_nothing_changes(tmp_path: Path, clock: Clock) -> None:
    """The kubelet marks a device Unknown when it heard nothing of it for the timeout."""
    served = Served(tmp_path / "dra.sock", clock=clock, resend=0.05, max_watchers=2)
    served.board.inventory_read(inventory())
    try:
        watch = served.watch()
        watch.wait_for(lambda _: len(watch.responses) >= 3, what="repeated sends")
        assert len({r.SerializeToString() for r in watch.responses[:3]}) == 1
    finally:
        served.close()


def test_devices_not_checked_for_too_long_are_unknown(served: Served, clock: Clock) -> None:
    clock.now += 121  # no inventory read since: the health we know is stale
    health = served.watch().wait_for(bool, what="the first state")
    assert {h for h, _ in health.values()} == {"UNKNOWN"}
    assert "not checked for 121 s" in health["gpu-0-1g-5gb-0"][1]


def test_long_messages_are_cut_as_the_kubelet_would(served: Served) -> None:
    served.board.inventory_read(inventory(unhealthy={0: "x" * 5000}))
    health = served.watch().wait_for(bool, what="the first state")
    message = health["gpu-0-1g-5gb-0"][1]
    assert len(message) == 1024
    assert message.endswith("...")
