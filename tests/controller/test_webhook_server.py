"""The webhook over real HTTPS: certificates from ``controller.webhook.certificates``, verification against their CA."""

import base64
import http.client
import json
import socket
import ssl
import threading
from collections.abc import Iterator, Mapping
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from api import wire
from api.names import SCHEDULING_GATE
from controller.metrics import WebhookMetrics, admission_decision
from controller.webhook.admission import review_pod
from controller.webhook.certificates import (
    CA_FILE,
    CERT_FILE,
    KEY_FILE,
    CertificateManager,
    CertificateSettings,
)
from controller.webhook.server import CallerLimits, WebhookServer
from driver.errors import ConfigError
from tests.controller.certfakes import InMemoryCertificateStore, StepClock
from tests.controller.test_admission import (
    claim,
    claim_review,
    default_context,
    exactly,
    pod,
    review,
)

SERVICE_NAME = "instaslice-webhook.instaslice-system.svc"


def settings(*extra: str) -> CertificateSettings:
    return CertificateSettings(
        service="instaslice-webhook",
        namespace="instaslice-system",
        extra_names=("127.0.0.1", *extra),
    )


@pytest.fixture
def cert_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "certs"
    CertificateManager(
        InMemoryCertificateStore(), settings=settings(), cert_dir=directory, clock=StepClock()
    ).reconcile()
    return directory


def review_handler(body: Mapping[str, Any]) -> wire.AdmissionReview:
    if body.get("explode"):
        raise RuntimeError("boom")
    return review_pod(body, default_context())


@pytest.fixture
def server(cert_dir: Path) -> Iterator[WebhookServer]:
    with WebhookServer(
        review=review_handler,
        cert_file=cert_dir / CERT_FILE,
        key_file=cert_dir / KEY_FILE,
        address=("127.0.0.1", 0),
        reload_interval=0.0,
        limits=CallerLimits(idle_timeout_s=5.0),
    ) as running:
        yield running


def client_context(cert_dir: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cert_dir / CA_FILE))


def connect(
    server: WebhookServer, cert_dir: Path, *, hostname: str = SERVICE_NAME
) -> http.client.HTTPSConnection:
    """Connect to 127.0.0.1 but verify the certificate for ``hostname`` (SNI + name check)."""
    connection = http.client.HTTPSConnection(
        "127.0.0.1", server.port, context=client_context(cert_dir), timeout=5
    )
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    connection.sock = client_context(cert_dir).wrap_socket(raw, server_hostname=hostname)
    return connection


def post(
    connection: http.client.HTTPSConnection, path: str, body: bytes
) -> tuple[int, dict[str, Any]]:
    connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, json.loads(response.read())


def test_admission_review_round_trip_over_verified_tls(
    server: WebhookServer, cert_dir: Path
) -> None:
    with closing(connect(server, cert_dir)) as connection:
        status, answer = post(
            connection,
            "/mutate-pods?timeout=5s",
            json.dumps(review(pod(limits={"nvidia.com/mig-1g.5gb": "1"}))).encode(),
        )
        assert status == 200
        assert answer["response"]["allowed"] is True
        patch = json.loads(base64.b64decode(answer["response"]["patch"]))
        assert patch == [
            {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": SCHEDULING_GATE}]}
        ]
        # keep-alive: a second review on the same connection, on the path the deploy uses
        status, answer = post(
            connection,
            "/mutate-v1-pod",
            json.dumps(review(pod(limits={"nvidia.com/mig-9g.99gb": "1"}))).encode(),
        )
        assert status == 200
        assert answer["response"]["allowed"] is False
        assert "nvidia.com/mig-9g.99gb" in answer["response"]["status"]["message"]


def test_each_answer_leaves_in_one_write_on_a_nodelay_socket(
    server: WebhookServer, cert_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Headers and body written apart would make the body wait for kube-apiserver's delayed ACK
    (Nagle): tens of milliseconds per review on a keep-alive connection."""
    client = threading.get_ident()
    writes: list[tuple[int, int]] = []  # (bytes, TCP_NODELAY) of each write by the server
    send, sendall = ssl.SSLSocket.send, ssl.SSLSocket.sendall

    def record(sock: ssl.SSLSocket, data: Any) -> None:
        if threading.get_ident() != client:
            writes.append((len(data), sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)))

    def counted_send(sock: ssl.SSLSocket, data: Any, flags: int = 0) -> int:
        record(sock, data)
        return send(sock, data, flags)

    def counted_sendall(sock: ssl.SSLSocket, data: Any, flags: int = 0) -> None:
        record(sock, data)
        sendall(sock, data, flags)

    monkeypatch.setattr(ssl.SSLSocket, "send", counted_send)
    monkeypatch.setattr(ssl.SSLSocket, "sendall", counted_sendall)
    body = json.dumps(review(pod(limits={"nvidia.com/mig-1g.5gb": "1"}))).encode()
    with closing(connect(server, cert_dir)) as connection:
        for _ in range(2):
            assert post(connection, "/mutate-v1-pod", body)[0] == 200
    assert len(writes) == 2, writes
    assert all(nodelay for _, nodelay in writes), writes


def test_client_verifies_by_ip_address_too(server: WebhookServer, cert_dir: Path) -> None:
    with closing(
        http.client.HTTPSConnection(
            "127.0.0.1", server.port, context=client_context(cert_dir), timeout=5
        )
    ) as connection:
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        assert (response.status, response.read()) == (200, b"ok")


def test_a_client_trusting_another_ca_refuses_the_server(
    server: WebhookServer, cert_dir: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    CertificateManager(
        InMemoryCertificateStore(), settings=settings(), cert_dir=other, clock=StepClock()
    ).reconcile()
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    with closing(raw), pytest.raises(ssl.SSLCertVerificationError):
        client_context(other).wrap_socket(raw, server_hostname=SERVICE_NAME)


def test_a_wrong_hostname_is_refused(server: WebhookServer, cert_dir: Path) -> None:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    with closing(raw), pytest.raises(ssl.SSLCertVerificationError):
        client_context(cert_dir).wrap_socket(raw, server_hostname="evil.example.com")


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("/mutate-pods", b"{not json", 400, "not an AdmissionReview"),
        ("/mutate-pods", b"[1, 2]", 400, "not a JSON object"),
        ("/mutate-pods", b'{"kind": "AdmissionReview"}', 400, "request.uid"),
        ("/mutate-pods", b'{"explode": true}', 500, "boom"),
        ("/elsewhere", b"{}", 404, "no webhook at /elsewhere"),
    ],
    ids=["bad-json", "not-an-object", "no-request", "handler-crash", "unknown-path"],
)
def test_bad_requests_get_error_statuses_and_the_server_survives(
    server: WebhookServer, cert_dir: Path, path: str, body: bytes, status: int, fragment: str
) -> None:
    with closing(connect(server, cert_dir)) as connection:
        got, answer = post(connection, path, body)
        assert got == status
        assert answer["kind"] == "Status"
        assert answer["code"] == status
        assert fragment in answer["message"]
    with closing(connect(server, cert_dir)) as connection:
        got, _ = post(connection, "/mutate-pods", json.dumps(review(pod())).encode())
        assert got == 200


def test_oversized_and_lengthless_bodies_are_refused(server: WebhookServer, cert_dir: Path) -> None:
    with closing(connect(server, cert_dir)) as connection:
        connection.putrequest("POST", "/mutate-pods")
        connection.putheader("Content-Length", str(64 * 1024 * 1024))
        connection.endheaders()
        response = connection.getresponse()
        assert response.status == 413
        response.read()
    with closing(connect(server, cert_dir)) as connection:
        connection.putrequest("POST", "/mutate-pods")
        connection.endheaders()
        response = connection.getresponse()
        assert response.status == 411
        response.read()


def test_a_failed_handshake_does_not_stop_the_server(server: WebhookServer, cert_dir: Path) -> None:
    with closing(socket.create_connection(("127.0.0.1", server.port), timeout=5)) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")  # plain HTTP to a TLS port
        raw.recv(1024)
    with closing(connect(server, cert_dir)) as connection:
        connection.request("GET", "/healthz")
        assert connection.getresponse().status == 200


def served_certificate(server: WebhookServer, cert_dir: Path) -> x509.Certificate:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    with closing(client_context(cert_dir).wrap_socket(raw, server_hostname=SERVICE_NAME)) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def test_a_rotated_certificate_is_served_without_a_restart(
    server: WebhookServer, cert_dir: Path
) -> None:
    before = served_certificate(server, cert_dir)
    store = InMemoryCertificateStore()
    # a new Secret (other names) rewrites the files the running server reads
    CertificateManager(
        store, settings=settings("localhost"), cert_dir=cert_dir, clock=StepClock()
    ).reconcile()
    after = served_certificate(server, cert_dir)
    assert after.serial_number != before.serial_number
    assert after.public_bytes(serialization.Encoding.PEM) == (cert_dir / CERT_FILE).read_bytes()


def test_a_half_written_pair_keeps_the_previous_certificate(
    server: WebhookServer, cert_dir: Path, tmp_path: Path
) -> None:
    before = served_certificate(server, cert_dir)
    other = tmp_path / "other"
    CertificateManager(
        InMemoryCertificateStore(), settings=settings(), cert_dir=other, clock=StepClock()
    ).reconcile()
    # the new certificate has landed, its key not yet: the pair does not load
    (cert_dir / CERT_FILE).write_bytes((other / CERT_FILE).read_bytes())
    assert served_certificate(server, cert_dir).serial_number == before.serial_number


def test_missing_certificate_files_fail_at_start(tmp_path: Path) -> None:
    server = WebhookServer(
        review=review_handler,
        cert_file=tmp_path / "tls.crt",
        key_file=tmp_path / "tls.key",
        address=("127.0.0.1", 0),
    )
    with pytest.raises(ConfigError, match="unreadable"):
        server.start()
    (tmp_path / "tls.crt").write_text("junk")
    (tmp_path / "tls.key").write_text("junk")
    with pytest.raises(ConfigError, match="cannot load"):
        server.start()


def test_stop_closes_idle_keep_alive_connections(cert_dir: Path) -> None:
    server = WebhookServer(
        review=review_handler,
        cert_file=cert_dir / CERT_FILE,
        key_file=cert_dir / KEY_FILE,
        address=("127.0.0.1", 0),
        limits=CallerLimits(idle_timeout_s=60.0),
    )
    server.start()
    with closing(connect(server, cert_dir)) as connection:
        connection.request("GET", "/healthz")
        assert connection.getresponse().read() == b"ok"
        server.stop()  # must not wait 60 s for the idle connection
        server.stop()  # idempotent
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", connection.port), timeout=1).close()


def test_every_answer_is_told_with_its_status_time_and_decision(cert_dir: Path) -> None:
    metrics = WebhookMetrics()
    seen: list[tuple[int, float, Mapping[str, Any] | None]] = []

    def observe(code: int, seconds: float, answer: Mapping[str, Any] | None) -> None:
        seen.append((code, seconds, answer))
        metrics.answered(code, seconds, answer)

    with (
        WebhookServer(
            review=review_handler,
            cert_file=cert_dir / CERT_FILE,
            key_file=cert_dir / KEY_FILE,
            address=("127.0.0.1", 0),
            observe=observe,
        ) as running,
        closing(connect(running, cert_dir)) as connection,
        closing(connect(running, cert_dir)) as another,
    ):
        gated = review(pod(limits={"nvidia.com/mig-1g.5gb": "1"}))
        assert post(connection, "/mutate-pods", json.dumps(gated).encode())[0] == 200
        refused = review(pod(limits={"nvidia.com/mig-9g.99gb": "1"}))
        assert post(connection, "/mutate-pods", json.dumps(refused).encode())[0] == 200
        assert post(connection, "/mutate-pods", json.dumps(review(pod())).encode())[0] == 200
        protected = claim_review(claim(exactly("mig-1g.5gb.instaslice.dev")))
        assert (
            post(connection, "/mutate-resource-v1-resourceclaim", json.dumps(protected).encode())[0]
            == 200
        )
        assert post(connection, "/mutate-pods", b"not json")[0] == 400
        assert post(connection, "/elsewhere", b"{}")[0] == 404  # closes: its body is unread
        assert post(another, "/mutate-pods", b'{"explode": true}')[0] == 500
    assert [code for code, _, _ in seen] == [200, 200, 200, 200, 400, 404, 500]
    assert all(seconds >= 0 for _, seconds, _ in seen)
    assert [answer is None for _, _, answer in seen] == [False] * 4 + [True] * 3
    text = metrics.exposition().decode()
    for decision, count in (("gated", 1), ("refused", 1), ("allowed", 1), ("protected", 1)):
        assert f'instaslice_webhook_admissions_total{{decision="{decision}"}} {count}.0' in text
    for code, count in (("200", 4), ("400", 1), ("404", 1), ("500", 1)):
        assert f'instaslice_webhook_requests_total{{code="{code}"}} {count}.0' in text
    assert "instaslice_webhook_request_duration_seconds_count 7.0" in text


def test_an_answer_is_classed_by_what_it_allows_and_patches() -> None:
    assert admission_decision({"response": {"allowed": True, "patch": "W10="}}) == "gated"
    finalizer = base64.b64encode(
        json.dumps([{"op": "add", "path": "/metadata/finalizers", "value": ["f"]}]).encode()
    ).decode()
    assert admission_decision({"response": {"allowed": True, "patch": finalizer}}) == "protected"
    assert admission_decision({"response": {"allowed": True, "patch": "!!"}}) == "gated"
    assert admission_decision({"response": {"allowed": True}}) == "allowed"
    assert admission_decision({"response": {"allowed": False, "status": {}}}) == "refused"
    assert admission_decision({"kind": "AdmissionReview"}) == "refused"  # no verdict: not allowed


def test_a_request_refused_before_its_body_is_read_closes_the_connection(
    server: WebhookServer, cert_dir: Path
) -> None:
    """Kept open, the unread body would be parsed as the next request (501 for ``{}``)."""
    with closing(connect(server, cert_dir)) as connection:
        connection.request("POST", "/elsewhere", body=b"{}")
        response = connection.getresponse()
        assert (response.status, response.getheader("Connection")) == (404, "close")
        response.read()
        status, answer = post(connection, "/mutate-pods", json.dumps(review(pod())).encode())
        assert status == 200  # http.client reconnected: a clean connection, not the stale body
        assert answer["response"]["allowed"] is True
