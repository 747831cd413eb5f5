"""Fixtures of the controller tests: one ``ExitStack`` per test that closes clients and stops
controllers (``harness.start_controller``, ``harness.cluster_api``) in reverse order; and for the
daemon run as a process (``daemon.py``), an API server that calls our webhook by its Service."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from localcluster.apiserver import LocalApiServer
from localcluster.stack import free_port


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


@pytest.fixture
def webhook_port() -> int:
    return free_port()


@pytest.fixture
def gated_server(webhook_port: int) -> Iterator[LocalApiServer]:
    """An API server that calls our webhook for its Service, like kube-apiserver would."""
    with LocalApiServer(
        service_resolver=lambda ns, name, port: f"https://127.0.0.1:{webhook_port}"
    ) as server:
        yield server
