"""What the benchmarks against an API server share: GPU nodes with our ResourceSlices, overlaps,
percentiles, per-process CPU and memory.

``bench real`` (kube-apiserver, Nodes kept Ready here), ``bench controller`` (the local API server)
and ``bench modes`` (kube-apiserver, nodes from ``fake-node.sh``) publish the same nodes — 8
A100-40GB each, the slices our kubelet plugin would publish — count overlapping allocations the
same way and summarise latencies with the same percentile. One copy here, so a figure means the
same thing in each.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from api import wire
from api.names import DRIVER_NAME
from driver.cluster.port import (
    LEASES,
    NODES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    ClusterApi,
    JsonObject,
    PatchType,
    name_of,
)
from driver.errors import ClusterError
from driver.mig.catalog import CATALOG
from driver.resourceslices import GpuInventory, build_pool, complete_pools, parse_devices

MODEL: Final = "A100-40GB"
PROFILE: Final = "1g.5gb"
GPUS_PER_NODE: Final = 8
LEASE_RENEW_S: Final = 10.0
RENEW_THREADS: Final = 16
SCHEDULABLE_TIMEOUT_S: Final = 120.0
NODE_RESOURCES: Final = {"cpu": "128", "memory": "1Ti", "pods": "110", "ephemeral-storage": "1Ti"}


# -- numbers ---------------------------------------------------------------------------------


def percentile(values: Iterable[float], q: float) -> float:
    """The value at rank ``q`` (0..1) of ``values``, nearest rank (no interpolation)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency_figures(values: list[float], *, prefix: str, digits: int = 3) -> dict[str, Any]:
    """``{prefix}_p50_s``, ``_p99_s`` and ``_max_s`` of ``values`` (seconds); None when empty."""
    if not values:
        return {f"{prefix}_p50_s": None, f"{prefix}_p99_s": None, f"{prefix}_max_s": None}
    return {
        f"{prefix}_p50_s": round(statistics.median(values), digits),
        f"{prefix}_p99_s": round(percentile(values, 0.99), digits),
        f"{prefix}_max_s": round(max(values), digits),
    }


# -- processes -------------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _cpu_ticks(pid: int | None, *fields: int) -> float | None:
    """The sum of these ``/proc/PID/stat`` time fields (after the command), in seconds."""
    stat = _stat(pid) if pid else None
    if stat is None:
        return None
    return sum(int(stat[f]) for f in fields) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds ``pid`` has used so far (Linux ``/proc``; None when unknown)."""
    return _cpu_ticks(pid, 11, 12)


def system_cpu_seconds(pid: int | None) -> float | None:
    """The system (kernel) part of :func:`cpu_seconds`: for a process that mostly talks over
    sockets, the kernel's network stack and TLS record syscalls show here, not in Python."""
    return _cpu_ticks(pid, 12)


def machine_busy_s() -> float | None:
    """CPU seconds this machine has been busy so far, all CPUs (``/proc/stat``; not idle or
    iowait): with every process's own figure, what the rest of the machine took meanwhile."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    ticks = [int(f) for f in fields]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def runqueue_wait_s(pid: int | None) -> float | None:
    """Seconds the threads of ``pid`` now alive have spent runnable but waiting for a CPU
    (``/proc/PID/task/*/schedstat``, second field): on a crowded machine, the time a process
    would have worked had it been given a CPU. Threads that have ended are not counted."""
    if not pid:
        return None
    total = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def context_switches(pid: int | None) -> tuple[int, int] | None:
    """(voluntary, involuntary) context switches of the threads of ``pid`` now alive
    (``/proc/PID/task/*/status``): a thread that blocks — on I/O, a lock, the interpreter lock —
    switches voluntarily; one preempted by the kernel, involuntarily. Ended threads are not
    counted."""
    if not pid:
        return None
    counts = [0, 0]
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            lines = (task / "status").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            name, _, value = line.partition(":")
            if name == "voluntary_ctxt_switches":
                counts[0] += int(value)
            elif name == "nonvoluntary_ctxt_switches":
                counts[1] += int(value)
    return counts[0], counts[1]


def peak_rss_mib(pid: int | None) -> float | None:
    """The peak resident memory of ``pid`` (``VmHWM``) in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


# -- nodes and slices ------------------------------------------------------------------------


def gpus_of(node: str, *, model: str = MODEL, count: int = GPUS_PER_NODE) -> list[GpuInventory]:
    spec = CATALOG[model]
    return [
        GpuInventory(
            index=g,
            uuid=f"GPU-{node}-{g}",
            product_name=spec.product_name,
            memory_slices=spec.memory_slices,
            profiles=spec.profiles,
        )
        for g in range(count)
    ]


def node_owner(name: str, uid: str) -> wire.OwnerReference:
    return {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}


def publish_slices(api: ClusterApi, *, node: str, uid: str) -> int:
    """Create the ResourceSlices our kubelet plugin publishes for ``node`` (owned by the Node);
    returns how many."""
    slices = build_pool(node=node, gpus=gpus_of(node), generation=1, owner=node_owner(node, uid))
    for slice_obj in slices:
        api.create(RESOURCE_SLICES, slice_obj)
    return len(slices)


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _ready_status(name: str) -> JsonObject:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [
        {"type": kind, "status": "False", "reason": reason, "message": "bench"}
        for kind, reason in (
            ("MemoryPressure", "KubeletHasSufficientMemory"),
            ("DiskPressure", "KubeletHasNoDiskPressure"),
            ("PIDPressure", "KubeletHasSufficientPID"),
        )
    ]
    conditions.append(
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench"}
    )
    for condition in conditions:
        condition.update(lastHeartbeatTime=now, lastTransitionTime=now)
    return {
        "capacity": NODE_RESOURCES,
        "allocatable": NODE_RESOURCES,
        "conditions": conditions,
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "nodeInfo": {
            "machineID": name, "systemUUID": name, "bootID": "bench", "kernelVersion": "bench",
            "osImage": "bench", "containerRuntimeVersion": "fake://0", "kubeletVersion": "bench",
            "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
        },
    }  # fmt: skip


def create_node(api: ClusterApi, name: str, *, ready: bool) -> str:
    """Create the Node ``name`` (labels as a kubelet sets them) and return its uid. With
    ``ready``, its status says Ready (as kube-apiserver's node lifecycle expects: conditions,
    capacity, a kube-node-lease Lease, which ``ReadyNodes`` then renews); without, only
    ``allocatable`` is set (enough for the local API server, which has no node lifecycle)."""
    labels = {"kubernetes.io/hostname": name}
    if ready:
        labels.update(
            {
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/fake": "true",
            }
        )
    node: JsonObject = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
    }
    if not ready:
        node["status"] = {"allocatable": {"cpu": "128", "memory": "1Ti", "pods": "110"}}
    uid = str(api.create(NODES, node)["metadata"]["uid"])
    if not ready:
        return uid
    api.patch(
        NODES,
        name=name,
        patch={"status": _ready_status(name)},
        patch_type=PatchType.MERGE,
        subresource="status",
    )
    api.create(
        LEASES,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name,
                "namespace": "kube-node-lease",
                "ownerReferences": [node_owner(name, uid)],
            },
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": _now_micro()},
        },
        namespace="kube-node-lease",
    )
    return uid


def publish_nodes(api: ClusterApi, names: list[str], *, ready: bool, threads: int = 8) -> None:
    """Create each Node of ``names`` and its slices, ``threads`` nodes at a time."""

    def one(name: str) -> None:
        publish_slices(api, node=name, uid=create_node(api, name, ready=ready))

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, names))


class ReadyNodes:
    """Nodes published Ready with our slices, kept Ready by renewing their Leases from a thread
    (what a kubelet does; there is none: pods are bound, never run)."""

    def __init__(self, api: ClusterApi, count: int, *, prefix: str = "gpu-node") -> None:
        self._api = api
        self.names = [f"{prefix}-{i:03d}" for i in range(count)]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def create(self) -> None:
        publish_nodes(self._api, self.names, ready=True)
        self._thread = threading.Thread(target=self._renew, name="bench-leases", daemon=True)
        self._thread.start()

    def wait_schedulable(self, timeout: float = SCHEDULABLE_TIMEOUT_S) -> None:
        """Return once no node of ours carries a NoSchedule or NoExecute taint. kube-apiserver
        taints a new Node ``node.kubernetes.io/not-ready`` and kube-controller-manager lifts it
        only after seeing the node Ready; a burst started before that meets nodes no pod may
        use, and every path would pay for it differently (a round's first pods wait, ours with a
        Placement condition and event each)."""
        names = set(self.names)
        deadline = time.monotonic() + timeout
        while True:
            nodes = self._api.list_objects(NODES, label_selector="node.kubernetes.io/fake=true")
            tainted = sorted(
                name_of(node)
                for node in nodes.items
                if name_of(node) in names
                and any(
                    taint.get("effect") in ("NoSchedule", "NoExecute")
                    for taint in (node.get("spec") or {}).get("taints") or []
                )
            )
            if not tainted:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(tainted)} node(s) still tainted after {timeout:.0f}s "
                    f"(first: {tainted[0]}); is kube-controller-manager running?"
                )
            time.sleep(0.5)

    def _renew(self) -> None:
        # In parallel: one at a time, 200 renewals through a saturated kube-apiserver took longer
        # than the Lease's 40 s, kube-controller-manager tainted every node unreachable and
        # kube-scheduler bound nothing more (the first 10,000-pod run).
        with ThreadPoolExecutor(RENEW_THREADS, thread_name_prefix="bench-lease") as pool:
            while not self._stop.wait(LEASE_RENEW_S):
                list(pool.map(self._renew_one, self.names))

    def _renew_one(self, name: str) -> None:
        if self._stop.is_set():
            return
        try:
            self._api.patch(
                LEASES,
                name=name,
                namespace="kube-node-lease",
                patch={"spec": {"renewTime": _now_micro()}},
                patch_type=PatchType.MERGE,
            )
        except ClusterError as exc:
            print(f"bench: lease of {name} not renewed: {exc}", file=sys.stderr)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


def overlaps(api: ClusterApi, *, namespace: str) -> tuple[int, int]:
    """(devices allocated to the claims of ``namespace``, allocations sharing a memory slice of
    one GPU with an earlier one — must be 0)."""
    devices = {
        (d.node, d.name): d
        for pool in complete_pools(
            api.list_objects(RESOURCE_SLICES, field_selector=f"spec.driver={DRIVER_NAME}").items
        ).values()
        for d in parse_devices(pool)
    }
    used: dict[tuple[str, int], int] = {}
    allocated = found = 0
    for claim in api.list_objects(RESOURCE_CLAIMS, namespace=namespace).items:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            device = devices[(result["pool"], result["device"])]
            key = (device.node, device.gpu_index)
            allocated += 1
            if used.get(key, 0) & device.placement.mask:
                found += 1
            used[key] = used.get(key, 0) | device.placement.mask
    return allocated, found
