"""``localcluster.tlsclient.wrap_client``: a TLS client socket never outlives a failed wrap."""

from __future__ import annotations

import gc
import socket
import ssl
import struct
import time
import warnings

import pytest

from localcluster.tlsclient import wrap_client


def _reset_by_peer() -> tuple[socket.socket, socket.socket]:
    """A connected client socket whose peer has already reset the connection (RST, no FIN)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    raw = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    accepted.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    accepted.close()
    time.sleep(0.05)  # the reset arrives
    return listener, raw


def _context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def test_a_connection_reset_before_the_handshake_leaves_no_socket_open() -> None:
    listener, raw = _reset_by_peer()
    with listener, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ConnectionResetError):
            wrap_client(_context(), raw, server_hostname="127.0.0.1")
        gc.collect()
    assert raw.fileno() == -1
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_a_refused_handshake_closes_the_plain_socket_too() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    raw = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    with listener, accepted:
        accepted.sendall(b"HTTP/1.1 400 not TLS\r\n\r\n")  # a peer that does not speak TLS
        accepted.shutdown(socket.SHUT_WR)
        with pytest.raises((ssl.SSLError, OSError)):
            wrap_client(_context(), raw, server_hostname="127.0.0.1")
    assert raw.fileno() == -1
