"""A tiny HTTP server for a daemon's operational endpoints (``/metrics``, ``/healthz``, ``/readyz``).

The standard library's threading server is enough for a probe and a scrape; each route is a function
returning (status, content type, body). Port 0 picks a free port (tests); ``port`` tells which.

Plain HTTP, no TLS: what it serves (metrics, probe answers) is not secret and the kubelet's probes
and Prometheus scrape it over the pod network; where the metrics must not be readable on that
network, bind them to loopback (``--metrics-address 127.0.0.1:PORT``) behind an authenticating proxy.
Callers are bounded as the webhook's are (``connguard``): ``MAX_CONNECTIONS`` at once, an idle
connection closed after ``IDLE_TIMEOUT_S``, a request answered within ``REQUEST_DEADLINE_S`` of its
first byte or cut off.
"""

from __future__ import annotations

import logging
import threading
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

from driver.daemon.connguard import ConnectionGuard, handle_guarded
from driver.daemon.flags import split_address

logger = logging.getLogger(__name__)

Route = Callable[[], tuple[int, str, bytes]]
MAX_CONNECTIONS: Final = 16
IDLE_TIMEOUT_S: Final = 30.0
REQUEST_DEADLINE_S: Final = 30.0


def probe(check: Callable[[], bool], *, what: str) -> Route:
    """A route answering 200 ``ok`` while ``check()`` holds, else 503."""

    def route() -> tuple[int, str, bytes]:
        if check():
            return 200, "text/plain", b"ok\n"
        return 503, "text/plain", f"{what}: not yet\n".encode()

    return route


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64
    """The listen backlog: at socketserver's 5, a burst of connects waits for SYN retries (1 s)."""
    routes: Mapping[str, Route] = {}
    guard: ConnectionGuard

    def verify_request(self, request: Any, client_address: Any) -> bool:
        return self.guard.admit(request)

    def shutdown_request(self, request: Any) -> None:
        self.guard.release(request)
        super().shutdown_request(request)

    def service_actions(self) -> None:
        self.guard.sweep()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = IDLE_TIMEOUT_S
    wbufsize = 64 * 1024
    """Headers and body leave in one write: as two, the body waits for the client's delayed ACK
    of the headers (Nagle), up to 40 ms a probe or scrape."""

    def handle_one_request(self) -> None:
        handle_guarded(self, self.server.guard, super().handle_one_request)

    def do_GET(self) -> None:
        route = self.server.routes.get(self.path.split("?", 1)[0])
        if route is None:
            status, content_type, body = 404, "text/plain", b"not found\n"
        else:
            try:
                status, content_type, body = route()
            except Exception as exc:
                logger.exception("handler for %s failed", self.path)
                status, content_type, body = 500, "text/plain", f"{exc}\n".encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("http: " + format, *args)


class HttpEndpoint:
    """Serves ``routes`` (path → route) on ``address`` (host, port) from its own thread.

    The address comes split already (``flags.split_address``; the flags were checked with it).
    """

    def __init__(
        self,
        *,
        address: tuple[str, int],
        routes: Mapping[str, Route],
        name: str,
        max_connections: int = MAX_CONNECTIONS,
        request_deadline: float = REQUEST_DEADLINE_S,
    ) -> None:
        self._address = address
        self._routes = dict(routes)
        self.name = name
        self._max_connections = max_connections
        self._request_deadline = request_deadline
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def paths(self) -> frozenset[str]:
        """The paths it serves."""
        return frozenset(self._routes)

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError(f"{self.name} endpoint is not started")
        return int(self._server.server_address[1])

    def start(self) -> None:
        server = _Server(self._address, _Handler)
        server.routes = self._routes
        server.guard = ConnectionGuard(
            max_connections=self._max_connections,
            deadline_s=self._request_deadline,
            name=self.name,
        )
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.2}, name=self.name, daemon=True
        )
        self._thread.start()
        logger.info("serving %s on %s:%s", self.name, self._address[0], self.port)

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()


def endpoints_by_address(
    routes: Iterable[tuple[str, Mapping[str, Route]]],
    *,
    split: Callable[[str], tuple[str, int]] = split_address,
) -> dict[str, HttpEndpoint]:
    """One endpoint per distinct ``host:port`` (``split`` parses it; an empty address is off)
    serving every route given for that address: e.g. ``/metrics`` and the probes share a port
    when their flags name the same one."""
    served: dict[str, dict[str, Route]] = {}
    for address, paths in routes:
        if address:
            served.setdefault(address, {}).update(paths)
    return {
        address: HttpEndpoint(
            address=split(address), routes=paths, name=f"http {'+'.join(sorted(paths))}"
        )
        for address, paths in served.items()
    }


def scrape_loopback(port: int, *, timeout: float) -> bytes:
    """``/metrics`` of a daemon serving on 127.0.0.1:``port``; empty if it does not answer in
    ``timeout`` seconds (whoever asks goes on without it)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as reply:
            return bytes(reply.read())
    except OSError as exc:
        logger.debug("no metrics from 127.0.0.1:%d: %s", port, exc)
        return b""
