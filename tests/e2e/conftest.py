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

from driver.cluster.port import PODS, RESOURCE_CLAIMS
from localcluster.stack import InstaSliceStack, StackConfig
from tests.e2e.helpers import (
    QUOTA_NS,
    SAMPLES_NS,
    apply,
    delete_everything,
    node_leftovers,
    sample,
    wait_for,
    wait_invariants,
)

E2E_NS = "e2e"
NAMESPACES = (SAMPLES_NS, QUOTA_NS, E2E_NS)
CLEANUP_S = 30.0


@pytest.fixture(scope="module")
def stack() -> Iterator[InstaSliceStack]:
    with InstaSliceStack(StackConfig(nodes=2, gpus="2xA100-40GB")) as started:
        apply(started, sample("namespace.yaml"))
        apply(started, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": E2E_NS}}])
        yield started


@pytest.fixture
def cluster(stack: InstaSliceStack) -> Iterator[InstaSliceStack]:
    stack.check_daemons()
    yield stack
    try:
        wait_invariants(stack, NAMESPACES)
    finally:
        delete_everything(stack, NAMESPACES)
        wait_for(
            stack,
            lambda: not _scenario_objects(stack),
            timeout=CLEANUP_S,
            explain=lambda: f"not removed: {_scenario_objects(stack)}",
        )
        wait_for(
            stack,
            lambda: not node_leftovers(stack),
            timeout=CLEANUP_S,
            explain=lambda: f"left on the nodes: {node_leftovers(stack)}",
        )


def _scenario_objects(stack: InstaSliceStack) -> list[str]:
    left = []
    for namespace in NAMESPACES:
        for resource in (PODS, RESOURCE_CLAIMS):
            for obj in stack.api.list_objects(resource, namespace=namespace).items:
                phase = (obj.get("status") or {}).get("phase", "")
                left.append(
                    f"{resource.kind} {namespace}/{obj['metadata']['name']} {phase}".strip()
                )
    return left


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    funcargs = getattr(item, "funcargs", {})
    stack = funcargs.get("cluster") or funcargs.get("stack")
    if report.failed and isinstance(stack, InstaSliceStack):
        processes = [*stack.plugins.values(), *([stack.controller] if stack.controller else [])]
        for process in processes:
            report.sections.append((f"{process.name} log", process.log_tail(60)))
