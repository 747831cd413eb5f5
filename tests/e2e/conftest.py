"""The end-to-end harness: one InstaSlice stack per test module (local API server, emulated
kubelets and scheduler, the real controller and kubelet plugins as processes), shared by the
module's scenarios to save start-up time.

Every scenario takes ``cluster``: after the test body the invariants are checked while its pods
still run, then everything the scenario made is deleted and the nodes must end with no MIG
instance, no CDI spec and no checkpoint entry. A failing test gets the daemons' log tails attached.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from driver.cluster.port import PODS, RESOURCE_CLAIMS
from driver.errors import DriverError
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
CLEANUP_S = 20.0


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
        try:
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
        except TimeoutError:
            _repair(stack)  # so that the module's next scenarios start from a clean cluster
            raise


def _scenario_objects(stack: InstaSliceStack) -> list[str]:
    left = []
    for namespace in NAMESPACES:
        for resource in (PODS, RESOURCE_CLAIMS):
            for obj in stack.api.list_objects(resource, namespace=namespace).items:
                meta, status = obj["metadata"], obj.get("status") or {}
                state = {
                    "phase": status.get("phase"),
                    "deleting": bool(meta.get("deletionTimestamp")),
                    "finalizers": meta.get("finalizers"),
                    "reservedFor": [r.get("name") for r in status.get("reservedFor") or []],
                    "allocated": bool(status.get("allocation")),
                }
                shown = {k: v for k, v in state.items() if v}
                left.append(f"{resource.kind} {namespace}/{meta['name']} {shown}")
    return left


def _repair(stack: InstaSliceStack) -> None:
    """Force out what a failed cleanup left (claims held by finalizers), best effort."""
    for namespace in NAMESPACES:
        for claim in stack.api.list_objects(RESOURCE_CLAIMS, namespace=namespace).items:
            claim["metadata"]["finalizers"] = []
            with contextlib.suppress(DriverError):
                stack.api.update(RESOURCE_CLAIMS, claim)
            with contextlib.suppress(DriverError):
                stack.api.delete(
                    RESOURCE_CLAIMS, name=claim["metadata"]["name"], namespace=namespace
                )
    with contextlib.suppress(TimeoutError):
        wait_for(stack, lambda: not node_leftovers(stack), timeout=CLEANUP_S)


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
