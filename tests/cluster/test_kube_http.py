"""``kube_http``: the adapter's own HTTP/1.1 exchange, against a scripted server on a real socket
(bodies by length, chunked, to the end of the connection; gzip; dropped kept-alive connections;
TLS set up by the client's urllib3 pool)."""

from __future__ import annotations

import gzip
import itertools
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from controller.webhook.certificates import generate_ca, issue_serving_certificate
from driver.cluster.kube import KubeClusterApi, configuration_for_url
from driver.cluster.port import NODES, WatchEventType
from driver.cluster.throttle import ClientSettings
from driver.errors import ApiNotFoundError, ClusterError, GoneError

Reply = Callable[[bytes], bytes | None]
"""Request bytes → the raw reply to send (None: close the connection without a reply)."""


class ScriptedServer:
    """Answers each request on each connection with the next reply of ``replies``; a reply
    ending in ``#close`` is sent and the connection closed."""

    def __init__(self, replies: list[Reply], *, tls: ssl.SSLContext | None = None) -> None:
        self._replies = replies
        self._tls = tls
        self.requests: list[bytes] = []
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            conn: socket.socket = raw
            if self._tls is not None:
                try:
                    conn = self._tls.wrap_socket(raw, server_side=True)
                except (OSError, ssl.SSLError):
                    raw.close()
                    continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    try:
                        chunk = conn.recv(65536)
                    except OSError:
                        return
                    if not chunk:
                        return
                    buffer += chunk
                head, _, rest = buffer.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(rest) < length:
                    rest += conn.recv(65536)
                request, buffer = head + b"\r\n\r\n" + rest[:length], rest[length:]
                self.requests.append(request)
                reply = self._replies.pop(0)(request) if self._replies else None
                if reply is None:
                    return
                close = reply.endswith(b"#close")
                conn.sendall(reply.removesuffix(b"#close"))
                if close:
                    return

    def close(self) -> None:
        self._listener.close()


def _json(body: bytes, *, status: str = "200 OK", extra: bytes = b"") -> Reply:
    reply = (
        b"HTTP/1.1 " + status.encode() + b"\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n" % len(body) + extra + b"\r\n" + body
    )
    return lambda request: reply


def _api(url: str, **kwargs: object) -> KubeClusterApi:
    return KubeClusterApi(
        configuration=configuration_for_url(url, **kwargs),  # type: ignore[arg-type]
        settings=ClientSettings(qps=0, request_timeout=5.0),
    )


@pytest.fixture
def serve() -> Iterator[Callable[[list[Reply]], ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def start(replies: list[Reply]) -> ScriptedServer:
        servers.append(ScriptedServer(replies))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


NODE = b'{"metadata": {"name": "n1", "resourceVersion": "5"}}'


def test_bodies_by_length_chunked_and_to_the_end_all_read(
    serve: Callable[[list[Reply]], ScriptedServer],
) -> None:
    half = len(NODE) // 2
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x;ext=1\r\n" % half + NODE[:half] + b"\r\n"
        + b"%x\r\n" % (len(NODE) - half) + NODE[half:] + b"\r\n0\r\nX-Trailer: 1\r\n\r\n"
    )  # fmt: skip
    to_end = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + NODE + b"#close"
    server = serve(
        [
            _json(NODE, extra=b"X-Many: a\r\nX-Many: b\r\n"),
            lambda request: b"HTTP/1.1 100 Continue\r\n\r\n" + chunked,
            lambda request: to_end,
            _json(gzip.compress(NODE), extra=b"Content-Encoding: gzip\r\n"),
        ]
    )
    with _api(f"http://127.0.0.1:{server.port}") as api:
        for _ in range(4):
            assert api.get(NODES, name="n1")["metadata"]["name"] == "n1"
    # kept alive until the server said close: two connections for four requests
    assert server.connections == 2
    first = server.requests[0].decode()
    assert first.startswith("GET /api/v1/nodes/n1 HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}\r\n" in first
    assert "Accept: application/json\r\n" in first


def test_request_body_and_error_status(serve: Callable[[list[Reply]], ScriptedServer]) -> None:
    missing = b'{"kind": "Status", "reason": "NotFound", "message": "nodes \\"x\\" not found"}'
    server = serve([_json(NODE, status="201 Created"), _json(missing, status="404 Not Found")])
    with _api(f"http://127.0.0.1:{server.port}") as api:
        api.create(NODES, {"metadata": {"name": "n1"}})
        with pytest.raises(ApiNotFoundError, match='nodes "x" not found'):
            api.get(NODES, name="x")
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /api/v1/nodes HTTP/1.1\r\n")
    assert b"Content-Type: application/json\r\n" in head
    assert head.endswith(b"\r\nContent-Length: %d" % len(body))
    assert b'"name":"n1"' in body


def test_a_get_the_server_drops_unanswered_is_sent_once_more(
    serve: Callable[[list[Reply]], ScriptedServer],
) -> None:
    server = serve([_json(NODE), lambda request: None, _json(NODE)])
    with _api(f"http://127.0.0.1:{server.port}") as api:
        api.get(NODES, name="n1")
        api.get(NODES, name="n1")  # the server closes without replying: retried once (a GET)
    assert server.connections == 2


def test_a_non_idempotent_request_is_not_replayed(
    serve: Callable[[list[Reply]], ScriptedServer],
) -> None:
    server = serve([lambda request: None, _json(NODE)])
    with (
        _api(f"http://127.0.0.1:{server.port}") as api,
        pytest.raises(ClusterError, match="connection closed"),
    ):
        api.create(NODES, {"metadata": {"name": "n1"}})
    assert len(server.requests) == 1


def test_garbage_is_a_cluster_error(serve: Callable[[list[Reply]], ScriptedServer]) -> None:
    server = serve([lambda request: b"SSH-2.0-nope\r\n\r\n", lambda request: b"nope\r\n\r\n"])
    with (
        _api(f"http://127.0.0.1:{server.port}") as api,
        pytest.raises(ClusterError, match=r"not an HTTP/1\.x status line"),
    ):
        api.get(NODES, name="n1")


def test_tls_is_set_up_by_the_clients_pool(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    ca_cert, ca_key = generate_ca(common_name="test-ca", now=now, validity=timedelta(days=1))
    cert, key = issue_serving_certificate(
        ca_cert_pem=ca_cert,
        ca_key_pem=ca_key,
        dns_names=["localhost"],
        ip_addresses=["127.0.0.1"],
        now=now,
        validity=timedelta(days=1),
    )
    (tmp_path / "ca.pem").write_bytes(ca_cert)
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    server = ScriptedServer([_json(NODE), _json(NODE), _json(NODE)], tls=context)
    try:
        configuration = configuration_for_url(f"https://127.0.0.1:{server.port}")
        configuration.ssl_ca_cert = str(tmp_path / "ca.pem")
        with KubeClusterApi(configuration=configuration, settings=ClientSettings(qps=0)) as api:
            assert api.get(NODES, name="n1")["metadata"]["name"] == "n1"
            assert api.get(NODES, name="n1")["metadata"]["name"] == "n1"
        assert server.connections == 1
        # without the CA the certificate is refused, at once (not tried again)
        untrusted = configuration_for_url(f"https://127.0.0.1:{server.port}")
        with (
            KubeClusterApi(configuration=untrusted, settings=ClientSettings(qps=0)) as api,
            pytest.raises(ClusterError, match="cannot connect"),
        ):
            api.get(NODES, name="n1")
        deadline = time.monotonic() + 5
        while server.connections < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.connections == 2
    finally:
        server.close()


def test_a_watch_body_is_read_as_it_comes_across_chunk_boundaries(
    serve: Callable[[list[Reply]], ScriptedServer],
) -> None:
    events = (
        b'{"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "6"}}}\n'
        b'{"type": "MODIFIED", "object": {"metadata": {"name": "a", "resourceVersion": "7"}}}\n'
    )
    cuts = [0, 5, 40, 100, len(events)]  # chunks that split events mid-line
    body = b"".join(
        b"%x\r\n" % (b - a) + events[a:b] + b"\r\n" for a, b in itertools.pairwise(cuts)
    )
    gone = b'{"kind": "Status", "reason": "Expired", "message": "too old resource version"}'
    server = serve(
        [
            lambda request: (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n"
            ),
            _json(gone, status="410 Gone"),
        ]
    )
    with _api(f"http://127.0.0.1:{server.port}") as api:
        with api.watch(NODES, resource_version="5") as stream:
            seen = [(e.type, e.object["metadata"]["resourceVersion"]) for e in stream]
        assert seen == [(WatchEventType.ADDED, "6"), (WatchEventType.MODIFIED, "7")]
        with pytest.raises(GoneError, match="too old"):
            api.watch(NODES, resource_version="1")
    assert b"watch=true" in server.requests[0]
