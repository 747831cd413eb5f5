"""The real-stack tier: InstaSlice on real kube-apiserver, kube-scheduler, kube-controller-manager
and real kubelets (fake container runtime), built by ``../shared/realstack``.

Collected only with ``--real-stack`` (``make test-real``). Where the stack is not built every test
here is skipped with one reason. One stack serves the whole session (starting it takes about a
minute): two nodes of 2 x A100-40GB, two controller replicas with leader election, our DeviceClasses
and RBAC from ``deploy/base``, each daemon authenticated as its own ServiceAccount.

Every scenario takes ``cluster``: as in ``tests/e2e``, afterwards the invariants are checked while
its pods still run (every container sees exactly its own slices, resolved through the CDI library;
no overlap; no orphan instance), then everything it made is deleted and the nodes must end with no
MIG instance, CDI spec or checkpoint entry.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster.realstack import RealStack, RealStackConfig, describe_missing, stack_path
from tests.e2e.conftest import E2E_NS
from tests.e2e.helpers import QUOTA_NS, SAMPLES_NS, apply, attach_daemon_logs, sample, scenario
from tests.tiers import skip_unless_built

NAMESPACES = (SAMPLES_NS, QUOTA_NS, E2E_NS)
CLEANUP_S = 30.0
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_unless_built(items, HERE, describe_missing())


def logs_dir() -> Path:
    """Where a run's daemon and kubelet logs are kept (``INSTASLICE_REAL_LOGS``)."""
    return stack_path("INSTASLICE_REAL_LOGS", "instaslice-real-logs")


@pytest.fixture(scope="session")
def real_stack() -> Iterator[RealStack]:
    stack = RealStack(RealStackConfig(nodes=2, gpus="2xA100-40GB", controllers=2))
    try:
        stack.start()
        apply(stack, sample("namespace.yaml"))
        apply(stack, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": E2E_NS}}])
        yield stack
    finally:
        stack.stop(keep_logs=logs_dir())


@pytest.fixture
def cluster(real_stack: RealStack) -> Iterator[RealStack]:
    with scenario(real_stack, NAMESPACES, cleanup_s=CLEANUP_S):
        yield real_stack


@pytest.fixture
def classic(cluster: RealStack) -> RealStack:
    """The cluster once every Node lists the shim's ``nvidia.com/mig-*`` resources."""
    cluster.wait_ready(classic=True)
    return cluster


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    funcargs = getattr(item, "funcargs", {})
    stack = funcargs.get("cluster") or funcargs.get("real_stack")
    if report.failed and isinstance(stack, RealStack):
        attach_daemon_logs(report, stack)
        for node in stack.node_names:
            errors = stack.kubelet(node).error_lines()[-15:]
            report.sections.append((f"kubelet {node} errors", "\n".join(errors)))
