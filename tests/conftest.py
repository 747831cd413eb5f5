"""Project-wide fixtures: a local API server per test and a ``kubernetes`` client bound to it.

Sub-folder conftests add their own fixtures; these two are the shared contract. The real-stack
tier (``tests/real``) is collected only with ``--real-stack`` (``make test-real``), the deploy tier
(``tests/deployed``) only with ``--deploy-tier`` (``make test-deploy``) and the autoscaling
scenarios (``tests/autoscale/real``) only with ``--autoscale`` (``make test-autoscale``): they need
the Kubernetes components (and cluster-autoscaler, or nodes with real containers) built by
``../shared/realstack`` and take minutes, so ``make test`` leaves them out even where those are built.

Tests write under their temporary folders only: a run that leaves a new file in the checkout (one
git neither tracks nor ignores) fails at its end and names the file.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster.apiserver import LocalApiServer
from localcluster.testing import api_client, close_client

CHECKOUT = Path(__file__).resolve().parent.parent
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


def _untracked_files() -> frozenset[str] | None:
    """The checkout's files that git neither tracks nor ignores; None outside a git checkout."""
    try:
        done = subprocess.run(
            ["git", "-C", str(CHECKOUT), "ls-files", "--others", "--exclude-standard", "-z"],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return frozenset(name for name in done.stdout.decode(errors="replace").split("\0") if name)


UNTRACKED_AT_START = pytest.StashKey[frozenset[str] | None]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.stash[UNTRACKED_AT_START] = _untracked_files()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when the tests left new files in the checkout (a file made there by hand
    while the tests ran counts too)."""
    before = session.stash.get(UNTRACKED_AT_START, None)
    after = _untracked_files() if before is not None else None
    if before is None or after is None or not after - before:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = "the tests left files in the checkout (write under tmp_path instead): " + ", ".join(
        sorted(after - before)
    )
    if reporter is not None:
        reporter.write("\n")
        reporter.write_line(message, red=True, bold=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
