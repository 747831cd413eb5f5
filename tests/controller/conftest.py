"""Fixtures of the controller tests: one ``ExitStack`` per test that closes clients and stops
controllers (``harness.start_controller``, ``harness.cluster_api``) in reverse order."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack
