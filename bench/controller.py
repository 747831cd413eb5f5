"""The controller under a burst: pods placed and ungated per second, time from creation to ungate.

Three processes, as in a cluster: the local API server, ``instaslice-controller`` (no leader
election, webhook off) and this one, which plays the kubelet plugins (publishes 100 nodes x 8
A100-40GB as ResourceSlices), kube-controller-manager (one claim per pod, created with it) and the
users (1,000 pods asking one 1g.5gb slice each, created at once from 16 threads, each with the
scheduling gate the webhook would add). A pod informer here notes when each pod's gate goes.

Figures: ``pods_per_s`` = pods / (last ungate - first creation); latency = ungate seen here - pod
create call returned (p50/p99/max); ``overlaps`` must be 0 (no placement used twice) and
``unplaced`` 0. Targets: >= 100 pods/s, p99 <= 2 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from api.names import DEVICE_CLASS_ANY, DRIVER_NAME, SCHEDULING_GATE, profile_device_class
from bench.realnodes import (
    GPUS_PER_NODE,
    MODEL,
    PROFILE,
    latency_figures,
    overlaps,
    percentile,
    publish_nodes,
)
from driver.cluster.informer import Informer, ListWatch
from driver.cluster.kube import KubeClusterApi, configuration_for_url
from driver.cluster.port import (
    DEVICE_CLASSES,
    PODS,
    RESOURCE_CLAIMS,
    JsonObject,
    gate_names,
    name_of,
)
from driver.cluster.throttle import ClientSettings
from driver.mig.catalog import CATALOG
from localcluster.daemonstack import free_port

# bench.modes imports these from here
__all__ = ["GPUS_PER_NODE", "MODEL", "PROFILE", "_overlaps", "_percentile", "run", "summary"]

FULL = {"nodes": 100, "pods": 1000, "workers": 16}
QUICK = {"nodes": 4, "pods": 40, "workers": 4}
NS = "default"
ROOT = Path(__file__).resolve().parent.parent


def _percentile(values: list[float], q: float) -> float:
    """Kept for ``bench.modes``, which imports it from here."""
    return percentile(values, q)


class _Processes:
    def __init__(self) -> None:
        self.items: list[subprocess.Popen[str]] = []

    def spawn(self, args: list[str], *, stdout: Any = subprocess.DEVNULL) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, *args], stdout=stdout, stderr=subprocess.DEVNULL, text=True, cwd=ROOT
        )
        self.items.append(process)
        return process

    def cpu_seconds(self) -> list[float | None]:
        """User + system CPU each process has used so far (Linux ``/proc``; None elsewhere)."""
        ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        found: list[float | None] = []
        for process in self.items:
            try:
                fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
                found.append(round((int(fields[11]) + int(fields[12])) / ticks, 2))
            except (OSError, IndexError, ValueError):
                found.append(None)
        return found

    def close(self) -> None:
        for process in self.items:
            process.terminate()
        for process in self.items:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()


def _start_apiserver(processes: _Processes, root: Path) -> str:
    server = processes.spawn(
        ["-m", "localcluster", "--kubeconfig", str(root / "kubeconfig")], stdout=subprocess.PIPE
    )
    while True:
        line = server.stdout.readline() if server.stdout else ""
        if not line:
            raise RuntimeError("the local API server did not start")
        if line.startswith("serving on "):
            return line.removeprefix("serving on ").strip()


def _publish(api: KubeClusterApi, nodes: int) -> None:
    model = CATALOG[MODEL]
    driver = f'device.driver == "{DRIVER_NAME}"'
    classes = {DEVICE_CLASS_ANY: driver}
    for profile in model.profile_names:
        expression = f'{driver} && device.attributes["{DRIVER_NAME}"].profile == "{profile}"'
        classes[profile_device_class(profile)] = expression
    for name, expression in classes.items():
        api.create(
            DEVICE_CLASSES,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": expression}}]},
            },
        )

    publish_nodes(api, [f"node-{i:03d}" for i in range(nodes)], ready=False)


def _start_controller(processes: _Processes, url: str, workers: int) -> None:
    port = free_port()
    processes.spawn(
        ["-m", "controller", "--kube-api-url", url, "--no-leader-elect", "--webhook-port", "0",
         "--metrics-address", "", "--healthz-address", f"127.0.0.1:{port}",
         "--workers", str(workers), "--log-level", "WARNING", "--kube-api-qps", "0"]
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("the controller did not become ready")


def _overlaps(api: KubeClusterApi) -> tuple[int, int]:
    """(devices allocated, allocations sharing a memory slice of one GPU); ``bench.modes`` uses
    it too."""
    return overlaps(api, namespace=NS)


def _burst(api: KubeClusterApi, url: str, pods: int) -> dict[str, Any]:
    created: dict[str, float] = {}
    ungated: dict[str, float] = {}
    lock = threading.Lock()
    all_done = threading.Event()

    def seen(pod: JsonObject) -> None:
        name = name_of(pod)
        if SCHEDULING_GATE in gate_names(pod):
            return
        with lock:
            if name in created and name not in ungated:
                ungated[name] = time.monotonic()
                if len(ungated) == pods:
                    all_done.set()

    informer = Informer(source=ListWatch(api, PODS, namespace=NS), name="bench-pods")
    informer.add_handler(on_add=seen, on_update=lambda old, new: seen(new))
    informer.start()
    informer.wait_for_sync(timeout=30)

    def create(i: int) -> None:
        name = f"pod-{i:04d}"
        claim = f"{name}-gpu-{i:05x}"
        api.create(
            RESOURCE_CLAIMS,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": claim, "namespace": NS},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "mig",
                                "exactly": {"deviceClassName": profile_device_class(PROFILE)},
                            }
                        ]
                    }
                },
            },
            namespace=NS,
        )
        pod: JsonObject = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "schedulingGates": [{"name": SCHEDULING_GATE}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox:1",
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
            },
        }
        started = time.monotonic()
        with lock:
            created[name] = started
        api.create(PODS, pod, namespace=NS)
        with lock:
            created[name] = time.monotonic()
            if name in ungated:  # seen before our create call returned
                ungated[name] = max(ungated[name], created[name])

    first = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, range(pods)))
    created_all = time.monotonic()
    finished = all_done.wait(timeout=300)
    informer.stop()
    with lock:
        latencies = [ungated[n] - created[n] for n in ungated]
        last = max(ungated.values(), default=first)
    return {
        "finished": finished,
        "creation_s": round(created_all - first, 3),
        "wall_s": round(last - first, 3),
        "pods_per_s": round(len(ungated) / (last - first), 1) if last > first else 0.0,
        **latency_figures(latencies, prefix="latency"),
        "ungated": len(ungated),
    }


def run(*, quick: bool) -> dict[str, Any]:
    size = QUICK if quick else FULL
    processes = _Processes()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-controller-") as tmp:
            url = _start_apiserver(processes, Path(tmp))
            api = KubeClusterApi(
                configuration=configuration_for_url(url),
                settings=ClientSettings(qps=0, connection_pool_maxsize=32),
            )
            with api:
                _publish(api, size["nodes"])
                _start_controller(processes, url, size["workers"])
                before = processes.cpu_seconds()
                figures = _burst(api, url, size["pods"])
                after = processes.cpu_seconds()
                allocated, overlaps = _overlaps(api)
                cpu = [
                    None if a is None or b is None else round(a - b, 2)
                    for a, b in zip(after, before, strict=True)
                ]
    finally:
        processes.close()
    return {
        "benchmark": "controller",
        "quick": quick,
        "nodes": size["nodes"],
        "gpus_per_node": GPUS_PER_NODE,
        "model": MODEL,
        "profile": PROFILE,
        "pods": size["pods"],
        "controller_workers": size["workers"],
        **figures,
        "apiserver_cpu_s": cpu[0],
        "controller_cpu_s": cpu[1],
        "allocated": allocated,
        "overlaps": overlaps,
        "unplaced": size["pods"] - figures["ungated"],
        "targets": {"pods_per_s": 100, "latency_p99_s": 2.0},
    }


def summary(result: dict[str, Any]) -> str:
    return (
        f"{result['pods']} pods on {result['nodes']} nodes x {result['gpus_per_node']} "
        f"{result['model']}: {result['pods_per_s']} pods/s placed and ungated "
        f"(creation took {result['creation_s']} s, all done in {result['wall_s']} s)\n"
        f"creation -> ungate: p50 {result['latency_p50_s']} s, p99 {result['latency_p99_s']} s, "
        f"max {result['latency_max_s']} s\n"
        f"allocated {result['allocated']}, overlaps {result['overlaps']}, "
        f"unplaced {result['unplaced']}; CPU during the burst: API server "
        f"{result['apiserver_cpu_s']} s, controller {result['controller_cpu_s']} s"
    )
