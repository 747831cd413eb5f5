"""Runs last (file order): the kubelets' error lines about our plugins over the whole session.

Errors that the scenarios cause on purpose (a plugin or kubelet killed mid-burst: refused
connections, a prepare or an Allocate that failed while the plugin was gone, a pod rejected at
admission) are expected; any other error line that names our driver or resources is a finding.
"""

from __future__ import annotations

import re

from api import names
from localcluster.realstack import RealStack

OURS = re.compile(
    rf"{re.escape(names.DRIVER_NAME)}|{re.escape(names.CLASSIC_RESOURCE_PREFIX)}|instaslice\.dev"
)
CAUSED_BY_THE_KILL_SCENARIOS = re.compile(
    r"connection refused|Error while dialing|ListAndWatch ended unexpectedly|"
    r"UnexpectedAdmissionError|Failed to admit pod|code = Unavailable|context deadline exceeded|"
    r"error reading from server: EOF|transport is closing|no such file or directory|"
    r"is not registered|PreStartContainer rpc failed|"
    # a restarted plugin re-registers: the kubelet cancels the old connection's health stream
    # itself ("Connection changed", then this line half a second later; seen once in 4 runs)
    r"Error receiving from WatchResources stream.*code = Canceled desc = context canceled"
)
KUBELET_OWN = re.compile(r"status_manager\.go|remote_runtime\.go|pod_container_deletor")
"""The kubelet's own pod status patches and runtime look-ups (they quote pods' resources)."""


def test_the_kubelets_logged_no_error_about_our_plugins(real_stack: RealStack) -> None:
    findings: list[str] = []
    expected = 0
    for node, lines in real_stack.kubelet_errors().items():
        for line in lines:
            if not OURS.search(line) or KUBELET_OWN.search(line):
                continue
            if CAUSED_BY_THE_KILL_SCENARIOS.search(line):
                expected += 1
                continue
            findings.append(f"{node}: {line}")
    print(f"{expected} error lines from the kill scenarios")
    assert not findings, "\n".join(findings[:30])
