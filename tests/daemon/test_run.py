"""The life of a daemon process: parts stopped in the reverse order of their start once a signal
came, the client last; a configuration that can never work refused in one line with exit status 2;
any other error that ends the process logged, with exit status 1."""

from __future__ import annotations

import functools
import logging
import signal
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from driver.daemon.run import Daemon, Program, run_daemon
from driver.daemon.settings import DaemonSettings
from driver.errors import BackendError, ConfigError

pytestmark = pytest.mark.usefixtures("restored_handlers", "root_logger")

LOGGER = logging.getLogger("daemon-under-test")
PROGRAM = Program(name="instaslice-test", logger=LOGGER, log_fields=())
NO_SERVER = "http://127.0.0.1:1"
"""Nothing is asked of the API server: the client is only configured."""


def _settings(**changes: str | None) -> DaemonSettings:
    fields: dict[str, str | None] = {"kubeconfig": None, "kube_api_url": NO_SERVER, **changes}
    return DaemonSettings(
        kubeconfig=fields["kubeconfig"],
        kube_api_url=fields["kube_api_url"],
        kube_api_qps=0.0,
        kube_api_burst=1,
        metrics_address="",
        healthz_address="",
    )


def _run(serve: Callable[[Daemon], int], **changes: str | None) -> int:
    return run_daemon(PROGRAM, _settings(**changes), serve=serve, user_agent="instaslice-test")


def test_a_signal_stops_the_parts_last_started_first() -> None:
    stopped: list[str] = []

    def serve(daemon: Daemon) -> int:
        for part in ("backend", "plugin", "shim"):
            daemon.on_stop(functools.partial(stopped.append, part))
        signal.raise_signal(signal.SIGTERM)
        return daemon.wait()

    assert _run(serve) == 0
    assert stopped == ["shim", "plugin", "backend"]


def test_the_http_endpoints_serve_until_the_process_stops() -> None:
    answers: list[bytes] = []
    ports: list[int] = []

    def serve(daemon: Daemon) -> int:
        routes = {"/healthz": lambda: (200, "text/plain", b"ok\n")}
        (endpoint,) = daemon.serve_http([("127.0.0.1:0", routes)]).values()
        ports.append(endpoint.port)
        with urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/healthz", timeout=5) as r:
            answers.append(r.read())
        signal.raise_signal(signal.SIGTERM)
        return daemon.wait()

    assert _run(serve) == 0
    assert answers == [b"ok\n"]
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/healthz", timeout=5)


def test_a_configuration_error_is_one_line_and_status_2_after_the_parts_stopped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    stopped: list[str] = []

    def serve(daemon: Daemon) -> int:
        daemon.on_stop(lambda: stopped.append("part"))
        raise ConfigError("--state-dir /x is not writable\n(read-only file system)")

    assert _run(serve) == 2
    assert stopped == ["part"]
    assert capsys.readouterr().err == (
        "instaslice-test: error: --state-dir /x is not writable (read-only file system)\n"
    )


def test_an_unreadable_kubeconfig_is_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    served: list[Daemon] = []

    def serve(daemon: Daemon) -> int:
        served.append(daemon)
        return 0

    missing = tmp_path / "kubeconfig"
    assert _run(serve, kubeconfig=str(missing), kube_api_url=None) == 2
    assert served == []
    assert (
        capsys.readouterr().err == f"instaslice-test: error: --kubeconfig {missing}: no such file\n"
    )


def test_a_kubeconfig_that_is_no_kubeconfig_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    garbage = tmp_path / "kubeconfig"
    garbage.write_bytes(b"\x00\xff garbage")
    assert _run(lambda daemon: 0, kubeconfig=str(garbage), kube_api_url=None) == 2
    err = capsys.readouterr().err
    assert err.startswith("instaslice-test: error: cannot load Kubernetes client configuration")
    assert err.count("\n") == 1


def test_any_other_error_is_logged_with_status_1(capsys: pytest.CaptureFixture[str]) -> None:
    def serve(daemon: Daemon) -> int:
        raise BackendError("the GPU went away")

    assert _run(serve) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(" ERROR daemon-under-test: instaslice-test failed: the GPU went away")
