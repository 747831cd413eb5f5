"""Fixtures: one emulated node (two A100-40GB) whose plugin talks to the local API server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from localcluster.apiserver import LocalApiServer
from tests.kubeletplugin.harness import NodeHarness


@pytest.fixture
def node(apiserver: LocalApiServer) -> Iterator[NodeHarness]:
    harness = NodeHarness(api_url=apiserver.url)
    harness.create_node()
    try:
        yield harness
    finally:
        harness.close()
