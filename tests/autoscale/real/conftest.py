"""The autoscaling tier: the real cluster-autoscaler growing and shrinking the real stack.

Collected only with ``--autoscale`` (``make test-autoscale``); where the real stack or
cluster-autoscaler is not built every test is skipped with one reason. One session: the control
plane restarted clean, our controller (one replica) and DeviceClasses, **no node of its own** —
every node belongs to a node group of the test cloud provider (``tests/autoscale``), which
cluster-autoscaler reaches over gRPC:

* ``a100``: nodes of 1 x A100-40GB (seven 1g.5gb each), min 1, max 3 — it starts at 1;
* ``h100``: nodes of 1 x H100-80GB (three 2g.20gb each), min 0, max 2 — it starts at 0, and the
  A100 has no 2g.20gb: pods asking it fit this group only.

A node is a real kubelet (``--provider-id``, the group's label) and our kubelet plugin with the
group's GPUs emulated; the templates carry the group's labels, this machine's CPU and memory, and
the classic shim's ``nvidia.com/mig-*`` counts. The session starts in scheduler mode (before any
node runs the classic shim, so the switch waits for nothing); the controller-mode scenario
switches, and no scenario switches back.

The figures (pending → Running through a scale-up per mode, nodes over time, overlaps, leaks)
are printed and written to ``$INSTASLICE_REAL_LOGS/autoscale.json``; the logs (cluster-autoscaler's
included) are kept there too.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from localcluster.realstack import RealStack, RealStackConfig, stack_path
from tests.autoscale.autoscaler import ClusterAutoscaler, binary_path, describe_missing
from tests.autoscale.groups import NodeGroups, NodeGroupSpec
from tests.autoscale.launcher import RealStackLauncher, kubelet_capacity
from tests.autoscale.provider import CloudProvider, ProviderServer
from tests.autoscale.real.steps import node_starts, nodes_over_time
from tests.autoscale.template import node_bytes, template_node
from tests.e2e.conftest import E2E_NS
from tests.e2e.helpers import apply, attach_daemon_logs
from tests.real.test_modes import to_scheduler_mode
from tests.tiers import skip_unless_built

HERE = Path(__file__).resolve().parent
GROUP_LABEL = "autoscale.instaslice.dev/node-group"
A100 = NodeGroupSpec(
    id="a100", gpus="1xA100-40GB", min_size=1, max_size=3, labels={GROUP_LABEL: "a100"}
)
H100 = NodeGroupSpec(
    id="h100", gpus="1xH100-80GB", min_size=0, max_size=2, labels={GROUP_LABEL: "h100"}
)
FIRST_NODE_S = 300.0


def logs_dir() -> Path:
    """Where a run's logs and figures are kept (``INSTASLICE_REAL_LOGS``, as ``make test-real``)."""
    return stack_path("INSTASLICE_REAL_LOGS", "instaslice-real-logs")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_unless_built(items, HERE, describe_missing())


@dataclass
class Autoscaled:
    """The stack, the provider and its nodes, cluster-autoscaler, and the figures gathered."""

    stack: RealStack
    provider: CloudProvider
    launcher: RealStackLauncher
    autoscaler: ClusterAutoscaler
    started: float
    figures: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(scope="session")
def autoscaled() -> Iterator[Autoscaled]:
    stack = RealStack(RealStackConfig(nodes=0, controllers=1))
    launcher = RealStackLauncher(stack)
    base = kubelet_capacity()
    provider = CloudProvider(
        groups=NodeGroups([A100, H100]),
        launcher=launcher,
        template=lambda spec: node_bytes(template_node(spec, base_capacity=base, classic=True)),
    )
    server = ProviderServer(provider)
    autoscaler = ClusterAutoscaler(
        binary=binary_path(),
        kubeconfig=stack.kubeconfig,
        provider_address=server.address,
        work_dir=stack.root / "autoscaler",
    )
    cluster = Autoscaled(stack, provider, launcher, autoscaler, started=time.monotonic())
    try:
        stack.start()
        apply(stack, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": E2E_NS}}])
        to_scheduler_mode(stack)
        server.start()
        provider.increase(A100.id, A100.min_size)
        provider.wait_idle(timeout=FIRST_NODE_S)
        autoscaler.start()
        yield cluster
    finally:
        autoscaler.stop()
        server.stop()
        provider.close()
        _keep(cluster)
        stack.stop(keep_logs=logs_dir())


def _keep(cluster: Autoscaled) -> None:
    cluster.figures["node_start"] = node_starts(cluster.provider)
    cluster.figures["nodes_over_time"] = nodes_over_time(cluster.provider, since=cluster.started)
    cluster.figures["leaks"] = sum(len(r.leftovers) for r in cluster.launcher.removals())
    cluster.figures["nodes_removed"] = len(cluster.launcher.removals())
    text = json.dumps(cluster.figures, indent=2)
    print(text)
    out = logs_dir()
    out.mkdir(parents=True, exist_ok=True)
    (out / "autoscale.json").write_text(text + "\n", encoding="utf-8")
    cluster.stack.logs_dir.mkdir(parents=True, exist_ok=True)
    if cluster.autoscaler.log_file.is_file():
        shutil.copyfile(
            cluster.autoscaler.log_file, cluster.stack.logs_dir / "cluster-autoscaler.log"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    cluster = getattr(item, "funcargs", {}).get("autoscaled")
    if report.failed and isinstance(cluster, Autoscaled):
        attach_daemon_logs(report, cluster.stack)
        tail = cluster.autoscaler.log_lines("scale")[-40:]
        report.sections.append(("cluster-autoscaler (scale lines)", "\n".join(tail)))
        report.sections.append(("node groups", str(cluster.provider.groups.instances())))
