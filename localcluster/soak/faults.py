"""The faults: a seeded plan (``plan``), and each fault done to the stack and logged (``FaultRunner``).

The plan is a sequence of rounds; each round has every kind once, in a seeded order, each with its
target and the pause before it, so a soak long enough for one round injects every kind. Faults run
one at a time: after each, the stack must be whole again (``FaultRunner.whole``: every plugin
running and published, every Node Ready, a leader, the webhook serving) within ``RECOVERY_S``; the
time that took is part of the fault's record. Node faults never target the last node: its plugin
runs the whole soak, so there is always one plugin whose memory is judged over the full length.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from api import names
from driver.cluster.port import PODS, RESOURCE_CLAIMS, RESOURCE_SLICES
from driver.cluster.views import ClaimView
from driver.errors import DriverError
from localcluster.soak.metrics import informer_lists
from localcluster.soak.stack import SoakStack
from localcluster.soak.timeline import Timeline
from localcluster.soak.workloads import NAMESPACE

log = logging.getLogger(__name__)

KINDS: Final = (
    "kill-leader",
    "kill-plugin",
    "kill-webhook",
    "restart-kubelet",
    "restart-apiserver",
    "restart-etcd",
    "etcd-compaction",
    "node-not-ready",
    "delete-node",
    "reboot-node",
    "recreate-deviceclass",
)
NODE_KINDS: Final = frozenset(
    {"kill-plugin", "restart-kubelet", "node-not-ready", "delete-node", "reboot-node"}
)
RECOVERY_S: Final = 240.0
CRASH_RESTART_S: Final = 3.0
"""How long a killed daemon stays down: a kubelet restarts a crashed container after ~this."""
DEVICE_CLASS_PROFILE: Final = "1g.5gb"


@dataclass(frozen=True, slots=True)
class PlannedFault:
    kind: str
    target: str
    pause_s: float
    """Seconds to wait before it, after the previous fault's recovery."""


def plan(
    *, seed: int, nodes: Sequence[str], rounds: int, kinds: Sequence[str] = KINDS
) -> list[PlannedFault]:
    """``rounds`` rounds of each of ``kinds`` once, seeded; node faults target all nodes but the
    last."""
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(KINDS)}")
    rng = random.Random(seed)  # noqa: S311 - a reproducible plan, not security
    targets = list(nodes[:-1]) or list(nodes)
    planned = []
    for _ in range(rounds):
        order = list(kinds)
        rng.shuffle(order)
        for kind in order:
            target = rng.choice(targets) if kind in NODE_KINDS else ""
            planned.append(PlannedFault(kind=kind, target=target, pause_s=rng.uniform(15, 35)))
    return planned


@dataclass(slots=True)
class FaultRecord:
    kind: str
    target: str
    started_s: float
    ended_s: float = 0.0
    recovered_s: float | None = None
    """Seconds from the fault's end until the stack was whole again; None: it was not."""
    details: dict[str, Any] = field(default_factory=dict)


class FaultRunner:
    def __init__(self, *, stack: SoakStack, timeline: Timeline) -> None:
        self._stack = stack
        self._timeline = timeline
        self._down: set[str] = set()
        self._lock = threading.Lock()
        self.records: list[FaultRecord] = []

    def expected_down(self) -> set[str]:
        """Roles a fault has ended on purpose and not yet restarted."""
        with self._lock:
            return set(self._down)

    def _mark(self, role: str, *, down: bool) -> None:
        with self._lock:
            (self._down.add if down else self._down.discard)(role)

    def run(self, fault: PlannedFault) -> FaultRecord:
        record = FaultRecord(kind=fault.kind, target=fault.target, started_s=self._timeline.now())
        self._timeline.note("fault", f"{fault.kind} {fault.target}".strip())
        action: Callable[[FaultRecord], None] = getattr(self, "_" + fault.kind.replace("-", "_"))
        try:
            action(record)
        except Exception as exc:  # recorded: the soak goes on and reports it
            record.details["error"] = repr(exc)
            self._timeline.note("fault", f"{fault.kind} did not complete: {exc!r}")
        record.ended_s = self._timeline.now()
        record.recovered_s = self._recover()
        self.records.append(record)
        self._timeline.note(
            "fault",
            f"{fault.kind} {fault.target} done; whole again after "
            f"{'never' if record.recovered_s is None else f'{record.recovered_s:.0f}s'}",
            **record.details,
        )
        return record

    # --- being whole again -----------------------------------------------------------------------

    def whole(self) -> list[str]:
        """What is missing for the stack to be whole (empty: whole)."""
        stack = self._stack
        missing = [f"{role} down" for role, p in self._processes().items() if not p.running()]
        try:
            missing += [f"{n} not Ready" for n in stack.node_names if not stack.node_ready(n)]
            published = stack.published_nodes()
            missing += [f"{n} not published" for n in stack.node_names if n not in published]
            if stack.leader_index() is None:
                missing.append("no leader")
        except DriverError as exc:
            missing.append(f"API: {exc}")
        if not stack.webhook_serving():
            missing.append("webhook not serving")
        return missing

    def _recover(self) -> float | None:
        started = time.monotonic()
        while time.monotonic() - started < RECOVERY_S:
            if not self.whole():
                return round(time.monotonic() - started, 1)
            time.sleep(1.0)
        self._timeline.note("fault", f"not whole after {RECOVERY_S:.0f}s: {self.whole()}")
        return None

    def _processes(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            f"controller-{i}": p for i, p in enumerate(self._stack.controllers)
        }
        found.update({f"plugin/{n}": p for n, p in self._stack.plugins.items()})
        return found

    def _wait(self, predicate: Callable[[], bool], *, timeout: float, what: str) -> float:
        started = time.monotonic()
        while not predicate():
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"{what} not seen within {timeout:.0f}s")
            time.sleep(0.5)
        return round(time.monotonic() - started, 1)

    def _informer_lists(self) -> dict[str, float]:
        lists: dict[str, float] = {}
        for daemon in self._stack.running_daemons():
            text = self._stack.metrics_text(daemon)
            for (name, informer), value in informer_lists(text).items():
                lists[f"{daemon.role}/{name}/{informer}"] = value
        return lists

    # --- the faults -----------------------------------------------------------------------------

    def _kill_leader(self, record: FaultRecord) -> None:
        index = self._wait_leader()
        holder = self._stack.leader()
        role = f"controller-{index}"
        record.target = role
        self._mark(role, down=True)
        self._stack.controllers[index].kill()
        try:
            record.details["new_leader_after_s"] = self._wait(
                lambda: self._stack.leader() not in (None, holder), timeout=60, what="a new leader"
            )
        finally:
            time.sleep(CRASH_RESTART_S)
            self._stack.controllers[index].start()
            self._mark(role, down=False)

    def _wait_leader(self) -> int:
        self._wait(lambda: self._stack.leader_index() is not None, timeout=60, what="a leader")
        index = self._stack.leader_index()
        assert index is not None
        return index

    def _kill_plugin(self, record: FaultRecord) -> None:
        role = f"plugin/{record.target}"
        self._mark(role, down=True)
        self._stack.plugins[record.target].kill()
        time.sleep(CRASH_RESTART_S)
        self._stack.plugins[record.target].start()
        self._mark(role, down=False)

    def _kill_webhook(self, record: FaultRecord) -> None:
        pid = self._stack.webhook_child(0)
        if pid is None:
            raise TimeoutError("controller-0 has no webhook process")
        record.target = f"webhook of controller-0 (pid {pid})"
        os.kill(pid, signal.SIGKILL)
        record.details["new_webhook_after_s"] = self._wait(
            lambda: (
                self._stack.webhook_child(0) not in (None, pid) and self._stack.webhook_serving()
            ),
            timeout=90,
            what="a new webhook process serving",
        )

    def _restart_kubelet(self, record: FaultRecord) -> None:
        self._stack.restart_kubelet(record.target)

    def _restart_apiserver(self, record: FaultRecord) -> None:
        self._stack.restart_control_plane_member("kube-apiserver", down_s=5.0, hard=False)

    def _restart_etcd(self, record: FaultRecord) -> None:
        self._stack.restart_control_plane_member("etcd", down_s=5.0, hard=True)

    def _etcd_compaction(self, record: FaultRecord) -> None:
        """etcd's history compacted to now, then kube-apiserver restarted (its watch cache starts
        at the compacted revision): every watch resumes from a version that no longer exists."""
        before = self._informer_lists()
        record.details["compacted_to"] = self._stack.compact_etcd()
        self._stack.restart_control_plane_member("kube-apiserver", down_s=2.0, hard=True)
        time.sleep(20)  # the informers reconnect (their backoff) and relist
        after = self._informer_lists()
        record.details["informers_relisted"] = sorted(
            k for k, v in after.items() if v > before.get(k, v)
        )

    def _node_not_ready(self, record: FaultRecord) -> None:
        node = record.target
        self._stack.stop_kubelet(node)
        record.details["not_ready_after_s"] = self._wait(
            lambda: self._stack.node_ready(node) is False, timeout=120, what=f"{node} NotReady"
        )
        record.details["evicted_after_s"] = self._wait(
            lambda: not self._live_pods(node), timeout=120, what=f"the pods of {node} evicted"
        )
        self._stack.start_node(node)

    def _live_pods(self, node: str) -> list[str]:
        return [
            p["metadata"]["name"]
            for p in self._stack.api.list_objects(PODS, namespace=NAMESPACE).items
            if (p.get("spec") or {}).get("nodeName") == node
            and not p["metadata"].get("deletionTimestamp")
        ]

    def _held_on(self, node: str) -> dict[str, int]:
        """What the node holds now: pods, claims allocated there, MIG instances, ResourceSlices."""
        api = self._stack.api
        claims = [
            c for c in api.list_objects(RESOURCE_CLAIMS).items
            if any(r.pool == node for r in ClaimView.of(c).results_of(names.DRIVER_NAME))
        ]  # fmt: skip
        return {
            "pods": len(
                [
                    p
                    for p in api.list_objects(PODS, namespace=NAMESPACE).items
                    if (p.get("spec") or {}).get("nodeName") == node
                ]
            ),
            "claims": len(claims),
            "instances": len(self._stack.mig_instances(node)),
            "slices": len(
                api.list_objects(RESOURCE_SLICES, field_selector=f"spec.nodeName={node}").items
            ),
        }

    def _unowned_instances(self, node: str) -> list[str]:
        """MIG instances on ``node`` that no allocated claim holds."""
        taken = {
            (t.placement.start, t.profile, g.index)
            for g in self._stack.view().gpus
            if g.node == node
            for t in g.taken
        }
        return [
            f"{i.profile}@{i.placement.start} gpu{i.gpu_index}"
            for i in self._stack.mig_instances(node)
            if (i.placement.start, i.profile, i.gpu_index) not in taken
        ]

    def _delete_node(self, record: FaultRecord) -> None:
        """The Node object deleted while its kubelet, plugin and pods run and hold slices (an
        autoscaler or an operator removing it). The pod garbage collector deletes the Node's pods,
        the plugin's DaemonSet pod among them (its token, bound to the Node, no longer works);
        then the kubelet registers the Node again and a new plugin pod starts. What the node held
        is recorded at each step."""
        node = record.target
        role = f"plugin/{node}"
        record.details["before"] = self._held_on(node)
        self._stack.delete_node_object(node)
        try:
            record.details["pods_gone_after_s"] = self._wait(
                lambda: not self._held_on(node)["pods"] and not self._held_on(node)["claims"],
                timeout=150,
                what=f"{node}'s pods and claims gone",
            )
        finally:
            record.details["node_gone"] = self._held_on(node)
            self._mark(role, down=True)
            self._stack.plugins[node].stop()  # its pod was deleted with the Node
            self._stack.restart_kubelet(node)  # the kubelet registers the Node again
            self._stack.replace_plugin(node)  # the DaemonSet's new pod, with a new token
            self._mark(role, down=False)
        record.details["released_after_s"] = self._wait(
            lambda: not self._unowned_instances(node),
            timeout=90,
            what=f"{node}'s slices of deleted claims released",
        )
        record.details["node_back"] = self._held_on(node)

    def _reboot_node(self, record: FaultRecord) -> None:
        node = record.target
        role = f"plugin/{node}"
        self._stack.stop_kubelet(node)
        self._mark(role, down=True)
        self._stack.plugins[node].kill()
        record.details["lost"] = len(self._stack.wipe_node(node))
        time.sleep(5)
        self._stack.start_node(node)
        self._stack.plugins[node].start()
        self._mark(role, down=False)

    def _recreate_deviceclass(self, record: FaultRecord) -> None:
        name = self._stack.our_device_class(DEVICE_CLASS_PROFILE)
        record.target = name
        self._stack.delete_device_class(name)
        time.sleep(10)
        self._stack.create_device_class(name)
