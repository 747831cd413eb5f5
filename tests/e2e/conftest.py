"""The end-to-end harness: one InstaSlice stack per test module (local API server, emulated
kubelets and scheduler, the real controller and kubelet plugins as processes), shared by the
module's scenarios to save start-up time.

Every scenario takes ``cluster``: after the test body the invariants are checked while its pods
still run, then everything the scenario made is deleted and the nodes must end with no MIG
instance, no CDI spec and no checkpoint entry. A failing test gets the daemons' log tails attached.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

import pytest

from localcluster.stack import InstaSliceStack, StackConfig
from tests.e2e.helpers import (
    QUOTA_NS,
    SAMPLES_NS,
    apply,
    attach_daemon_logs,
    sample,
    scenario,
)

E2E_NS = "e2e"
NAMESPACES = (SAMPLES_NS, QUOTA_NS, E2E_NS)
CLEANUP_S = 20.0


@pytest.fixture(scope="module")
def stack() -> Iterator[InstaSliceStack]:
    with InstaSliceStack(StackConfig(nodes=2, gpus="2xA100-40GB")) as started:
        apply(started, sample("namespace.yaml"))
        apply(started, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": E2E_NS}}])
        yield started


@pytest.fixture
def cluster(stack: InstaSliceStack) -> Iterator[InstaSliceStack]:
    with scenario(stack, NAMESPACES, cleanup_s=CLEANUP_S):
        yield stack


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    funcargs = getattr(item, "funcargs", {})
    stack = funcargs.get("cluster") or funcargs.get("stack")
    if report.failed and isinstance(stack, InstaSliceStack):
        attach_daemon_logs(report, stack)
