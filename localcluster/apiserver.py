"""The local API server: kube-apiserver's HTTP surface on loopback, for tests and ``make demo``.

:class:`LocalApiServer` owns the store, the garbage collector, the disruption controller
(PodDisruptionBudget status) and a ``ThreadingHTTPServer`` (HTTP/1.1 keep-alive, one thread per
connection, chunked watch streams). ``start`` returns as soon as the socket listens; ``stop``
closes every watch, connection and thread; ``restart`` drops every watch and connection but keeps
data and port, like an API server restart seen from a client.

Why our own and not ``kmock`` (PyPI): kmock is asyncio/aiohttp-based (we run threads), and its
Kubernetes emulator keeps objects as plain merged dicts — no resourceVersion (lists answer
``'...'``), no 409 on stale writes, no selectors, watches that ignore resourceVersion (no
BOOKMARK, no 410), no strategic merge, no validation, GC or admission — so extending it would
have meant writing all of this anyway, on top of a DSL made for scripted responses.

Known differences from kube-apiserver (deliberate, cheap to change if a test needs it):
lists page by ``limit``/``continue`` in (namespace, name) order, but later pages read the store as
it is then (kube serves one snapshot; an informer converges either way); DELETE
answers with the object for every kind (kube answers a ``Status`` for some); core and
``events.k8s.io`` Events are stored apart; strategic merge ignores ``$setElementOrder``; pods
may change affinity freely while gated (kube only allows narrowing); webhook ``matchConditions``
and ``reinvocationPolicy`` are not evaluated and only CREATE/UPDATE are sent; ``dryRun`` and
server-side apply are refused (400/415); bound pods are deleted at once unless
``graceful_pod_deletion`` is set (then they wait for a kubelet's ``gracePeriodSeconds=0``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from localcluster import errors
from localcluster.admission import MutatingAdmission, ServiceResolver
from localcluster.audit import AuditSink, record_request
from localcluster.gc import GarbageCollector
from localcluster.handlers import ApiHandler, ApiRequest, ApiResponse
from localcluster.policy.controller import DisruptionController
from localcluster.scheduling.admission import PriorityAdmission
from localcluster.scheduling.storage import create_system_classes
from localcluster.store import Store

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 3 * 1024 * 1024  # kube-apiserver's request body limit
_DRAIN_LIMIT = 16 * 1024 * 1024  # oversized bodies up to this are read and dropped, not cut off
_STREAM_END_GRACE_S = 1.0  # how long stop/restart let watch streams end cleanly


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    audit: AuditSink | None = None

    def __init__(self, address: tuple[str, int], api: ApiHandler, max_body: int) -> None:
        self.api = api
        self.max_body = max_body
        self._connections: set[socket.socket] = set()
        self._threads_alive: set[threading.Thread] = set()
        self._conn_lock = threading.Lock()
        self._streams = 0
        self._streams_done = threading.Condition(self._conn_lock)
        self.closing = False
        super().__init__(address, _Handler)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        thread = threading.current_thread()
        thread.name = f"localcluster-conn-{client_address[1]}"
        with self._conn_lock:
            self._threads_alive.add(thread)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._conn_lock:
                self._threads_alive.discard(thread)

    def join_connection_threads(self, timeout: float) -> None:
        """Wait for the connection threads to end.

        ``ThreadingMixIn.server_close`` joins only non-daemon threads, and ours are daemons (a
        client that never closes its keep-alive connection must not keep the process alive).
        """
        deadline = time.monotonic() + timeout
        with self._conn_lock:
            threads = list(self._threads_alive)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away is routine; anything else is logged, never printed."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            log.debug("connection from %s ended: %s", client_address, error)
        else:
            log.exception("request from %s failed", client_address)

    def track(self, conn: socket.socket) -> None:
        with self._conn_lock:
            self._connections.add(conn)
            if self.closing:
                _shut(conn)

    def untrack(self, conn: socket.socket) -> None:
        with self._conn_lock:
            self._connections.discard(conn)

    def stream_started(self) -> None:
        with self._conn_lock:
            self._streams += 1

    def stream_ended(self) -> None:
        with self._conn_lock:
            self._streams -= 1
            self._streams_done.notify_all()

    def wait_streams_ended(self, timeout: float) -> None:
        with self._conn_lock:
            self._streams_done.wait_for(lambda: self._streams == 0, timeout)

    def drop_connections(self) -> None:
        with self._conn_lock:
            for conn in list(self._connections):
                _shut(conn)


def _shut(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HttpServer

    def setup(self) -> None:
        super().setup()
        # Small responses must not wait for the client's delayed ACK (Nagle): ~40 ms per request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.track(self.connection)

    def finish(self) -> None:
        self.server.untrack(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def do_HEAD(self) -> None:
        self._serve()

    def do_OPTIONS(self) -> None:
        self._serve()

    def _read_body(self) -> bytes | None:
        """The request body, or None after answering 413 (connection then closed)."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks: list[bytes] = []
            size = 0
            while (length := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)) > 0:
                size += length
                if size > self.server.max_body:
                    self._too_large()
                    return None
                chunks.append(self.rfile.read(length))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        if length > self.server.max_body:
            if length <= _DRAIN_LIMIT:
                # Read it away so the client gets the 413 instead of a broken pipe.
                remaining = length
                while remaining > 0 and (chunk := self.rfile.read(min(remaining, 1 << 20))):
                    remaining -= len(chunk)
                self._send(ApiResponse(413, errors.too_large(self.server.max_body).status()))
            else:
                self._too_large()
            return None
        return self.rfile.read(length) if length else b""

    def _too_large(self) -> None:
        self.close_connection = True
        self._send(ApiResponse(413, errors.too_large(self.server.max_body).status()), close=True)

    def _serve(self) -> None:
        try:
            body = self._read_body()
        except ValueError:
            self.close_connection = True
            failure = errors.bad_request("malformed chunked request body")
            self._send(ApiResponse(400, failure.status()), close=True)
            return
        if body is None:
            return
        parts = urlsplit(self.path)
        request = ApiRequest(
            method=self.command,
            path=parts.path,
            query=dict(parse_qsl(parts.query, keep_blank_values=True)),
            body=body,
            content_type=self.headers.get("Content-Type") or "",
            accept=self.headers.get("Accept") or "",
        )
        response = self.server.api.handle(request)
        if self.server.audit is not None:
            agent = self.headers.get("User-Agent") or ""
            self.server.audit(
                record_request(
                    method=request.method,
                    path=request.path,
                    query=request.query,
                    user_agent=agent,
                    code=response.code,
                )
            )
        if response.stream is not None:
            self._stream(response)
        else:
            self._send(response)

    def _send(self, response: ApiResponse, *, close: bool = False) -> None:
        if response.text is not None:
            payload, content_type = response.text.encode(), "text/plain; charset=utf-8"
        else:
            payload, content_type = json.dumps(response.body).encode(), "application/json"
        self.log_request(response.code)
        head = [
            f"{self.protocol_version} {response.code} {HTTPStatus(response.code).phrase}",
            f"Date: {self.date_time_string()}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(payload)}",
        ]
        if close:
            head.append("Connection: close")
        body = b"" if self.command == "HEAD" else payload
        # One send for head and body: no Nagle/delayed-ACK stall between them.
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)

    def _stream(self, response: ApiResponse) -> None:
        assert response.stream is not None
        stream = response.stream
        self.server.stream_started()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk in stream:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
            self.server.stream_ended()


class LocalApiServer:
    """A kube-apiserver stand-in on ``host:port`` (port 0 picks a free one)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        watch_history: int = 10_000,
        service_resolver: ServiceResolver | None = None,
        *,
        require_namespaces: bool = False,
        graceful_pod_deletion: bool = False,
        bookmark_interval: float = 1.0,
        max_body_bytes: int = MAX_BODY_BYTES,
        audit: AuditSink | None = None,
    ) -> None:
        """``audit``: called with every answered request (see ``localcluster.audit``)."""
        self._audit = audit
        self.store = Store(
            watch_history=watch_history,
            require_namespaces=require_namespaces,
            graceful_pod_deletion=graceful_pod_deletion,
        )
        self._gc = GarbageCollector(self.store)
        self._disruption = DisruptionController(self.store)
        self._host, self._port = host, port
        self._closing = False
        self._api = ApiHandler(
            self.store,
            MutatingAdmission(self.store, service_resolver=service_resolver),
            priority=PriorityAdmission(self.store),
            server_address=lambda: f"{self._host}:{self._port}",
            bookmark_interval=bookmark_interval,
            closing=lambda: self._closing,
        )
        self._max_body = max_body_bytes
        self._http: _HttpServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    def start(self) -> LocalApiServer:
        if self._http is not None:
            return self
        self._closing = False
        # kube-apiserver's post-start hook, which its readiness waits for
        create_system_classes(self.store)
        self._http = _HttpServer((self._host, self._port), self._api, self._max_body)
        self._port = self._http.server_address[1]
        self._http.audit = self._audit
        self._gc.start()
        self._disruption.start()
        self._thread = threading.Thread(
            target=self._http.serve_forever,
            kwargs={"poll_interval": 0.01},
            name=f"localcluster-apiserver-{self._port}",
            daemon=True,
        )
        self._thread.start()
        log.info("local API server listening on %s", self.url)
        return self

    def stop(self) -> None:
        http, thread = self._http, self._thread
        if http is None or thread is None:
            return
        self._closing = True
        http.shutdown()
        thread.join()
        with http._conn_lock:
            http.closing = True
        self.store.close_watches()
        http.wait_streams_ended(_STREAM_END_GRACE_S)
        http.drop_connections()
        http.server_close()
        http.join_connection_threads(_STREAM_END_GRACE_S * 5)
        self._gc.stop()
        self._disruption.stop()
        self._http = self._thread = None

    def restart(self) -> None:
        """Drop every watch stream and connection; data, history and port stay."""
        if self._http is None:
            return
        self.store.close_watches()
        self._http.wait_streams_ended(_STREAM_END_GRACE_S)
        self._http.drop_connections()

    def compact(self) -> None:
        """Forget the watch history: a watch from any older resourceVersion gets 410 Expired."""
        self.store.compact()

    def settle(self, timeout: float = 5.0) -> bool:
        """Wait until garbage collection and the disruption controller have caught up with every
        write so far (for tests)."""
        deadline = time.monotonic() + timeout
        while True:
            gc_idle = self._gc.wait_idle(max(0.0, deadline - time.monotonic()))
            budgets_idle = self._disruption.wait_idle(max(0.0, deadline - time.monotonic()))
            # each may have written while the other was waited for
            if gc_idle and budgets_idle and self._gc.wait_idle(0):
                return True
            if time.monotonic() >= deadline:
                return False

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig (JSON, which is YAML) pointing kubectl and clients at this server."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "localcluster", "cluster": {"server": self.url}}],
            "users": [{"name": "localcluster", "user": {}}],
            "contexts": [
                {
                    "name": "localcluster",
                    "context": {
                        "cluster": "localcluster",
                        "user": "localcluster",
                        "namespace": "default",
                    },
                }
            ],
            "current-context": "localcluster",
            "preferences": {},
        }
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config, indent=2) + "\n")
        return path

    def __enter__(self) -> LocalApiServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
