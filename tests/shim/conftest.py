"""Fixtures: one emulated node (two A100-40GB) with the kubelet plugin, the shim and a fake kubelet."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from localcluster.apiserver import LocalApiServer
from tests.shim.harness import ShimNode


@pytest.fixture
def node(apiserver: LocalApiServer) -> Iterator[ShimNode]:
    harness = ShimNode(apiserver)
    try:
        yield harness
    finally:
        harness.close()
