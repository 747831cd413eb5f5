"""The webhook's HTTPS endpoint under hostile or broken callers: a client that sends a byte a second
(in the handshake or in a request) is cut at the deadline while others are served; connections over
the cap are refused without a thread each; malformed ``AdmissionReview``s of any shape get a 200 or
a 400, never a crash; TLS older than 1.2 and non-AEAD TLS 1.2 suites are refused."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.webhook.admission import MalformedReviewError, review_pod
from controller.webhook.certificates import CERT_FILE, KEY_FILE
from controller.webhook.server import MIN_TLS_VERSION, CallerLimits, WebhookServer
from tests.controller.test_admission import default_context, pod, review
from tests.controller.test_webhook_server import (
    cert_dir,
    client_context,
    connect,
    post,
    review_handler,
)

__all__ = ["cert_dir"]  # the fixture, shared with test_webhook_server

DEADLINE_S = 0.5


def limited_server(
    cert_dir: Path, *, max_connections: int, deadline_s: float, body_budget_bytes: int = 1 << 25
) -> WebhookServer:
    return WebhookServer(
        review=review_handler,
        cert_file=cert_dir / CERT_FILE,
        key_file=cert_dir / KEY_FILE,
        address=("127.0.0.1", 0),
        reload_interval=60.0,
        limits=CallerLimits(
            idle_timeout_s=30.0,
            max_connections=max_connections,
            request_deadline_s=deadline_s,
            body_budget_bytes=body_budget_bytes,
            body_wait_s=0.2,
        ),
    )


@pytest.fixture
def server(cert_dir: Path) -> Iterator[WebhookServer]:
    with limited_server(cert_dir, max_connections=8, deadline_s=DEADLINE_S) as running:
        yield running


def ok_review(server: WebhookServer, cert_dir: Path) -> int:
    with closing(connect(server, cert_dir)) as connection:
        return post(connection, "/mutate-pods", json.dumps(review(pod())).encode())[0]


def dribble(sock: socket.socket | ssl.SSLSocket, data: bytes, *, every_s: float) -> bool:
    """Send ``data`` a byte at a time; True when the server cut the connection first."""
    for byte in data:
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return True
        time.sleep(every_s)
    sock.settimeout(5)
    try:
        return sock.recv(1024) == b""
    except OSError:
        return True


def test_a_request_sent_a_byte_at_a_time_is_cut_and_others_are_served_meanwhile(
    server: WebhookServer, cert_dir: Path
) -> None:
    body = json.dumps(review(pod())).encode()
    request = b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    served: list[int] = []
    with closing(connect(server, cert_dir)) as slow:
        assert slow.sock is not None

        def others() -> None:
            time.sleep(0.1)
            served.append(ok_review(server, cert_dir))

        thread = threading.Thread(target=others)
        thread.start()
        # the whole request would take 10 s at this pace; the deadline is 0.5 s
        cut = dribble(slow.sock, request + body, every_s=10 / len(request + body))
        thread.join(10)
    assert cut
    assert served == [200]
    assert server.guard.cut >= 1
    assert ok_review(server, cert_dir) == 200


def test_a_handshake_sent_a_byte_at_a_time_is_cut(server: WebhookServer, cert_dir: Path) -> None:
    # A real ClientHello, captured from a memory BIO, then sent one byte every 50 ms.
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client_context(cert_dir).wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    with closing(socket.create_connection(("127.0.0.1", server.port), timeout=5)) as raw:
        assert dribble(raw, hello * 10, every_s=0.05)
    assert server.guard.cut >= 1
    assert ok_review(server, cert_dir) == 200


def test_an_idle_kept_alive_connection_is_not_cut(server: WebhookServer, cert_dir: Path) -> None:
    with closing(connect(server, cert_dir)) as connection:
        assert post(connection, "/mutate-pods", json.dumps(review(pod())).encode())[0] == 200
        time.sleep(DEADLINE_S * 2)  # idle between requests: only the idle timeout applies
        assert post(connection, "/mutate-pods", json.dumps(review(pod())).encode())[0] == 200
    assert server.guard.cut == 0


def test_connections_over_the_cap_are_refused_without_a_thread_each(cert_dir: Path) -> None:
    with limited_server(cert_dir, max_connections=4, deadline_s=30.0) as running:
        before = threading.active_count()
        held = [socket.create_connection(("127.0.0.1", running.port), timeout=5) for _ in range(4)]
        extra = [
            socket.create_connection(("127.0.0.1", running.port), timeout=5) for _ in range(30)
        ]
        try:
            for conn in extra:
                conn.settimeout(5)
                assert conn.recv(1) == b""  # closed at once, no handshake
            assert running.guard.open_connections() == 4
            assert threading.active_count() - before <= 4
            held.pop().close()
            deadline = time.monotonic() + 5
            while running.guard.open_connections() > 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert ok_review(running, cert_dir) == 200  # a freed slot serves again
        finally:
            for conn in held + extra:
                conn.close()


def test_a_body_that_never_fully_arrives_is_cut_and_the_server_goes_on(
    server: WebhookServer, cert_dir: Path
) -> None:
    with closing(connect(server, cert_dir)) as connection:
        assert connection.sock is not None
        connection.sock.sendall(b"POST /mutate-pods HTTP/1.1\r\nContent-Length: 100\r\n\r\n{}")
        connection.sock.settimeout(5)
        try:
            answer = connection.sock.recv(4096)
        except OSError:
            answer = b""
    assert answer == b""
    assert server.guard.cut == 1
    assert ok_review(server, cert_dir) == 200


def test_bodies_beyond_the_memory_budget_wait_then_get_503_and_others_go_on(
    cert_dir: Path,
) -> None:
    budget = 1 << 20
    with limited_server(
        cert_dir, max_connections=8, deadline_s=5.0, body_budget_bytes=budget
    ) as running:
        # one request holds most of the budget: its body arrives, slowly
        holder = connect(running, cert_dir)
        assert holder.sock is not None
        holder.sock.sendall(
            b"POST /mutate-pods HTTP/1.1\r\nContent-Length: %d\r\n\r\n{" % (budget - 1000)
        )
        time.sleep(0.2)
        with closing(connect(running, cert_dir)) as second:
            second.request("POST", "/mutate-pods", body=b"{" + b" " * (budget // 2) + b"}")
            response = second.getresponse()
            assert response.status == 503
            assert response.getheader("Connection") == "close"
            response.read()
        assert ok_review(running, cert_dir) == 200  # a small body fits beside it
        holder.close()


# --- malformed AdmissionReviews ---------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
KEYS = st.sampled_from(
    ["apiVersion", "kind", "request", "uid", "object", "namespace", "operation", "spec",
     "containers", "resources", "limits", "resourceClaims", "metadata", "devices", "requests"]
)  # fmt: skip
SHAPED = st.recursive(
    JSON,
    lambda inner: st.dictionaries(KEYS, inner, max_size=5) | st.lists(inner, max_size=3),
    max_leaves=30,
)


def _mutations(base: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A valid review with one field, at any depth, replaced by arbitrary JSON."""

    def replace(value: Any) -> st.SearchStrategy[Any]:
        if isinstance(value, dict) and value:
            return st.sampled_from(sorted(value)).flatmap(
                lambda key: st.one_of(SHAPED, replace(value[key])).map(
                    lambda new: {**value, key: new}
                )
            )
        if isinstance(value, list) and value:
            return st.integers(0, len(value) - 1).flatmap(
                lambda i: st.one_of(SHAPED, replace(value[i])).map(
                    lambda new: [*value[:i], new, *value[i + 1 :]]
                )
            )
        return SHAPED

    return replace(base)


def _check_answer(body: Any) -> None:
    try:
        answer = review_pod(body, default_context())
    except MalformedReviewError:
        return
    assert answer["kind"] == "AdmissionReview"
    assert isinstance(answer["response"]["allowed"], bool)
    json.dumps(answer)  # serialisable


PROPERTY_SETTINGS = settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@PROPERTY_SETTINGS
@given(SHAPED)
def test_any_json_is_answered_or_called_malformed(body: Any) -> None:
    _check_answer(body)


@PROPERTY_SETTINGS
@given(_mutations(review(pod(limits={"nvidia.com/mig-1g.5gb": "1"}))))
def test_a_pod_review_with_any_field_broken_is_answered_or_called_malformed(
    body: dict[str, Any],
) -> None:
    _check_answer(body)


@PROPERTY_SETTINGS
@given(
    _mutations(
        review(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "p"},
                "spec": {
                    "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}],
                },
            }
        )
    )
)
def test_a_claim_pod_review_with_any_field_broken_is_answered_or_called_malformed(
    body: dict[str, Any],
) -> None:
    _check_answer(body)


@pytest.mark.parametrize(
    "body",
    [b"\xff\xfe", b"[" * 100_000, b'{"request": ' * 5000, b"1e999999", b'"\\ud800"', b"{}" * 10],
    ids=["not-utf8", "deep-list", "deep-object", "huge-number", "lone-surrogate", "trailing"],
)
def test_broken_bodies_get_400_over_https(
    server: WebhookServer, cert_dir: Path, body: bytes
) -> None:
    with closing(connect(server, cert_dir)) as connection:
        connection.request("POST", "/mutate-pods", body=body)
        response = connection.getresponse()
        assert response.status == 400
        response.read()
    assert ok_review(server, cert_dir) == 200


# --- TLS ------------------------------------------------------------------------------------


def _handshake(server: WebhookServer, context: ssl.SSLContext) -> str | None:
    """The version negotiated, or None when the server refused."""
    with closing(socket.create_connection(("127.0.0.1", server.port), timeout=5)) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                return tls.version()
        except (ssl.SSLError, OSError):
            return None


def _client(
    cert_dir: Path, *, version: ssl.TLSVersion, ciphers: str | None = None
) -> ssl.SSLContext:
    context = client_context(cert_dir)
    with warnings.catch_warnings():  # naming TLS 1.1 is deprecated: we name it to refuse it
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        context.maximum_version = version
    if ciphers is not None:
        context.set_ciphers(ciphers)
    return context


def test_tls_1_2_and_1_3_are_served(server: WebhookServer, cert_dir: Path) -> None:
    assert MIN_TLS_VERSION is ssl.TLSVersion.TLSv1_2
    assert _handshake(server, _client(cert_dir, version=ssl.TLSVersion.TLSv1_3)) == "TLSv1.3"
    assert _handshake(server, _client(cert_dir, version=ssl.TLSVersion.TLSv1_2)) == "TLSv1.2"


def test_tls_older_than_1_2_is_refused(server: WebhookServer, cert_dir: Path) -> None:
    old = _client(cert_dir, version=ssl.TLSVersion.TLSv1_1, ciphers="ALL:@SECLEVEL=0")
    control = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    control.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    control.set_ciphers("ALL:@SECLEVEL=0")
    control.load_cert_chain(cert_dir / CERT_FILE, cert_dir / KEY_FILE)
    if not _speaks(old, control):
        pytest.skip("this OpenSSL cannot speak TLS 1.1 at all: nothing to refuse")
    assert _handshake(server, old) is None


def test_tls_1_2_without_an_aead_suite_is_refused(server: WebhookServer, cert_dir: Path) -> None:
    cbc = _client(cert_dir, version=ssl.TLSVersion.TLSv1_2, ciphers="ECDHE+AES+SHA256:!AESGCM")
    assert _handshake(server, cbc) is None
    aead = _client(cert_dir, version=ssl.TLSVersion.TLSv1_2, ciphers="ECDHE+AESGCM")
    assert _handshake(server, aead) == "TLSv1.2"


def _speaks(client: ssl.SSLContext, server_context: ssl.SSLContext) -> bool:
    """Whether ``client`` completes a handshake with ``server_context`` (in memory)."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    tls_client = client.wrap_bio(c_in, c_out, server_hostname="127.0.0.1")
    tls_server = server_context.wrap_bio(s_in, s_out, server_side=True)
    done = [False, False]
    for _ in range(10):
        for index, (tls, source, sink) in enumerate(
            ((tls_client, s_out, c_in), (tls_server, c_out, s_in))
        ):
            sink.write(source.read())
            if not done[index]:
                try:
                    tls.do_handshake()
                    done[index] = True
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLError:
                    return False
        if all(done):
            return True
    return False
