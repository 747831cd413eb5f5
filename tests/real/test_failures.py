"""Daemons and kubelets killed in the middle of a burst on real Kubernetes: every pod runs in the
end, nothing overlaps, nothing leaks (the ``cluster`` fixture checks the last two afterwards)."""

from __future__ import annotations

import time

from api import names
from localcluster.realstack import RealStack
from tests.e2e.conftest import E2E_NS
from tests.e2e.helpers import (
    apply,
    claim_template,
    classic_pod,
    dra_pod,
    get_pod,
    is_gated,
    phase,
    pods,
    running,
    wait_for,
    wait_running,
)
from tests.e2e.test_failures import (
    test_controller_killed_mid_burst_and_restarted,
    test_kubelet_plugin_killed_mid_burst_and_restarted,
)

__all__ = [
    "test_controller_killed_mid_burst_and_restarted",
    "test_kubelet_plugin_killed_mid_burst_and_restarted",
]

BURST = 12
CLASSIC = 20
DRA = 8


def _dra_burst(cluster: RealStack, name: str, count: int = BURST) -> None:
    apply(cluster, [claim_template(name, profile="1g.5gb", namespace=E2E_NS)])
    apply(cluster, [dra_pod(f"{name}-{i}", template=name, namespace=E2E_NS) for i in range(count)])


def _bound_to(cluster: RealStack, node: str) -> bool:
    return any((p.get("spec") or {}).get("nodeName") == node for p in pods(cluster, E2E_NS))


def test_a_kubelet_killed_mid_burst_and_restarted(cluster: RealStack) -> None:
    _dra_burst(cluster, "kubelet-crash")
    wait_for(cluster, lambda: _bound_to(cluster, "node-0"), message="no pod bound to node-0")
    cluster.kill_kubelet("node-0")
    time.sleep(2)
    cluster.restart_kubelet("node-0")
    wait_running(cluster, E2E_NS, BURST)


def kill_the_leader(cluster: RealStack) -> None:
    """SIGKILL the controller replica that holds the lease, wait until the standby holds it, then
    start the killed one again (as the standby)."""
    holder = cluster.leader()
    assert holder is not None
    leader = next(
        c for c in cluster.controllers if c.pid is not None and holder.endswith(f"_{c.pid}")
    )
    leader.kill()
    try:
        # not stack.wait_for: it stops at a daemon that is not running, and this one is killed
        deadline = time.monotonic() + 30
        while cluster.leader() in (None, holder):
            assert time.monotonic() < deadline, "the standby did not take over"
            time.sleep(0.2)
    finally:
        leader.start()


def test_the_leader_killed_mid_burst_the_standby_takes_over(cluster: RealStack) -> None:
    _dra_burst(cluster, "leader-crash")
    wait_for(
        cluster,
        lambda: any(not is_gated(p) for p in pods(cluster, E2E_NS)),
        message="the controller placed no pod",
    )
    kill_the_leader(cluster)
    wait_running(cluster, E2E_NS, BURST)
    cluster.wait_ready()


def _classic_and_dra_burst(cluster: RealStack, name: str) -> None:
    apply(cluster, [claim_template(name, profile="1g.5gb", namespace=E2E_NS)])
    objects = [
        classic_pod(f"{name}-c{i}", profile="1g.5gb", namespace=E2E_NS) for i in range(CLASSIC)
    ]
    objects += [dra_pod(f"{name}-d{i}", template=name, namespace=E2E_NS) for i in range(DRA)]
    apply(cluster, objects)


def _settled(cluster: RealStack) -> list[str] | None:
    """Every pod Running or Failed (none still on its way): their phases, else None."""
    found = pods(cluster, E2E_NS)
    if len(found) == CLASSIC + DRA and all(phase(p) in ("Running", "Failed") for p in found):
        return [phase(p) for p in found]
    return None


def _check_classic_burst(cluster: RealStack, gated_at_kill: set[str]) -> None:
    wait_for(cluster, lambda: _settled(cluster), timeout=60, message="pods did not settle")
    failed = {p["metadata"]["name"]: p["status"].get("reason") for p in pods(cluster, E2E_NS)
              if phase(p) == "Failed"}  # fmt: skip
    assert not {n for n in failed if "-d" in n}, f"DRA pods failed: {failed}"
    waiting_failed = sorted(set(failed) & gated_at_kill)
    assert not waiting_failed, (
        f"pods still waiting (gated) when the plugin died ended Failed: {waiting_failed}; "
        f"all failed: {failed}"
    )
    print(f"classic burst: {len(failed)} of {CLASSIC} classic pods failed (already dispatched)")


def test_a_plugin_killed_and_restarted_during_a_classic_burst_fails_no_waiting_pod(
    classic: RealStack,
) -> None:
    """kill -9 of node-0's plugin while 20 classic and 8 DRA pods are created, back 3 s later: a
    pod the kubelet rejects while the shim is gone fails for good, so the controller must stop
    sending classic pods to that node (it backs off on the first rejection, and the Node's
    allocatable drops to 0) — no pod still waiting for a placement may end Failed."""
    _classic_and_dra_burst(classic, "restart")
    wait_for(classic, lambda: _bound_to(classic, "node-0"), message="no pod bound to node-0")
    classic.plugins["node-0"].kill()
    gated = {p["metadata"]["name"] for p in pods(classic, E2E_NS) if is_gated(p)}
    time.sleep(3)
    classic.plugins["node-0"].start()
    _check_classic_burst(classic, gated)


def test_a_plugin_down_for_five_seconds_while_a_classic_burst_is_created(
    classic: RealStack,
) -> None:
    """The plugin stops (as in a DaemonSet rolling update) before the pods are created and is
    back 5 s later: pods created meanwhile wait, none of them fails."""
    classic.plugins["node-0"].stop()
    started = time.monotonic()
    _classic_and_dra_burst(classic, "down")
    gated = {p["metadata"]["name"] for p in pods(classic, E2E_NS)}
    time.sleep(max(0.0, 5 - (time.monotonic() - started)))
    classic.plugins["node-0"].start()
    _check_classic_burst(classic, gated)
    wait_for(classic, lambda: all(running(get_pod(classic, E2E_NS, p)) for p in gated
                                  if phase(get_pod(classic, E2E_NS, p)) != "Failed"))  # fmt: skip
    assert names.DRIVER_NAME
