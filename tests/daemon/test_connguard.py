"""The bounds on a server's callers: a cap on open connections, a deadline on what a connection
began (handshake or request), a budget of body bytes; and the metrics endpoint under them."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import closing

import pytest

from driver.daemon.connguard import BodyBudget, ConnectionGuard
from driver.daemon.http import HttpEndpoint


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    left, right = socket.socketpair()
    with closing(left), closing(right):
        yield left, right


def test_one_connection_over_the_cap_is_refused_and_a_released_slot_is_reused() -> None:
    guard = ConnectionGuard(max_connections=2, deadline_s=5, name="test")
    sockets = [socket.socket() for _ in range(3)]
    try:
        assert [guard.admit(s) for s in sockets] == [True, True, False]
        assert guard.open_connections() == 2
        guard.release(sockets[0])
        assert guard.admit(sockets[2])
        guard.release(sockets[2])
        guard.release(sockets[2])  # twice is harmless
        assert guard.open_connections() == 1
    finally:
        for s in sockets:
            s.close()


def test_only_a_connection_past_its_deadline_is_shut_down(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    clock = FakeClock()
    guard = ConnectionGuard(max_connections=4, deadline_s=5, name="test", clock=clock)
    server_side, client_side = pair
    idle = socket.socket()
    with closing(idle):
        assert guard.admit(server_side)
        assert guard.admit(idle)
        guard.begin(server_side)
        clock.now += 4.9
        assert guard.sweep() == 0
        clock.now += 0.2
        assert guard.sweep() == 1  # the idle one has no deadline
        assert client_side.recv(1) == b""  # the peer sees the end
        assert guard.sweep() == 0  # shut down once
        assert guard.cut == 1


def test_a_request_that_ends_in_time_is_not_cut(pair: tuple[socket.socket, socket.socket]) -> None:
    clock = FakeClock()
    guard = ConnectionGuard(max_connections=4, deadline_s=5, name="test", clock=clock)
    server_side, _ = pair
    guard.admit(server_side)
    guard.begin(server_side)
    clock.now += 4
    guard.end(server_side)
    clock.now += 100
    assert guard.sweep() == 0


def test_nonsense_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        ConnectionGuard(max_connections=0, deadline_s=1, name="test")


def test_the_body_budget_waits_for_room_and_refuses_when_none_comes() -> None:
    budget = BodyBudget(limit_bytes=100)
    with budget.hold(60, wait_s=0) as first:
        assert first
        with budget.hold(60, wait_s=0.05) as second:
            assert not second
        with budget.hold(40, wait_s=0) as third:
            assert third
            assert budget.held == 100
    assert budget.held == 0
    with budget.hold(101, wait_s=0) as too_big:
        assert not too_big


def test_a_waiting_body_gets_room_when_another_finishes() -> None:
    budget = BodyBudget(limit_bytes=100)
    got: list[bool] = []
    holding = threading.Event()
    release = threading.Event()

    def first() -> None:
        with budget.hold(80, wait_s=0):
            holding.set()
            release.wait(5)

    thread = threading.Thread(target=first)
    thread.start()
    holding.wait(5)

    def second() -> None:
        with budget.hold(80, wait_s=10) as granted:
            got.append(granted)

    waiter = threading.Thread(target=second)
    waiter.start()
    release.set()
    thread.join(5)
    waiter.join(5)
    assert got == [True]
    assert budget.held == 0


def _metrics(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return bytes(reply.read())


def test_metrics_endpoint_cuts_a_byte_a_second_client_and_serves_others_meanwhile() -> None:
    endpoint = HttpEndpoint(
        address=("127.0.0.1", 0),
        routes={"/metrics": lambda: (200, "text/plain", b"up 1\n")},
        name="test metrics",
        max_connections=4,
        request_deadline=0.5,
    )
    endpoint.start()
    try:
        slow = socket.create_connection(("127.0.0.1", endpoint.port), timeout=5)
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200
        with closing(slow):
            slow.sendall(request[:1])
            # others are served while the slow one dribbles
            assert _metrics(endpoint.port) == b"up 1\n"
            cut = False
            for byte in request[1:]:
                try:
                    slow.sendall(bytes([byte]))
                except OSError:
                    cut = True
                    break
                time.sleep(0.02)
            if not cut:
                slow.settimeout(5)
                cut = slow.recv(1024) == b""
            assert cut, "the slow client was never cut off"
        assert _metrics(endpoint.port) == b"up 1\n"
    finally:
        endpoint.stop()


def test_metrics_endpoint_holds_no_more_threads_than_its_cap() -> None:
    endpoint = HttpEndpoint(
        address=("127.0.0.1", 0),
        routes={"/metrics": lambda: (200, "text/plain", b"up 1\n")},
        name="test metrics",
        max_connections=3,
        request_deadline=30,
    )
    endpoint.start()
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", endpoint.port), timeout=5) for _ in range(20)]
    try:
        for conn in idle:
            conn.sendall(b"G")  # a request begun, never finished
        deadline = time.monotonic() + 1
        refused = 0
        for conn in idle:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                if conn.recv(1) == b"":
                    refused += 1
            except TimeoutError:
                pass  # one of the admitted, still waiting
            except OSError:
                refused += 1
        assert refused == 17
        assert threading.active_count() - before <= 3
    finally:
        for conn in idle:
            conn.close()
        endpoint.stop()
