"""The HTTPS endpoint kube-apiserver calls for pod admission: bytes in, ``admission`` decides.

stdlib only (``http.server`` + ``ssl``), threads like the rest of the code base. The TLS context is
chosen per connection, so a renewed certificate (our own rotation, or cert-manager updating the
mounted Secret) is served without a restart: the files are checked for changes at most every
``reload_interval`` seconds and a pair that fails to load (caught mid-write) keeps the old context.

Errors never take the server down. A body that is not JSON, or not an ``AdmissionReview``, gets
HTTP 400; an unexpected failure of the decision gets HTTP 500 — kube-apiserver then applies the
webhook's ``failurePolicy``, which is the operator's choice to make, not ours.

What callers may hold is bounded (``driver.daemon.connguard``): ``MAX_CONNECTIONS`` open at once,
``REQUEST_DEADLINE_S`` for a TLS handshake or for one request from its first byte to its answer (a
client sending a byte a second is cut off there), ``MAX_BODY_BYTES`` per body and
``BODY_BUDGET_BYTES`` of bodies in memory across all requests.

TLS is 1.2 or newer (``MIN_TLS_VERSION``); on TLS 1.2 only forward-secret AEAD suites are offered
(``TLS12_CIPHERS``: ECDHE with AES-GCM or ChaCha20-Poly1305, what Go's client, kube-apiserver,
prefers); TLS 1.3 suites are OpenSSL's, all AEAD.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import orjson

from api import wire
from controller.webhook.admission import MalformedReviewError
from driver.daemon.connguard import BodyBudget, ConnectionGuard, handle_guarded
from driver.errors import ConfigError

_log = logging.getLogger(__name__)

ReviewHandler = Callable[[Mapping[str, Any]], wire.AdmissionReview]
"""An ``AdmissionReview`` in, the answering ``AdmissionReview`` out (``admission.review_pod``)."""
AnswerObserver = Callable[[int, float, "Mapping[str, Any] | None"], None]
"""Told of every answered POST: HTTP status, seconds from headers read to answer written, and the
answering ``AdmissionReview`` (None for an error answer) — ``metrics.WebhookMetrics.answered``."""

DEFAULT_PATHS: Final = ("/mutate-pods", "/mutate-v1-pod", "/mutate-resource-v1-resourceclaim")
"""``/mutate-v1-pod`` and ``/mutate-resource-v1-resourceclaim`` are what deploy/base/webhook.yaml
names (the review answers by the object's kind; the paths keep kube-apiserver's metrics and logs
apart); ``/mutate-pods`` is the short form."""

MAX_BODY_BYTES: Final = 8 * 1024 * 1024
IDLE_TIMEOUT_S: Final = 120.0
"""How long a connection may sit silent before we close it. Longer than kube-apiserver keeps an idle
webhook connection (its transport's 90 s): a server that closes first races the client's next
request on that connection, which then fails with a broken pipe — and a POST is not retried, so
the pod create fails (seen on a real 1.36 control plane with 30 s here)."""
RESPONSE_BUFFER_BYTES: Final = 64 * 1024
MAX_CONNECTIONS: Final = 64
"""kube-apiserver opens one connection per concurrent call (HTTP/1.1): far fewer than this."""
REQUEST_DEADLINE_S: Final = 30.0
"""The longest ``timeoutSeconds`` a webhook may have: kube-apiserver gives up on a call by then."""
BODY_BUDGET_BYTES: Final = 32 * 1024 * 1024
BODY_WAIT_S: Final = 5.0
"""How long a request waits for room in ``BODY_BUDGET_BYTES`` before it is refused (503)."""
MIN_TLS_VERSION: Final = ssl.TLSVersion.TLSv1_2
TLS12_CIPHERS: Final = "ECDHE+AESGCM:ECDHE+CHACHA20"
_FileStamp = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class CallerLimits:
    """What all callers together may hold of the server (module docstring)."""

    idle_timeout_s: float = IDLE_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS
    request_deadline_s: float = REQUEST_DEADLINE_S
    body_budget_bytes: int = BODY_BUDGET_BYTES
    body_wait_s: float = BODY_WAIT_S


class _CertificateReloader:
    """The current server ``SSLContext``, rebuilt when the certificate files change."""

    def __init__(self, *, cert_file: Path, key_file: Path, reload_interval: float) -> None:
        self._cert_file = cert_file
        self._key_file = key_file
        self._interval = reload_interval
        self._lock = threading.Lock()
        self._stamp = self._read_stamp()
        self._context = self._build()
        self._checked_at = time.monotonic()

    def _read_stamp(self) -> tuple[_FileStamp, _FileStamp]:
        def stamp(path: Path) -> _FileStamp:
            info = os.stat(path)  # follows the symlinks a mounted Secret is made of
            return (info.st_mtime_ns, info.st_size, info.st_ino)

        try:
            return stamp(self._cert_file), stamp(self._key_file)
        except OSError as exc:
            raise ConfigError(f"webhook certificate files unreadable: {exc}") from exc

    def _build(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = MIN_TLS_VERSION
        context.set_ciphers(TLS12_CIPHERS)
        try:
            context.load_cert_chain(certfile=self._cert_file, keyfile=self._key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot load webhook certificate {self._cert_file} / {self._key_file}: {exc}"
            ) from exc
        return context

    def context(self) -> ssl.SSLContext:
        with self._lock:
            now = time.monotonic()
            if now - self._checked_at < self._interval:
                return self._context
            self._checked_at = now
            try:
                stamp = self._read_stamp()
                if stamp != self._stamp:
                    self._context = self._build()
                    self._stamp = stamp
                    _log.info("webhook certificate reloaded from %s", self._cert_file)
            except ConfigError as exc:
                _log.warning("keeping the previous webhook certificate: %s", exc)
            return self._context


class _Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True
    request_queue_size = 128
    """The listen backlog: at socketserver's 5, a burst of kube-apiserver connects beyond it waits
    for SYN retries (1 s, then 3 s) — most of a 3 s webhook timeout."""

    def __init__(
        self,
        address: tuple[str, int],
        *,
        reloader: _CertificateReloader,
        review: ReviewHandler,
        paths: frozenset[str],
        observe: AnswerObserver | None,
        limits: CallerLimits,
    ) -> None:
        self.reloader = reloader
        self.guard = ConnectionGuard(
            max_connections=limits.max_connections,
            deadline_s=limits.request_deadline_s,
            name="webhook",
        )
        self.bodies = BodyBudget(limit_bytes=limits.body_budget_bytes)
        self.body_wait_s = limits.body_wait_s
        self.review = review
        self.observe = observe
        self.paths = paths
        self.connection_timeout = limits.idle_timeout_s
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, _Handler)

    def get_request(self) -> tuple[Any, Any]:
        raw, address = self.socket.accept()
        raw.settimeout(self.connection_timeout)
        # Each answer leaves in one write (``_Handler.wbufsize``); without NODELAY a write that
        # follows an unacknowledged one still waits for the peer's delayed ACK (Nagle).
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # the handshake happens in the worker thread: a slow client cannot stall accept()
        tls = self.reloader.context().wrap_socket(
            raw, server_side=True, do_handshake_on_connect=False
        )
        return tls, address

    def verify_request(self, request: Any, client_address: Any) -> bool:
        return self.guard.admit(request)

    def shutdown_request(self, request: Any) -> None:
        self.guard.release(request)
        super().shutdown_request(request)

    def service_actions(self) -> None:
        self.guard.sweep()

    def finish_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        try:
            self.guard.begin(request)
            request.do_handshake()
            self.guard.end(request)
            super().finish_request(request, client_address)
        except (ssl.SSLError, OSError) as exc:
            _log.debug("webhook connection from %s ended: %s", client_address, exc)
        finally:
            with self._open_lock:
                self._open.discard(request)

    def close_open_connections(self) -> None:
        with self._open_lock:
            connections = list(self._open)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        _log.exception("webhook request from %s failed", client_address)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "instaslice-webhook"
    wbufsize = RESPONSE_BUFFER_BYTES
    """Buffered: status line, headers and body go out in one write (one TLS record) when the
    request is done. Unbuffered, the headers and the body would be two writes, and the body would
    wait for kube-apiserver's delayed ACK of the headers (Nagle): up to ~40 ms per answer on a
    keep-alive connection (docs/design.md F15)."""

    def handle_one_request(self) -> None:
        handle_guarded(self, self.server.guard, super().handle_one_request)

    def do_GET(self) -> None:
        if urlsplit(self.path).path in ("/healthz", "/readyz"):
            self._send(HTTPStatus.OK, b"ok", content_type="text/plain")
        else:
            self._status(HTTPStatus.NOT_FOUND, f"no such path {urlsplit(self.path).path}")

    def do_POST(self) -> None:
        started = time.perf_counter()
        code, answer = self._answer_post()
        if self.server.observe is not None:
            self.server.observe(int(code), time.perf_counter() - started, answer)

    def _answer_post(self) -> tuple[HTTPStatus, wire.AdmissionReview | None]:
        """Answer the POST; what was sent: its status and, for a 200, the AdmissionReview."""
        # kube-apiserver appends ?timeout=<n>s to the configured path
        if urlsplit(self.path).path not in self.server.paths:
            return self._refuse(HTTPStatus.NOT_FOUND, f"no webhook at {urlsplit(self.path).path}")
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            return self._refuse(HTTPStatus.LENGTH_REQUIRED, "Content-Length is required")
        try:
            length = int(length_header)
        except ValueError:
            return self._refuse(HTTPStatus.BAD_REQUEST, "bad Content-Length")
        if not 0 <= length <= MAX_BODY_BYTES:
            return self._refuse(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body too large")
        with self.server.bodies.hold(length, wait_s=self.server.body_wait_s) as granted:
            if not granted:
                return self._refuse(HTTPStatus.SERVICE_UNAVAILABLE, "too many requests at once")
            body = self.rfile.read(length)
            if len(body) < length:
                return self._refuse(HTTPStatus.BAD_REQUEST, "body shorter than Content-Length")
            return self._answer_review(body)

    def _answer_review(self, body: bytes) -> tuple[HTTPStatus, wire.AdmissionReview | None]:
        try:
            review = orjson.loads(body)
            if not isinstance(review, dict):
                raise MalformedReviewError("body is not a JSON object")
            answer = self.server.review(review)
        except (ValueError, MalformedReviewError) as exc:  # JSONDecodeError is a ValueError
            return self._status(HTTPStatus.BAD_REQUEST, f"not an AdmissionReview: {exc}")
        except Exception as exc:  # one bad request must never stop the webhook
            _log.exception("admission review failed")
            return self._status(
                HTTPStatus.INTERNAL_SERVER_ERROR, f"InstaSlice webhook failed: {exc}"
            )
        self._send(HTTPStatus.OK, orjson.dumps(answer), content_type="application/json")
        return HTTPStatus.OK, answer

    def _refuse(self, code: HTTPStatus, message: str) -> tuple[HTTPStatus, None]:
        """An error answer before the body is read: the connection closes after it, or the unread
        body would be taken for the next request on it."""
        self.close_connection = True
        return self._status(code, message)

    def _status(self, code: HTTPStatus, message: str) -> tuple[HTTPStatus, None]:
        status: wire.Status = {
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "message": message,
            "reason": code.phrase.replace(" ", ""),
            "code": int(code),
        }
        self._send(code, orjson.dumps(status), content_type="application/json")
        return code, None

    def _send(self, code: HTTPStatus, body: bytes, *, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()  # the whole answer in one write, now (and timed with it)

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("webhook %s: " + format, self.client_address[0], *args)


class WebhookServer:
    """``start`` binds and serves in a thread; ``stop`` ends it and every open connection."""

    def __init__(
        self,
        *,
        review: ReviewHandler,
        cert_file: Path,
        key_file: Path,
        address: tuple[str, int] = ("0.0.0.0", 9443),  # noqa: S104 (kube-apiserver: pod IP)
        paths: Sequence[str] = DEFAULT_PATHS,
        reload_interval: float = 10.0,
        observe: AnswerObserver | None = None,
        limits: CallerLimits | None = None,
    ) -> None:
        self._review = review
        self._limits = limits or CallerLimits()
        self._observe = observe
        self._cert_file = cert_file
        self._key_file = key_file
        self._address = address
        self._paths = frozenset(paths)
        self._reload_interval = reload_interval
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Load the certificate (``ConfigError`` if missing or broken), bind, serve."""
        if self._server is not None:
            raise RuntimeError("webhook server already started")
        reloader = _CertificateReloader(
            cert_file=self._cert_file,
            key_file=self._key_file,
            reload_interval=self._reload_interval,
        )
        self._server = _Server(
            self._address,
            reloader=reloader,
            review=self._review,
            paths=self._paths,
            observe=self._observe,
            limits=self._limits,
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},  # how fast stop() is noticed
            name="webhook-server",
            daemon=True,
        )
        self._thread.start()
        _log.info("webhook serving HTTPS on %s:%s", *self._server.server_address[:2])

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("webhook server not started")
        return int(self._server.server_address[1])

    @property
    def guard(self) -> ConnectionGuard:
        """The bounds on its callers (open connections, deadlines cut)."""
        if self._server is None:
            raise RuntimeError("webhook server not started")
        return self._server.guard

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None:
            return
        server.shutdown()
        server.close_open_connections()
        server.server_close()
        if thread is not None:
            thread.join()
        self._server = self._thread = None

    def __enter__(self) -> WebhookServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
