"""Bounds on what callers of a daemon's HTTP(S) server may hold: connections, time and body bytes.

A threaded ``http.server`` gives every connection a thread and reads with a per-``recv`` timeout
only, so a client that sends one byte a second keeps its thread forever, and a thousand such
clients are a thousand threads. ``ConnectionGuard`` bounds that for a server:

* at most ``max_connections`` are open at once; one more is closed as soon as it is accepted
  (logged), so the threads and the memory they hold stay bounded whatever callers do;
* a connection that has begun something — the TLS handshake, or a request from its first byte
  until its answer is written — must finish it within ``deadline_s``, else it is shut down; while
  idle between requests only the server's own idle timeout applies (a kept-alive connection);
* ``BodyBudget``: the request bodies held in memory at once stay under a byte budget; a request
  that cannot get its share in time is refused (503) before its body is read.

``ConnectionGuard.sweep`` shuts down the overdue connections; the server calls it from its own
``serve_forever`` loop (``socketserver``'s ``service_actions``), so no extra thread is needed.
A connection is shut down on the socket beneath a TLS layer: the handler's blocked read then ends
with end-of-file, and its thread returns.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Final

logger = logging.getLogger(__name__)

Clock = Callable[[], float]
REFUSAL_LOG_INTERVAL_S: Final = 10.0


class ConnectionGuard:
    """Open connections of one server, with the deadline of what each one has begun."""

    def __init__(
        self,
        *,
        max_connections: int,
        deadline_s: float,
        name: str,
        clock: Clock = time.monotonic,
    ) -> None:
        if max_connections < 1 or deadline_s <= 0:
            raise ValueError("max_connections must be >= 1 and deadline_s > 0")
        self.max_connections = max_connections
        self.deadline_s = deadline_s
        self._name = name
        self._clock = clock
        self._lock = threading.Lock()
        self._deadlines: dict[socket.socket, float | None] = {}
        self._refused = 0
        self._refusals_logged_at = float("-inf")
        self.cut = 0
        """Connections shut down for missing their deadline (a count, for tests and logs)."""

    def admit(self, connection: socket.socket) -> bool:
        """Register a just-accepted connection; False (close it) when the server is full."""
        with self._lock:
            if len(self._deadlines) >= self.max_connections:
                self._refused += 1
                self._log_refusals()
                return False
            self._deadlines[connection] = None
            return True

    def release(self, connection: socket.socket) -> None:
        """The connection is closed: it no longer counts."""
        with self._lock:
            self._deadlines.pop(connection, None)

    def begin(self, connection: socket.socket) -> None:
        """The connection began a handshake or a request: it must end within ``deadline_s``."""
        with self._lock:
            if connection in self._deadlines:
                self._deadlines[connection] = self._clock() + self.deadline_s

    def end(self, connection: socket.socket) -> None:
        """What the connection began is done: idle again, no deadline."""
        with self._lock:
            if connection in self._deadlines:
                self._deadlines[connection] = None

    def open_connections(self) -> int:
        with self._lock:
            return len(self._deadlines)

    def sweep(self) -> int:
        """Shut down every connection past its deadline; how many."""
        now = self._clock()
        with self._lock:
            overdue = [c for c, due in self._deadlines.items() if due is not None and due <= now]
            for connection in overdue:
                self._deadlines[connection] = None  # shut down once
            self.cut += len(overdue)
        for connection in overdue:
            # beneath the TLS layer: SSLSocket.shutdown would drop its TLS state under the
            # handler thread that is reading through it
            with contextlib.suppress(OSError):
                socket.socket.shutdown(connection, socket.SHUT_RDWR)
        if overdue:
            logger.warning(
                "%s: closed %d connection(s) that took longer than %gs over a handshake or request",
                self._name,
                len(overdue),
                self.deadline_s,
            )
        return len(overdue)

    def _log_refusals(self) -> None:
        now = self._clock()
        if now - self._refusals_logged_at >= REFUSAL_LOG_INTERVAL_S:
            self._refusals_logged_at = now
            logger.warning(
                "%s: %d connection(s) refused: %d already open (the most it serves at once)",
                self._name,
                self._refused,
                self.max_connections,
            )
            self._refused = 0


def handle_guarded(
    handler: BaseHTTPRequestHandler, guard: ConnectionGuard, handle_one: Callable[[], None]
) -> None:
    """``handle_one_request`` of ``handler`` under ``guard``: wait (idle timeout) for the next
    request's first byte, then the whole request and its answer run under the deadline."""
    try:
        first = handler.rfile.peek(1)  # type: ignore[attr-defined]  # a BufferedReader
    except OSError:  # the idle timeout, a reset, or a shutdown by the guard
        handler.close_connection = True
        return
    if not first:
        handler.close_connection = True
        return
    guard.begin(handler.connection)
    try:
        handle_one()
    finally:
        guard.end(handler.connection)


class BodyBudget:
    """Request-body bytes held in memory at once, at most ``limit_bytes`` across all requests."""

    def __init__(self, *, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._held = 0
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def hold(self, size: int, *, wait_s: float) -> Iterator[bool]:
        """Reserve ``size`` bytes for a body, waiting up to ``wait_s`` for other requests to
        finish; yields whether it got them (nothing is reserved when it did not)."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            granted = size <= self.limit_bytes
            while granted and self._held + size > self.limit_bytes:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    granted = False
                    break
                self._cond.wait(remaining)
            if granted:
                self._held += size
        try:
            yield granted
        finally:
            if granted:
                with self._cond:
                    self._held -= size
                    self._cond.notify_all()

    @property
    def held(self) -> int:
        with self._cond:
            return self._held
