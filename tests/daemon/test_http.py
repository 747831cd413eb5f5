"""The operational HTTP server: routes answer GET, unknown paths 404, a failing route 500 (the
server keeps serving), probes 200/503; query strings are ignored; stop frees the port."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from driver.daemon.http import HttpEndpoint, Route, endpoints_by_address, probe


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, reply.headers["Content-Type"], reply.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.headers["Content-Type"], exc.read().decode()


def _fail() -> tuple[int, str, bytes]:
    raise RuntimeError("scrape broke")


@pytest.fixture
def ready() -> list[bool]:
    return [False]


@pytest.fixture
def endpoint(ready: list[bool]) -> Iterator[HttpEndpoint]:
    routes: dict[str, Route] = {
        "/metrics": lambda: (200, "text/plain; version=0.0.4", b"up 1\n"),
        "/readyz": probe(lambda: ready[0], what="controller"),
        "/boom": _fail,
    }
    server = HttpEndpoint(address=("127.0.0.1", 0), routes=routes, name="test http")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/metrics", (200, "text/plain; version=0.0.4", "up 1\n")),
        ("/metrics?name=up", (200, "text/plain; version=0.0.4", "up 1\n")),
        ("/nowhere", (404, "text/plain", "not found\n")),
        ("/boom", (500, "text/plain", "scrape broke\n")),
    ],
    ids=["route", "query-ignored", "unknown", "failing-route"],
)
def test_routes(
    endpoint: HttpEndpoint,
    path: str,
    expected: tuple[int, str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert _get(f"http://127.0.0.1:{endpoint.port}{path}") == expected
    assert ("handler for /boom failed" in caplog.text) is (path == "/boom")
    assert _get(f"http://127.0.0.1:{endpoint.port}/metrics")[0] == 200  # still serving


def test_probe_is_503_until_its_check_holds(endpoint: HttpEndpoint, ready: list[bool]) -> None:
    url = f"http://127.0.0.1:{endpoint.port}/readyz"
    assert _get(url) == (503, "text/plain", "controller: not yet\n")
    ready[0] = True
    assert _get(url) == (200, "text/plain", "ok\n")


def test_port_is_known_only_while_started() -> None:
    server = HttpEndpoint(address=("127.0.0.1", 0), routes={}, name="idle")
    with pytest.raises(RuntimeError, match="idle endpoint is not started"):
        _ = server.port
    server.start()
    port = server.port
    assert port > 0
    server.stop()
    server.stop()  # a second stop is harmless
    with pytest.raises(RuntimeError, match="not started"):
        _ = server.port


def test_routes_for_one_address_share_a_server_and_an_empty_address_is_off() -> None:
    def metrics() -> tuple[int, str, bytes]:
        return 200, "text/plain", b"m\n"

    def healthy() -> bool:
        return True

    def split(address: str) -> tuple[str, int]:
        host, _, port = address.rpartition(":")
        return host, int(port)

    shared = endpoints_by_address(
        [
            ("127.0.0.1:0", {"/metrics": metrics}),
            ("127.0.0.1:0", {"/healthz": probe(healthy, what="x")}),
        ],
        split=split,
    )
    assert list(shared) == ["127.0.0.1:0"]
    assert shared["127.0.0.1:0"].paths == {"/metrics", "/healthz"}
    apart = endpoints_by_address(
        [("127.0.0.1:1", {"/metrics": metrics}), ("", {"/healthz": probe(healthy, what="x")})],
        split=split,
    )
    assert list(apart) == ["127.0.0.1:1"]
    assert apart["127.0.0.1:1"].paths == {"/metrics"}
    server = shared["127.0.0.1:0"]
    server.start()
    try:
        assert _get(f"http://127.0.0.1:{server.port}/metrics")[2] == "m\n"
        assert _get(f"http://127.0.0.1:{server.port}/healthz")[0] == 200
    finally:
        server.stop()
