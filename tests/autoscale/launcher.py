"""Nodes of the test cloud provider on the real stack: a real kubelet and our plugin per node.

A node starts as a cloud instance would come up (``RealStack.add_node``): its kubelet registers the
Node with the group's labels and ``--provider-id``, kube-controller-manager lifts the
``node.kubernetes.io/not-ready`` taint once it is Ready, and our kubelet plugin — with the group's
GPUs emulated, in whichever mode the stack's plugins run — publishes its ResourceSlices. It stops as
cluster-autoscaler's deletion does it (``RealStack.remove_node``): plugin and kubelet stopped, the
Node deleted.

What a removed node left behind is what must never be: a MIG instance, a CDI spec or a checkpoint
entry on it means a slice was not released before its node went (cluster-autoscaler drains a node
before deleting it, so every pod's claims should have been unprepared by then). Each removal is
kept with those leftovers (:class:`Removal`) for the scenarios to check and report.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from localcluster.realstack import RealStack
from tests.autoscale.groups import NodeGroupSpec
from tests.e2e.helpers import node_leftovers

logger = logging.getLogger(__name__)


KUBELET_MAX_PODS = 110
"""The kubelet's default ``maxPods``, which run-node.sh keeps."""


def kubelet_capacity(meminfo: Path = Path("/proc/meminfo")) -> dict[str, str]:
    """CPU, memory and pods as a kubelet on this machine reports them in its Node's capacity:
    the host's CPUs and memory (every node of the real stack shares them)."""
    memory_kib = 0
    for line in meminfo.read_text(encoding="utf-8").splitlines():
        if line.startswith("MemTotal:"):
            memory_kib = int(line.split()[1])
    return {
        "cpu": str(os.cpu_count() or 1),
        "memory": f"{memory_kib}Ki",
        "pods": str(KUBELET_MAX_PODS),
    }


@dataclass(frozen=True, slots=True)
class Removal:
    """One node the provider removed, and what was left on it then (empty: nothing leaked)."""

    node: str
    at: float
    leftovers: tuple[str, ...]


class RealStackLauncher:
    """``NodeLauncher`` on a running :class:`RealStack`."""

    def __init__(self, stack: RealStack, *, timeout: float = 180.0) -> None:
        self.stack = stack
        self._timeout = timeout
        self._lock = threading.Lock()
        self._removals: list[Removal] = []

    def start_node(self, *, node: str, group: NodeGroupSpec, provider_id: str) -> None:
        logger.info("starting node %s of group %s (%s)", node, group.id, group.gpus)
        self.stack.add_node(
            node,
            gpus=group.gpus,
            labels=group.labels,
            provider_id=provider_id,
            timeout=self._timeout,
        )

    def stop_node(self, *, node: str) -> None:
        logger.info("removing node %s", node)
        self.stack.remove_node(node)
        removal = Removal(
            node=node, at=time.monotonic(), leftovers=tuple(node_leftovers(self.stack, [node]))
        )
        if removal.leftovers:
            logger.error("node %s left behind: %s", node, list(removal.leftovers))
        with self._lock:
            self._removals.append(removal)

    def removals(self) -> list[Removal]:
        with self._lock:
            return list(self._removals)
