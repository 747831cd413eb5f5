"""Controller mode vs scheduler mode with real kubelets: creation → Running (``--kubelets N``).

``python -m bench.modes --kubelets N [--pods P] [--rounds R]``

The fake-node burst of ``bench/modes.py`` ends at *bound*: pods without a kubelet never run. Here
each run starts ``localcluster.realstack``'s stack clean — real kube-apiserver, kube-scheduler,
kube-controller-manager, N real kubelets (fake container runtime) each with our kubelet plugin on
8 emulated A100-40GB, one controller serving the webhook — and creates P pods at once (16 threads),
each with a claim from one ResourceClaimTemplate for one 1g.5gb slice, as users write them:

* **controller**: the webhook gates each pod on creation, the controller allocates and ungates,
  kube-scheduler binds, the kubelet prepares the claim through our plugin (MIG instance + CDI spec)
  and starts the pod;
* **scheduler**: the webhook is deleted and the controller runs ``--allocation-mode scheduler``
  (``docs/deploy.md`` "Switching modes"): kube-scheduler allocates, the rest is the same.

Per run: pods/s (Running / (last Running - first create call)), creation → bound and → Running
p50/p99/max, allocations sharing a memory slice (must be 0). The default P is 80 % of the nodes'
1g.5gb capacity (7 per GPU). Results go to ``bench/results/modes-running.json``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from api.names import profile_device_class
from bench.controller import _overlaps, _percentile
from driver.cluster.informer import Informer, ListWatch
from driver.cluster.port import PODS, RESOURCE_CLAIM_TEMPLATES, JsonObject, name_of
from localcluster.realstack import RealStack, RealStackConfig

ROOT = Path(__file__).resolve().parent.parent
NS = "default"
MODEL = "A100-40GB"
GPUS_PER_NODE = 8
PROFILE = "1g.5gb"
PER_GPU = 7
MODES = ("controller", "scheduler")
TEMPLATE = "mig-1g"
RUNNING_TIMEOUT_S = 600.0


def _template() -> JsonObject:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": TEMPLATE, "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "mig", "exactly": {"deviceClassName": profile_device_class(PROFILE)}}
        ]}}},
    }  # fmt: skip


def _pod(name: str) -> JsonObject:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "resourceClaims": [{"name": "mig", "resourceClaimTemplateName": TEMPLATE}],
            "containers": [
                {"name": "main", "image": "busybox:1", "resources": {"claims": [{"name": "mig"}]}}
            ],
        },
    }


def _burst(stack: RealStack, pods: int) -> dict[str, Any]:
    api = stack.api
    created: dict[str, float] = {}
    bound: dict[str, float] = {}
    running: dict[str, float] = {}
    lock = threading.Lock()
    done = threading.Event()

    def seen(pod: JsonObject) -> None:
        name = name_of(pod)
        now = time.monotonic()
        with lock:
            if (pod.get("spec") or {}).get("nodeName") and name not in bound:
                bound[name] = now
            if (pod.get("status") or {}).get("phase") == "Running" and name not in running:
                running[name] = now
                if len(running) == pods:
                    done.set()

    informer = Informer(source=ListWatch(api, PODS, namespace=NS), name="bench-running-pods")
    informer.add_handler(on_add=seen, on_update=lambda old, new: seen(new))
    informer.start()
    informer.wait_for_sync(timeout=30)

    def create(i: int) -> None:
        name = f"pod-{i:04d}"
        with lock:
            created[name] = time.monotonic()
        api.create(PODS, _pod(name), namespace=NS)

    first = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, range(pods)))
    created_all = time.monotonic()
    finished = done.wait(timeout=RUNNING_TIMEOUT_S)
    informer.stop()
    with lock:
        to_bound = [bound[n] - created[n] for n in bound if n in created]
        to_running = [running[n] - created[n] for n in running if n in created]
        last = max(running.values(), default=first)

    def figures(prefix: str, values: list[float]) -> dict[str, float | None]:
        return {
            f"{prefix}_p50_s": round(statistics.median(values), 2) if values else None,
            f"{prefix}_p99_s": round(_percentile(values, 0.99), 2) if values else None,
            f"{prefix}_max_s": round(max(values), 2) if values else None,
        }

    return {
        "finished": finished,
        "creation_s": round(created_all - first, 2),
        "wall_s": round(last - first, 2),
        "pods_per_s": round(len(running) / (last - first), 1) if last > first else 0.0,
        "bound": len(bound),
        "running": len(running),
        **figures("bound", to_bound),
        **figures("running", to_running),
    }


def run_one(mode: str, *, kubelets: int, pods: int) -> dict[str, Any]:
    config = RealStackConfig(
        nodes=kubelets,
        gpus=f"{GPUS_PER_NODE}x{MODEL}",
        controllers=1,
        leader_elect=False,
        log_level="WARNING",
    )
    logs = Path(os.environ.get("INSTASLICE_REAL_LOGS") or tempfile.gettempdir())
    stack = RealStack(config)
    try:
        stack.start()
        if mode == "scheduler":
            stack.set_webhook(on=False)
            stack.set_allocation_mode("scheduler")
        stack.api.create(RESOURCE_CLAIM_TEMPLATES, _template(), namespace=NS)
        figures = _burst(stack, pods)
        allocated, overlaps = _overlaps(stack.api)
    finally:
        stack.stop(keep_logs=logs / f"modes-running-{mode}")
    return {"mode": mode, **figures, "allocated": allocated, "overlaps": overlaps}


def main(*, kubelets: int, rounds: int, pods: int | None, out: Path | None) -> int:
    """``pods`` None: 80 % of the 1g.5gb capacity."""
    count = pods or int(0.8 * kubelets * GPUS_PER_NODE * PER_GPU)
    load = [round(x, 1) for x in os.getloadavg()]
    runs = []
    for _ in range(rounds):
        for mode in MODES:
            result = run_one(mode, kubelets=kubelets, pods=count)
            print(json.dumps(result), flush=True)
            runs.append(result)
    report = {
        "benchmark": "modes-running",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.node()}: {os.cpu_count()} cores, {platform.machine()}",
        "load_average_at_start": load,
        "kubernetes": "v1.36.2 (../shared/realstack), real kubelets with a fake CRI",
        "kubelets": kubelets,
        "gpus_per_node": GPUS_PER_NODE,
        "model": MODEL,
        "profile": PROFILE,
        "pods": count,
        "runs": runs,
    }
    path = out or ROOT / "bench" / "results" / "modes-running.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"-> {path}")
    return 0
