"""Ordinary (non-streaming) requests to the API server on kept-alive connections read by us.

urllib3's ``urlopen`` costs more CPU than the rest of a controller write: a ``Retry`` and a
``Timeout`` object per request, a ``poll`` object per reuse check, header-by-header validation,
``http.client``'s header parsing through the ``email`` package and the response wrapper's set-up.
Here a request is one ``sendall`` of bytes built at once and the response is parsed from the
socket's bytes (status line, ``Content-Length`` or chunked body), nothing more.

The connections themselves still come from the client's urllib3 pool (``_new_conn``), so TLS —
CA bundle, client certificate, hostname check — is set up exactly as the ``kubernetes`` client
configured it; we only take the connected socket. Requests through a proxy keep using urllib3
(``kube``). Retries match the urllib3 ``Retry`` the adapter configures: connect errors up to
three times, and a request on a connection that fails (a dropped kept-alive connection, a read
timeout) once more on a fresh one only for idempotent methods; never on a status code.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import zlib
from typing import Any

import urllib3

from driver.errors import ClusterError

_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"})
_CONNECT_ATTEMPTS = 4  # Retry(connect=3): the first try and three more
_READ_SIZE = 65536
_MAX_HEAD = 1 << 20
_POLL_BAD = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP | select.POLLNVAL


class ProtocolError(ClusterError):
    """The server's reply is not HTTP/1.x we can read."""


class _Connection:
    """One connected socket (plain or TLS) and the urllib3 connection that set it up."""

    __slots__ = ("conn", "poller", "sock")

    def __init__(self, conn: Any, read_timeout: float) -> None:
        self.conn = conn
        self.sock: socket.socket = conn.sock
        self.sock.settimeout(read_timeout)
        self.poller = select.poll()
        self.poller.register(self.sock, select.POLLIN | select.POLLPRI)

    def dropped(self) -> bool:
        """An idle kept-alive connection that has anything to read was closed by the server (or
        holds bytes nobody asked for): either way it cannot carry a request."""
        pending = getattr(self.sock, "pending", None)
        if pending is not None and pending():
            return True
        return any(events & _POLL_BAD for _, events in self.poller.poll(0))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()


class FastHttp:
    """Thread-safe; each request holds one connection to itself, at most ``maxsize`` stay idle."""

    def __init__(
        self,
        *,
        pool: Any,
        netloc: str,
        maxsize: int,
        connect_timeout: float,
        read_timeout: float,
    ) -> None:
        self._pool = pool
        self._host_line = f"Host: {netloc}\r\n".encode("latin-1")
        self._maxsize = maxsize
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._lock = threading.Lock()
        self._idle: list[_Connection] = []
        self._closed = False

    def request(
        self, method: str, target: str, header_block: bytes, body: bytes | None
    ) -> tuple[int, bytes]:
        """(status, body) of one request; ``header_block`` is the ``Name: value\\r\\n`` lines
        beyond ``Host`` and ``Content-Length``. Network failures raise ``ClusterError``."""
        connection, buffer, version, status, headers = self._send(
            method, target, header_block, body, None
        )
        try:
            data, keep = _read_body(connection.sock, buffer, method, version, status, headers)
        except (OSError, ProtocolError) as exc:
            connection.close()
            raise ClusterError(str(exc) or type(exc).__name__) from exc
        except BaseException:
            connection.close()
            raise
        if keep:
            self._release(connection)
        else:
            connection.close()
        return status, data

    def stream(
        self, target: str, header_block: bytes, *, read_timeout: float
    ) -> tuple[int, bytes | BodyStream]:
        """A GET whose body is read as it comes (a watch): (status, ``BodyStream``) for a 2xx
        answer, else (status, the whole body). The connection is the stream's from then on: it is
        closed with it, never handed out again."""
        connection, buffer, version, status, headers = self._send(
            "GET", target, header_block, None, read_timeout
        )
        if 200 <= status <= 299:
            return status, BodyStream(connection, buffer, headers)
        try:
            data, _ = _read_body(connection.sock, buffer, "GET", version, status, headers)
        except (OSError, ProtocolError) as exc:
            raise ClusterError(str(exc) or type(exc).__name__) from exc
        finally:
            connection.close()
        return status, data

    def _send(
        self,
        method: str,
        target: str,
        header_block: bytes,
        body: bytes | None,
        read_timeout: float | None,
    ) -> tuple[_Connection, bytearray, str, int, dict[str, str]]:
        """Send the request and read the response's head: (connection, bytes read past the head,
        HTTP version, status, headers)."""
        head = b"".join(
            (
                f"{method} {target} HTTP/1.1\r\n".encode("latin-1"),
                self._host_line,
                header_block,
                b"" if body is None else b"Content-Length: %d\r\n" % len(body),
                b"\r\n",
            )
        )
        message = head if body is None else head + body
        read_retry = method in _IDEMPOTENT
        while True:
            connection = self._acquire()
            buffer = bytearray()
            try:
                if read_timeout is not None:
                    connection.sock.settimeout(read_timeout)
                connection.sock.sendall(message)
                version, status, headers = _read_head(connection.sock, buffer)
            except (OSError, ProtocolError) as exc:
                connection.close()
                if read_retry:
                    read_retry = False
                    continue
                raise ClusterError(str(exc) or type(exc).__name__) from exc
            except BaseException:
                connection.close()
                raise
            return connection, buffer, version, status, headers

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _acquire(self) -> _Connection:
        while True:
            with self._lock:
                if self._closed:
                    raise ClusterError("the client is closed")
                connection = self._idle.pop() if self._idle else None
            if connection is None:
                return self._connect()
            if connection.dropped():
                connection.close()
                continue
            return connection

    def _release(self, connection: _Connection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._maxsize:
                self._idle.append(connection)
                return
        connection.close()

    def _connect(self) -> _Connection:
        error: Exception | None = None
        for _ in range(_CONNECT_ATTEMPTS):
            conn = self._pool._new_conn()
            conn.timeout = self._connect_timeout
            try:
                conn.connect()
                return _Connection(conn, self._read_timeout)
            except Exception as exc:  # urllib3 raises its own errors and OSErrors
                conn.close()
                error = exc
                if isinstance(exc, ssl.SSLError | urllib3.exceptions.SSLError):
                    break  # a refused certificate stays refused (urllib3 does not retry it)
        raise ClusterError(f"cannot connect to the API server: {error}") from error


def _read_body(
    sock: socket.socket,
    buffer: bytearray,
    method: str,
    version: str,
    status: int,
    headers: dict[str, str],
) -> tuple[bytes, bool]:
    """(body, connection reusable) of a response whose head was read; ``buffer`` holds what was
    read past the head."""
    connection = headers.get("connection", "").lower()
    keep = "keep-alive" in connection if version == "HTTP/1.0" else "close" not in connection
    if status in (204, 304) or method == "HEAD":
        body = b""
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        body = _read_chunked(sock, buffer)
    elif "content-length" in headers:
        body = _read_exactly(sock, buffer, _content_length(headers))
    else:  # the body runs to the end of the connection
        body = _read_to_end(sock, buffer)
        keep = False
    if buffer:
        keep = False  # bytes past the response: never hand such a connection out again
    return _decoded(body, headers.get("content-encoding", "identity").lower()), keep


def _content_length(headers: dict[str, str]) -> int:
    try:
        return int(headers["content-length"].split(",")[0])
    except ValueError as exc:
        raise ProtocolError("malformed Content-Length") from exc


def _read_head(sock: socket.socket, buffer: bytearray) -> tuple[str, int, dict[str, str]]:
    """(HTTP version, status, headers by lower-case name) of the next final response; interim
    (1xx) responses are skipped. What follows the head stays in ``buffer``."""
    while True:
        head = _read_until(
            sock,
            buffer,
            b"\r\n\r\n",
            too_long="response headers too large",
            closed="connection closed before a response",
        )
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
        status = int(parts[1])
        if not 100 <= status < 200 or status == 101:
            break  # else an interim response (100 Continue): the real one follows
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise ProtocolError(f"malformed header line {line[:100]!r}")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return parts[0], status, headers


def _decoded(body: bytes, encoding: str) -> bytes:
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompress(body, 16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompress(body)
    if encoding != "identity":
        raise ProtocolError(f"unsupported Content-Encoding {encoding!r}")
    return body


def _fill(sock: socket.socket, buffer: bytearray, size: int) -> None:
    while len(buffer) < size:
        chunk = sock.recv(max(_READ_SIZE, size - len(buffer)))
        if not chunk:
            raise ProtocolError("connection closed in the middle of a response")
        buffer += chunk


def _read_exactly(sock: socket.socket, buffer: bytearray, length: int) -> bytes:
    _fill(sock, buffer, length)
    body = bytes(buffer[:length])
    del buffer[:length]
    return body


def _read_line(sock: socket.socket, buffer: bytearray) -> bytes:
    return _read_until(
        sock,
        buffer,
        b"\r\n",
        too_long="chunk header too long",
        closed="connection closed in the middle of a response",
    )


def _read_until(
    sock: socket.socket, buffer: bytearray, delimiter: bytes, *, too_long: str, closed: str
) -> bytes:
    """The bytes before the next ``delimiter`` (read from ``sock`` as needed, at most
    ``_MAX_HEAD``), taken out of ``buffer`` with the delimiter."""
    end = buffer.find(delimiter)
    while end < 0:
        if len(buffer) > _MAX_HEAD:
            raise ProtocolError(too_long)
        chunk = sock.recv(_READ_SIZE)
        if not chunk:
            raise ProtocolError(closed)
        buffer += chunk
        end = buffer.find(delimiter, max(0, len(buffer) - len(chunk) - len(delimiter) + 1))
    found = bytes(buffer[:end])
    del buffer[: end + len(delimiter)]
    return found


def _read_chunked(sock: socket.socket, buffer: bytearray) -> bytes:
    parts: list[bytes] = []
    while True:
        size_text = _read_line(sock, buffer).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError as exc:
            raise ProtocolError(f"malformed chunk size {size_text[:20]!r}") from exc
        if size == 0:
            while _read_line(sock, buffer):  # trailers, up to the empty line
                pass
            return b"".join(parts)
        parts.append(_read_exactly(sock, buffer, size))
        if _read_exactly(sock, buffer, 2) != b"\r\n":
            raise ProtocolError("chunk not followed by CRLF")


def _read_to_end(sock: socket.socket, buffer: bytearray) -> bytes:
    while chunk := sock.recv(_READ_SIZE):
        buffer += chunk
    body = bytes(buffer)
    buffer.clear()
    return body


class BodyStream:
    """A response body read as it comes, for ``KubeWatchStream``: ``read1`` returns the body bytes
    that have arrived (chunked framing removed), b"" at its end; ``shutdown`` from another thread
    wakes a blocked reader; ``close`` drops the connection."""

    def __init__(self, connection: _Connection, buffer: bytearray, headers: dict[str, str]) -> None:
        if headers.get("content-encoding", "identity").lower() != "identity":
            connection.close()
            raise ClusterError(f"unsupported Content-Encoding {headers['content-encoding']!r}")
        self._connection = connection
        self._sock = connection.sock
        self._raw = buffer
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._left = _content_length(headers) if "content-length" in headers else -1
        """Chunked: bytes left in the current chunk, -1 before a size line, -2 before the CRLF
        ending a chunk. Otherwise: body bytes left (-1: until the connection closes)."""
        self._done = False
        self._sock_shutdown = self.shutdown  # what KubeWatchStream looks for

    def read1(self, size: int = _READ_SIZE) -> bytes:
        while True:
            data = self._take(size)
            if data or self._done:
                return data
            chunk = self._sock.recv(_READ_SIZE)
            if not chunk:
                if self._chunked or self._left > 0:
                    raise ProtocolError("connection closed in the middle of a response")
                self._done = True
                return b""
            self._raw += chunk

    def _take(self, size: int) -> bytes:
        raw = self._raw
        if not self._chunked:
            if self._left >= 0:
                size = min(size, self._left)
                self._left -= min(size, len(raw))
                self._done = self._left == 0
            data = bytes(raw[:size])
            del raw[:size]
            return data
        return self._take_chunked(raw)

    def _take_chunked(self, raw: bytearray) -> bytes:
        out: list[bytes] = []
        pos = 0
        while not self._done:
            if self._left > 0:
                take = min(self._left, len(raw) - pos)
                if take <= 0:
                    break
                out.append(bytes(raw[pos : pos + take]))
                pos += take
                self._left -= take
                if self._left == 0:
                    self._left = -2
            elif self._left == -2:
                if len(raw) - pos < 2:
                    break
                if raw[pos : pos + 2] != b"\r\n":
                    raise ProtocolError("chunk not followed by CRLF")
                pos += 2
                self._left = -1
            else:
                end = raw.find(b"\r\n", pos)
                if end < 0:
                    if len(raw) - pos > _MAX_HEAD:
                        raise ProtocolError("chunk header too long")
                    break
                size_text = bytes(raw[pos:end]).split(b";", 1)[0].strip()
                try:
                    chunk_size = int(size_text, 16)
                except ValueError as exc:
                    raise ProtocolError(f"malformed chunk size {size_text[:20]!r}") from exc
                pos = end + 2
                if chunk_size == 0:
                    self._done = True  # trailers are not read: the connection is closed anyway
                else:
                    self._left = chunk_size
        del raw[:pos]
        return b"".join(out)

    def shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._connection.close()

    def release_conn(self) -> None:
        """Nothing to hand back: the connection is the stream's alone."""
