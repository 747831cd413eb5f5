"""A node the plugin cannot serve yet: it says why and waits with back-off instead of crash-looping
(no GPU backend), and a plugin the kubelet never registers says so on its Node and is not ready
(host paths that are not this kubelet's) instead of a silent success. A backend that can never
start (a ``ConfigError``) is not waited for."""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from driver.errors import BackendError, ConfigError
from driver.gpu.backend import MigModeBackend
from driver.gpu.emulated import EmulatedGpuBackend
from kubeletplugin.dra.registration import RegistrationTracker, RegistrationWatchdog
from kubeletplugin.node.waiting import NVML_HINT, BackendWait, backoff, waiting_routes
from kubeletplugin.settings import Settings, parse_settings
from tests.kubeletplugin.harness import NodeHarness


def _settings(*extra: str) -> Settings:
    return parse_settings(["--node-name", "node-w", "--healthz-address", "", *extra], environ={})


def test_back_off_doubles_from_ten_seconds_to_five_minutes() -> None:
    delays = backoff()
    assert [next(delays) for _ in range(8)] == [10, 20, 40, 80, 160, 300, 300, 300]


def test_the_backend_is_retried_with_back_off_and_each_failure_reported(tmp_path: Path) -> None:
    attempts: list[float] = []
    reports: list[str] = []
    backend = EmulatedGpuBackend(
        node_name="node-w", spec="1xA100-40GB", state_file=tmp_path / "gpus.json"
    )

    def build(settings: Settings) -> MigModeBackend:
        attempts.append(time.monotonic())
        if len(attempts) < 3:
            raise BackendError("NVML Shared Library Not Found")
        return backend

    wait = BackendWait(
        settings=_settings(),
        report=reports.append,
        stop=threading.Event(),
        build=build,
        delays=iter([0.01, 0.02]),
    )
    assert wait.run() is backend
    backend.close()
    assert len(attempts) == 3
    assert len(reports) == 2
    assert reports[0] == (
        "cannot start the nvml GPU backend (NVML Shared Library Not Found): " + NVML_HINT
    )


def test_a_backend_that_can_never_start_is_not_waited_for() -> None:
    reports: list[str] = []

    def build(settings: Settings) -> MigModeBackend:
        raise ConfigError("corrupt state file /var/lib/instaslice/emulated-gpus.json")

    wait = BackendWait(
        settings=_settings(), report=reports.append, stop=threading.Event(), build=build
    )
    with pytest.raises(ConfigError, match="corrupt state file"):
        wait.run()
    assert reports == []


def test_a_stop_while_waiting_ends_the_wait_at_once() -> None:
    stop = threading.Event()

    def build(settings: Settings) -> MigModeBackend:
        stop.set()  # SIGTERM arrives while the node is being waited for
        raise BackendError("no NVML")

    started = time.monotonic()
    wait = BackendWait(
        settings=_settings(), report=lambda _: None, stop=stop, build=build, delays=backoff()
    )
    assert wait.run() is None
    assert time.monotonic() - started < 5


def test_while_waiting_the_plugin_is_alive_but_not_ready_and_both_probes_say_why() -> None:
    routes = waiting_routes(lambda: "cannot start the nvml GPU backend (no NVML)")
    assert routes["/healthz"]() == (
        200,
        "text/plain",
        b"waiting: cannot start the nvml GPU backend (no NVML)\n",
    )
    status, _, body = routes["/readyz"]()
    assert status == 503
    assert b"no NVML" in body


@contextlib.contextmanager
def _watchdog(tracker: RegistrationTracker, reports: list[str]) -> Iterator[RegistrationWatchdog]:
    watchdog = RegistrationWatchdog(
        tracker=tracker,
        registration_socket=Path("/var/lib/kubelet/plugins_registry/mig.instaslice.dev-reg.sock"),
        report=reports.append,
        grace_s=0.05,
        delays=iter(lambda: 0.05, None),
    )
    watchdog.start()
    try:
        yield watchdog
    finally:
        watchdog.stop()


def _wait(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_plugin_no_kubelet_registers_says_so_until_the_kubelet_does() -> None:
    tracker = RegistrationTracker()
    reports: list[str] = []
    with _watchdog(tracker, reports):
        _wait(lambda: len(reports) >= 2)
        assert reports[0].startswith(
            "the kubelet has not registered the plugin 0s after it began serving "
            "/var/lib/kubelet/plugins_registry/mig.instaslice.dev-reg.sock: this node's kubelet "
            "does not watch /var/lib/kubelet/plugins_registry"
        )
        tracker.record(registered=True, error="")
        time.sleep(0.2)
        seen = len(reports)
        time.sleep(0.2)
        assert len(reports) == seen


def test_a_registration_the_kubelet_refused_is_reported_with_its_reason() -> None:
    tracker = RegistrationTracker()
    tracker.record(registered=False, error="version 9 not supported")
    reports: list[str] = []
    with _watchdog(tracker, reports):
        _wait(lambda: bool(reports))
    assert reports[0] == "the kubelet refused to register the plugin: version 9 not supported"


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_plugin_is_ready_only_once_the_kubelet_registered_it(node: NodeHarness) -> None:
    plugin = node.start_plugin(http=True)
    port = plugin.endpoint_port("healthz")
    assert _get(port, "/healthz")[0] == 200
    status, body = _get(port, "/readyz")
    assert status == 503
    assert "not ready: not registered" in body
    node.kubelet()  # the kubelet's plugin watcher: GetInfo, NotifyRegistrationStatus
    assert _get(port, "/readyz")[0] == 200
