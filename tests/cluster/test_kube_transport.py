"""How the adapter talks HTTP (through urllib3), against a scripted ``http.server`` on loopback:
kept-alive connections, request bodies, error statuses, which failed exchanges are tried again,
timeouts, TLS (CA, client certificate), bearer tokens and a token that rotates, watch bodies read as
they come."""

from __future__ import annotations

import contextlib
import http.server
import itertools
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from controller.webhook.certificates import generate_ca, issue_serving_certificate
from driver.cluster.kube import KubeClusterApi, configuration_for_url
from driver.cluster.port import NODES, PatchType, WatchEventType
from driver.cluster.throttle import ClientSettings
from driver.errors import ApiNotFoundError, ClusterError, GoneError

NODE = b'{"metadata": {"name": "n1", "resourceVersion": "5"}}'


@dataclass(frozen=True)
class Seen:
    """One request as the server read it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    connection: int
    """Which connection (1, 2, ...) carried it."""


Reply = Callable[["_Handler"], None]
"""Writes the answer to one request (or nothing, to drop the connection unanswered)."""


@dataclass
class Script:
    replies: list[Reply]
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # connections stay open between requests
    script: Script

    def setup(self) -> None:
        super().setup()
        with self.script.lock:
            self.script.connections += 1
            self.connection_number = self.script.connections

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        with self.script.lock:
            self.script.seen.append(
                Seen(
                    method=self.command,
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=body,
                    connection=self.connection_number,
                )
            )
            reply = self.script.replies.pop(0) if self.script.replies else drop
        reply(self)

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def do_PATCH(self) -> None:
        self._answer()

    def log_message(self, format: str, *args: Any) -> None:
        return


def json_reply(body: bytes, *, status: int = 200, close: bool = False) -> Reply:
    def reply(handler: _Handler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        if close:
            handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(body)

    return reply


def drop(handler: _Handler) -> None:
    """Close the connection without an answer (a kept-alive connection the server dropped)."""
    handler.close_connection = True


def late(seconds: float, then: Reply) -> Reply:
    def reply(handler: _Handler) -> None:
        time.sleep(seconds)
        with contextlib.suppress(OSError):  # the client gave up waiting and closed
            then(handler)

    return reply


def chunked_reply(pieces: list[bytes], *, then_hold: threading.Event | None = None) -> Reply:
    """A 200 whose body comes in ``pieces``, each its own chunk, flushed apart (a watch); with
    ``then_hold``, the body then stays open until that event is set."""

    def reply(handler: _Handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for piece in pieces:
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            handler.wfile.flush()
            time.sleep(0.01)
        if then_hold is not None:
            then_hold.wait(10)
        with contextlib.suppress(OSError):  # the client may be gone
            handler.wfile.write(b"0\r\n\r\n")

    return reply


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up or refused our certificate: what the tests look at is what
        reached the handler, not the traceback."""


class Server:
    def __init__(self, replies: list[Reply], *, tls: ssl.SSLContext | None = None) -> None:
        self.script = Script(replies=list(replies))
        handler = type("Handler", (_Handler,), {"script": self.script})
        self._server = _QuietServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()

    @property
    def seen(self) -> list[Seen]:
        return self.script.seen

    @property
    def connections(self) -> int:
        return self.script.connections

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(replies: list[Reply], *, tls: ssl.SSLContext | None = None) -> Server:
        servers.append(Server(replies, tls=tls))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _api(configuration: Any, **settings: Any) -> KubeClusterApi:
    return KubeClusterApi(
        configuration=configuration,
        settings=ClientSettings(**{"qps": 0, "request_timeout": 5.0, **settings}),
    )


def test_connections_are_kept_alive_until_the_server_closes(
    serve: Callable[..., Server],
) -> None:
    server = serve([json_reply(NODE), json_reply(NODE, close=True), json_reply(NODE)])
    with _api(configuration_for_url(server.url), user_agent="transport-test") as api:
        for _ in range(3):
            assert api.get(NODES, name="n1")["metadata"]["name"] == "n1"
    assert [s.connection for s in server.seen] == [1, 1, 2]
    first = server.seen[0]
    assert (first.method, first.path) == ("GET", "/api/v1/nodes/n1")
    assert first.headers["host"] == f"127.0.0.1:{server.port}"
    assert first.headers["accept"] == "application/json"
    assert first.headers["user-agent"] == "transport-test"


def test_request_body_query_and_error_status(serve: Callable[..., Server]) -> None:
    missing = b'{"kind": "Status", "reason": "NotFound", "message": "nodes \\"x\\" not found"}'
    server = serve(
        [
            json_reply(NODE, status=201),
            json_reply(NODE),
            json_reply(b'{"metadata": {"resourceVersion": "9"}, "items": []}'),
            json_reply(missing, status=404),
        ]
    )
    with _api(configuration_for_url(server.url)) as api:
        api.create(NODES, {"metadata": {"name": "n1"}})
        api.patch(
            NODES, name="n1", patch={"metadata": {"labels": {"a": "1"}}}, patch_type=PatchType.MERGE
        )
        assert api.list_objects(NODES, label_selector="a=1,b in (x)").resource_version == "9"
        with pytest.raises(ApiNotFoundError, match='nodes "x" not found'):
            api.get(NODES, name="x")
    create, patch, listing, _ = server.seen
    assert (create.method, create.path) == ("POST", "/api/v1/nodes")
    assert create.headers["content-type"] == "application/json"
    assert create.headers["content-length"] == str(len(create.body))
    assert b'"name":"n1"' in create.body
    assert patch.method == "PATCH"
    assert patch.headers["content-type"] == PatchType.MERGE.value
    assert listing.path == "/api/v1/nodes?labelSelector=a%3D1%2Cb+in+%28x%29&limit=500"


def test_an_idempotent_request_the_server_drops_is_sent_once_more_on_a_new_connection(
    serve: Callable[..., Server],
) -> None:
    server = serve([json_reply(NODE), drop, json_reply(NODE), drop, drop])
    with _api(configuration_for_url(server.url)) as api:
        api.get(NODES, name="n1")
        api.get(NODES, name="n1")  # dropped unanswered on the kept-alive connection: sent again
        with pytest.raises(ClusterError):  # dropped twice: once more only
            api.get(NODES, name="n1")
    assert [s.connection for s in server.seen] == [1, 1, 2, 2, 3]


@pytest.mark.parametrize(
    "write",
    [
        lambda api: api.create(NODES, {"metadata": {"name": "n1"}}),
        lambda api: api.patch(NODES, name="n1", patch={"metadata": {}}, patch_type=PatchType.MERGE),
    ],
    ids=["post", "patch"],
)
def test_a_non_idempotent_request_is_not_replayed(
    serve: Callable[..., Server], write: Callable[[KubeClusterApi], object]
) -> None:
    server = serve([drop, json_reply(NODE)])
    with _api(configuration_for_url(server.url)) as api, pytest.raises(ClusterError) as failed:
        write(api)
    assert len(server.seen) == 1
    assert failed.value.retryable


def test_a_read_timeout_is_a_retryable_cluster_error_after_one_more_try(
    serve: Callable[..., Server],
) -> None:
    server = serve([late(1.0, json_reply(NODE)), late(1.0, json_reply(NODE))])
    with (
        _api(configuration_for_url(server.url), request_timeout=0.2) as api,
        pytest.raises(ClusterError, match="timed out") as failed,
    ):
        api.get(NODES, name="n1")
    assert failed.value.retryable
    assert len(server.seen) == 2


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_context: ssl.SSLContext
    client_cert: Path
    client_key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
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
    for name, data in (("ca.pem", ca_cert), ("tls.crt", cert), ("tls.key", key)):
        (folder / name).write_bytes(data)
    client_cert, client_key = _client_certificate(ca_cert, ca_key, now=now)
    (folder / "client.crt").write_bytes(client_cert)
    (folder / "client.key").write_bytes(client_key)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(folder / "tls.crt", folder / "tls.key")
    return Pki(
        ca=folder / "ca.pem",
        server_context=context,
        client_cert=folder / "client.crt",
        client_key=folder / "client.key",
    )


def _client_certificate(
    ca_cert_pem: bytes, ca_key_pem: bytes, *, now: datetime
) -> tuple[bytes, bytes]:
    """A client certificate for user ``admin`` signed by the CA (as a kubeconfig carries one)."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "admin")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def test_tls_trusts_the_configured_ca_only(serve: Callable[..., Server], pki: Pki) -> None:
    server = serve([json_reply(NODE), json_reply(NODE)], tls=pki.server_context)
    configuration = configuration_for_url(server.url)
    configuration.ssl_ca_cert = str(pki.ca)
    with _api(configuration) as api:
        assert api.get(NODES, name="n1")["metadata"]["name"] == "n1"
        assert api.get(NODES, name="n1")["metadata"]["name"] == "n1"
    assert server.connections == 1
    with (
        _api(configuration_for_url(server.url)) as api,
        pytest.raises(ClusterError, match="CERTIFICATE_VERIFY_FAILED"),
    ):
        api.get(NODES, name="n1")
    assert len(server.seen) == 2  # the refused handshake carried no request


def test_a_client_certificate_is_presented_when_configured(
    serve: Callable[..., Server], pki: Pki
) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.ca.parent / "tls.crt", pki.ca.parent / "tls.key")
    context.load_verify_locations(pki.ca)
    context.verify_mode = ssl.CERT_REQUIRED
    server = serve([json_reply(NODE)], tls=context)
    configuration = configuration_for_url(server.url)
    configuration.ssl_ca_cert = str(pki.ca)
    configuration.cert_file = str(pki.client_cert)
    configuration.key_file = str(pki.client_key)
    with _api(configuration) as api:
        assert api.get(NODES, name="n1")["metadata"]["name"] == "n1"
    anonymous = configuration_for_url(server.url)
    anonymous.ssl_ca_cert = str(pki.ca)
    with _api(anonymous) as api, pytest.raises(ClusterError):
        api.get(NODES, name="n1")
    assert len(server.seen) == 1


def test_every_request_carries_the_token_the_configuration_holds_now(
    serve: Callable[..., Server],
) -> None:
    """A rotated token (the ServiceAccount token file the client re-reads, an exec plugin's new
    token) reaches the server through the configuration's refresh hook, request by request."""
    server = serve([json_reply(NODE), json_reply(NODE), json_reply(NODE)])
    tokens = iter(["second", "third"])
    configuration = configuration_for_url(server.url, token="first")
    with _api(configuration) as api:
        api.get(NODES, name="n1")

        def rotate(config: Any) -> None:
            config.api_key["BearerToken"] = next(tokens)

        configuration.refresh_api_key_hook = rotate
        api.get(NODES, name="n1")
        api.get(NODES, name="n1")
    assert [s.headers["authorization"] for s in server.seen] == [
        "Bearer first",
        "Bearer second",
        "Bearer third",
    ]


def test_a_watch_body_is_read_as_it_comes_across_chunk_boundaries(
    serve: Callable[..., Server],
) -> None:
    events = (
        b'{"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "6"}}}\n'
        b'{"type": "MODIFIED", "object": {"metadata": {"name": "a", "resourceVersion": "7"}}}\n'
    )
    cuts = [0, 5, 40, 100, len(events)]  # pieces that split events mid-line
    pieces = [events[a:b] for a, b in itertools.pairwise(cuts)]
    gone = b'{"kind": "Status", "reason": "Expired", "message": "too old resource version"}'
    server = serve([chunked_reply(pieces), json_reply(gone, status=410), json_reply(NODE)])
    with _api(configuration_for_url(server.url)) as api:
        with api.watch(NODES, resource_version="5", timeout_seconds=7) as stream:
            seen = [(e.type, e.object["metadata"]["resourceVersion"]) for e in stream]
        assert seen == [(WatchEventType.ADDED, "6"), (WatchEventType.MODIFIED, "7")]
        with pytest.raises(GoneError, match="too old"):
            api.watch(NODES, resource_version="1")
        api.get(NODES, name="n1")  # the refused watch's connection is kept alive for it
    query = server.seen[0].path.partition("?")[2]
    assert query == "watch=true&resourceVersion=5&timeoutSeconds=7&allowWatchBookmarks=true"
    assert server.seen[2].connection == server.seen[1].connection


def test_a_watch_over_tls_closed_from_another_thread_ends_its_reader(
    serve: Callable[..., Server], pki: Pki
) -> None:
    event = b'{"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "6"}}}\n'
    hold = threading.Event()
    server = serve(
        [chunked_reply([event], then_hold=hold), json_reply(NODE)], tls=pki.server_context
    )
    configuration = configuration_for_url(server.url)
    configuration.ssl_ca_cert = str(pki.ca)
    seen: list[str] = []
    ended = threading.Event()
    try:
        with _api(configuration) as api:
            stream = api.watch(NODES, resource_version="5")

            def read() -> None:
                seen.extend(e.object["metadata"]["name"] for e in stream)
                ended.set()

            reader = threading.Thread(target=read)
            reader.start()
            deadline = time.monotonic() + 5
            while not seen and time.monotonic() < deadline:
                time.sleep(0.01)
            stream.close()  # the reader is blocked waiting for the next event
            reader.join(5)
            assert ended.is_set()
            assert seen == ["a"]
            assert stream.closed
            api.get(NODES, name="n1")  # on a fresh connection: the watch's was not handed back
    finally:
        hold.set()
    assert [s.connection for s in server.seen] == [1, 2]
