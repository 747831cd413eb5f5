"""Project-wide fixtures: a local API server per test and a ``kubernetes`` client bound to it.

Sub-folder conftests add their own fixtures; these two are the shared contract. The real-stack
tier (``tests/real``) is collected only with ``--real-stack`` (``make test-real``), the deploy tier
(``tests/deployed``) only with ``--deploy-tier`` (``make test-deploy``) and the autoscaling
scenarios (``tests/autoscale/real``) only with ``--autoscale`` (``make test-autoscale``): they need
the Kubernetes components (and cluster-autoscaler, or nodes with real containers) built by
``../shared/realstack`` and take minutes, so ``make test`` leaves them out even where those are built.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster.apiserver import LocalApiServer
from localcluster.testing import api_client, close_client

REAL_TIER = Path(__file__).resolve().parent / "real"
AUTOSCALE_TIER = Path(__file__).resolve().parent / "autoscale" / "real"
DEPLOY_TIER = Path(__file__).resolve().parent / "deployed"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--real-stack",
        action="store_true",
        default=False,
        help="run tests/real on the real Kubernetes stack (make test-real)",
    )
    parser.addoption(
        "--autoscale",
        action="store_true",
        default=False,
        help="run tests/autoscale/real: cluster-autoscaler on the real stack (make test-autoscale)",
    )
    parser.addoption(
        "--deploy-tier",
        action="store_true",
        default=False,
        help="run tests/deployed: the images deployed on nodes with real containers "
        "(make test-deploy)",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    tiers = (
        (REAL_TIER, "--real-stack"),
        (AUTOSCALE_TIER, "--autoscale"),
        (DEPLOY_TIER, "--deploy-tier"),
    )
    for tier, option in tiers:
        inside = collection_path == tier or tier in collection_path.parents
        if inside and not config.getoption(option):
            return True
    return None


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
