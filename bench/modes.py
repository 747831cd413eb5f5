"""Controller mode vs scheduler mode on the real control plane (``../shared/realstack``), alternating.

``python -m bench.modes [--nodes 20] [--pods 1000] [--rounds 1] [--workload burst|churn]``
``python -m bench.modes --kubelets N`` (real kubelets, create → Running: ``bench/modes_running.py``)

Each run starts the real kube-apiserver, kube-scheduler and kube-controller-manager clean
(``start.sh --clean``), registers ``--nodes`` Nodes kept Ready without kubelets (``fake-node.sh``),
publishes 8 A100-40GB per node as ResourceSlices (what our kubelet plugins publish) and our
DeviceClasses, then creates ``--pods`` pods at once (16 threads), each with its own ResourceClaim for
one 1g.5gb slice:

* **controller**: pods carry the gate ``instaslice.dev/placement`` (what the webhook adds) and a real
  ``instaslice-controller`` allocates and ungates them; kube-scheduler only binds;
* **scheduler**: no gate, no controller: kube-scheduler allocates the partitionable devices itself.

Runs alternate (controller, scheduler, controller, ...) so that both see the same machine state.
Without kubelets pods are never Running: the figure is creation → bound (``spec.nodeName`` seen by a
pod informer), which covers allocation and binding — all both modes differ in. Per run: pods/s
(bound / (last bound - first create call)), p50/p99/max creation → bound, allocated devices and
overlapping allocations (must be 0). Results go to ``bench/results/modes.json``.

``--workload churn`` plays a mixed-profile request trace with lifetimes instead of the burst (same
seed in both modes; ``bench/modes_churn.py``): placed, rejected, stranded, utilization, overlaps per
mode, beside the trace's offline fluid floor. Results go to ``bench/results/modes-churn.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from api import wire
from api.names import SCHEDULING_GATE, profile_device_class
from bench.controller import GPUS_PER_NODE, MODEL, PROFILE, _overlaps, _percentile
from bench.modes_churn import ChurnSettings, make_trace, offline, play
from driver.cluster.informer import Informer, ListWatch
from driver.cluster.kube import KubeClusterApi, load_configuration
from driver.cluster.port import NODES, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES, JsonObject, name_of
from driver.cluster.throttle import ClientSettings
from driver.mig.catalog import CATALOG
from driver.resourceslices import GpuInventory, build_pool
from instaslice.planning.fleet import parse_fleet
from instaslice.planning.trace import TraceRequest
from localcluster.cluster.client import LocalClusterClient

ROOT = Path(__file__).resolve().parent.parent
NS = "default"
MODES = ("controller", "scheduler")


def _k8s() -> Path:
    return Path(os.environ.get("INSTASLICE_REAL_K8S") or "/tmp/k8s")


def _run(args: list[str], *, timeout: float = 300) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {done.stderr[-2000:]}")
    return done.stdout


def _kubectl(*args: str, stdin: str | None = None) -> str:
    k8s = _k8s()
    done = subprocess.run(
        [str(k8s / "bin" / "kubectl"), "--kubeconfig", str(k8s / "kubeconfig"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr[-2000:]}")
    return done.stdout


def _setup(api: KubeClusterApi, nodes: int) -> None:
    """Nodes kept Ready (``fake-node.sh``: a detached heartbeat loop each, stopped by ``stop.sh``),
    our DeviceClasses and the nodes' ResourceSlices."""
    k8s = _k8s()
    env = {
        **os.environ,
        "KUBECONFIG": str(k8s / "kubeconfig"),
        "PATH": f"{k8s / 'bin'}:{os.environ['PATH']}",
    }
    for i in range(nodes):
        subprocess.run(
            [str(k8s / "fake-node.sh"), f"bench-node-{i:02d}", "128", "1Ti", "110"],
            env=env,
            capture_output=True,
            timeout=60,
            check=True,
        )
    _kubectl("apply", "-f", str(ROOT / "deploy" / "base" / "deviceclasses.yaml"))
    deadline = time.monotonic() + 120
    while True:
        ready = [n for n in api.list_objects(NODES).items if _is_ready(n)]
        if len(ready) >= nodes:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(ready)} of {nodes} fake nodes became Ready")
        time.sleep(0.5)
    model = CATALOG[MODEL]
    for node in ready:
        name = name_of(node)
        owner: wire.OwnerReference = {
            "apiVersion": "v1",
            "kind": "Node",
            "name": name,
            "uid": node["metadata"]["uid"],
        }
        gpus = [
            GpuInventory(
                index=g,
                uuid=f"GPU-{name}-{g}",
                product_name=model.product_name,
                memory_slices=model.memory_slices,
                profiles=model.profiles,
            )
            for g in range(GPUS_PER_NODE)
        ]
        for slice_obj in build_pool(node=name, gpus=gpus, generation=1, owner=owner):
            api.create(RESOURCE_SLICES, slice_obj)


def _is_ready(node: JsonObject) -> bool:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def _start_controller() -> subprocess.Popen[bytes]:
    k8s = _k8s()
    return subprocess.Popen(
        [sys.executable, "-m", "controller", "--kubeconfig", str(k8s / "kubeconfig"),
         "--no-leader-elect", "--webhook-port", "0", "--metrics-address", "",
         "--healthz-address", "", "--workers", "16", "--log-level", "WARNING"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _burst(api: KubeClusterApi, pods: int, *, gated: bool) -> dict[str, Any]:
    created: dict[str, float] = {}
    bound: dict[str, float] = {}
    lock = threading.Lock()
    done = threading.Event()

    def seen(pod: JsonObject) -> None:
        if not (pod.get("spec") or {}).get("nodeName"):
            return
        name = name_of(pod)
        with lock:
            if name not in bound:
                bound[name] = time.monotonic()
                if len(bound) == pods:
                    done.set()

    informer = Informer(source=ListWatch(api, PODS, namespace=NS), name="bench-modes-pods")
    informer.add_handler(on_add=seen, on_update=lambda old, new: seen(new))
    informer.start()
    informer.wait_for_sync(timeout=30)

    def create(i: int) -> None:
        name = f"pod-{i:04d}"
        claim = f"{name}-mig"
        api.create(
            RESOURCE_CLAIMS,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": claim, "namespace": NS},
                "spec": {"devices": {"requests": [
                    {"name": "mig", "exactly": {"deviceClassName": profile_device_class(PROFILE)}}
                ]}},
            },
            namespace=NS,
        )  # fmt: skip
        spec: JsonObject = {
            "resourceClaims": [{"name": "mig", "resourceClaimName": claim}],
            "containers": [
                {"name": "main", "image": "busybox:1", "resources": {"claims": [{"name": "mig"}]}}
            ],
        }
        if gated:
            spec["schedulingGates"] = [{"name": SCHEDULING_GATE}]
        with lock:
            created[name] = time.monotonic()
        api.create(PODS, {"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": name, "namespace": NS}, "spec": spec},
                   namespace=NS)  # fmt: skip
        with lock:
            created[name] = time.monotonic()
            if name in bound:
                bound[name] = max(bound[name], created[name])

    first = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, range(pods)))
    created_all = time.monotonic()
    finished = done.wait(timeout=900)
    informer.stop()
    with lock:
        latencies = [bound[n] - created[n] for n in bound if n in created]
        last = max(bound.values(), default=first)
    return {
        "finished": finished,
        "creation_s": round(created_all - first, 2),
        "wall_s": round(last - first, 2),
        "pods_per_s": round(len(bound) / (last - first), 1) if last > first else 0.0,
        "bound_p50_s": round(statistics.median(latencies), 2) if latencies else None,
        "bound_p99_s": round(_percentile(latencies, 0.99), 2) if latencies else None,
        "bound_max_s": round(max(latencies), 2) if latencies else None,
        "bound": len(bound),
    }


def run_one(
    mode: str,
    *,
    nodes: int,
    pods: int,
    churn: tuple[tuple[TraceRequest, ...], ChurnSettings] | None = None,
) -> dict[str, Any]:
    """One run of ``mode`` on a freshly started control plane: the burst, or ``churn``'s trace."""
    k8s = _k8s()
    _run([str(k8s / "start.sh"), "--clean"], timeout=300)
    api = LocalClusterClient(
        configuration=load_configuration(kubeconfig=str(k8s / "kubeconfig")),
        settings=ClientSettings(qps=0, connection_pool_maxsize=32, user_agent="bench-modes"),
    )
    controller = None
    try:
        _setup(api, nodes)
        if mode == "controller":
            controller = _start_controller()
            time.sleep(5)  # caches synced and leading (no election)
        gated = mode == "controller"
        if churn is not None:
            trace, settings = churn
            fleet = parse_fleet(f"{nodes}x{GPUS_PER_NODE}x{MODEL}")
            return {"mode": mode, **play(api, trace, fleet, settings, gated=gated)}
        figures = _burst(api, pods, gated=gated)
        allocated, overlaps = _overlaps(api)
    finally:
        if controller is not None:
            controller.terminate()
            controller.wait(timeout=30)
        api.close()
        _run([str(k8s / "stop.sh")], timeout=120)
    return {"mode": mode, **figures, "allocated": allocated, "overlaps": overlaps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.modes", description=__doc__)
    parser.add_argument("--nodes", type=int, default=None, help="20 (burst), 4 (churn)")
    parser.add_argument(
        "--pods",
        type=int,
        default=None,
        help="1000 (burst); with --kubelets 80 %% of the 1g.5gb capacity",
    )
    parser.add_argument("--rounds", type=int, default=1, help="controller+scheduler pairs")
    parser.add_argument("--workload", choices=("burst", "churn"), default="burst")
    parser.add_argument(
        "--kubelets",
        type=int,
        default=0,
        help="real kubelets instead of fake nodes: create -> Running (burst)",
    )
    defaults = ChurnSettings()
    churn = parser.add_argument_group("churn")
    churn.add_argument("--load", type=float, default=defaults.load)
    churn.add_argument("--events", type=int, default=defaults.events)
    churn.add_argument("--mean-duration", type=float, default=defaults.mean_duration_s)
    churn.add_argument("--patience", type=float, default=defaults.patience_s)
    churn.add_argument("--seed", type=int, default=defaults.seed)
    churn.add_argument("--mix", default=defaults.mix)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)  # fmt: skip
    if args.kubelets:
        from bench.modes_running import main as running  # noqa: PLC0415 - needs localcluster's stack

        return running(kubelets=args.kubelets, rounds=args.rounds, pods=args.pods, out=args.out)
    nodes = args.nodes or (4 if args.workload == "churn" else 20)
    pods = args.pods or 1000
    if nodes < 1 or pods < 1 or args.rounds < 1:
        parser.error("--nodes, --pods and --rounds must be positive")
    if not (_k8s() / "start.sh").is_file():
        parser.error(f"the real control plane is not built at {_k8s()} (../shared/realstack)")
    report: dict[str, Any] = {
        "benchmark": "modes" if args.workload == "burst" else "modes-churn",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.node()}: {os.cpu_count()} cores, {platform.machine()}",
        "load_average_at_start": [round(x, 1) for x in os.getloadavg()],
        "kubernetes": "v1.36.2 (../shared/realstack)",
        "nodes": nodes,
        "gpus_per_node": GPUS_PER_NODE,
        "model": MODEL,
    }
    workload = None
    if args.workload == "churn":
        settings = ChurnSettings(
            load=args.load,
            events=args.events,
            mean_duration_s=args.mean_duration,
            patience_s=args.patience,
            seed=args.seed,
            mix=args.mix,
        )
        fleet = parse_fleet(f"{nodes}x{GPUS_PER_NODE}x{MODEL}")
        trace = make_trace(fleet, settings)
        workload = (trace, settings)
        report.update(
            settings={k: getattr(settings, k) for k in settings.__dataclass_fields__},
            trace_span_s=trace[-1].t,
            offline=offline(trace, fleet),
        )
        print(json.dumps(report["offline"]), flush=True)
    else:
        report.update(profile=PROFILE, pods=pods)
    runs = []
    for _ in range(args.rounds):
        for mode in MODES:
            result = run_one(mode, nodes=nodes, pods=pods, churn=workload)
            print(json.dumps(result), flush=True)
            runs.append(result)
    report["runs"] = runs
    out = args.out or ROOT / "bench" / "results" / f"{report['benchmark']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
