"""Project-wide fixtures: a local API server per test and a ``kubernetes`` client bound to it.

Sub-folder conftests add their own fixtures; these two are the shared contract.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from localcluster.apiserver import LocalApiServer
from localcluster.testing import api_client, close_client


@pytest.fixture
def apiserver() -> Iterator[LocalApiServer]:
    """A started LocalApiServer on a free loopback port, stopped after the test."""
    with LocalApiServer() as server:
        yield server


@pytest.fixture
def kube_client(apiserver: LocalApiServer) -> Iterator[Any]:
    """A ``kubernetes.client.ApiClient`` talking to ``apiserver``; closed after the test."""
    client = api_client(apiserver)
    try:
        yield client
    finally:
        close_client(client)
