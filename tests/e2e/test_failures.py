"""Daemons killed in the middle of a burst of pods and started again: nothing lost, nothing
doubled, no slice left that no claim owns (checked by the ``cluster`` fixture afterwards)."""

from __future__ import annotations

from localcluster.stack import InstaSliceStack
from tests.e2e.conftest import E2E_NS
from tests.e2e.helpers import (
    apply,
    claim_template,
    dra_pod,
    get_pod,
    is_gated,
    pods,
    running,
    wait_for,
    wait_running,
)

BURST = 12


def _burst(cluster: InstaSliceStack, name: str) -> None:
    apply(cluster, [claim_template(name, profile="1g.5gb", namespace=E2E_NS)])
    apply(cluster, [dra_pod(f"{name}-{i}", template=name, namespace=E2E_NS) for i in range(BURST)])


def test_kubelet_plugin_killed_mid_burst_and_restarted(cluster: InstaSliceStack) -> None:
    _burst(cluster, "plugin-crash")
    # First-fit fills node-0 first: kill its plugin while pods are being prepared there.
    wait_for(
        cluster,
        lambda: any(
            (p.get("spec") or {}).get("nodeName") == "node-0" for p in pods(cluster, E2E_NS)
        ),
        message="no pod bound to node-0",
    )
    cluster.plugins["node-0"].kill()
    cluster.plugins["node-0"].start()
    wait_running(cluster, E2E_NS, BURST)
    assert cluster.plugins["node-0"].starts == 2


def test_controller_killed_mid_burst_and_restarted(cluster: InstaSliceStack) -> None:
    _burst(cluster, "controller-crash")
    wait_for(
        cluster,
        lambda: any(not is_gated(p) for p in pods(cluster, E2E_NS)),
        message="the controller placed no pod",
    )
    assert cluster.controller is not None
    cluster.controller.kill()
    cluster.controller.start()
    cluster.wait_ready()
    wait_running(cluster, E2E_NS, BURST)
    assert all(running(get_pod(cluster, E2E_NS, f"controller-crash-{i}")) for i in range(BURST))
