"""Kubelet-plugin prepare latency and throughput, over the real gRPC socket, with emulated GPUs.

The real ``instaslice-kubelet-plugin`` process (8 emulated A100-40GB, file-backed MIG state, as in the
emulated deployment) and the local API server, each in a process of its own; this process plays the
kubelet over the plugin's unix socket. Timed, as the kubelet sees it:

- **single**: one ``NodePrepareResources`` round trip for one claim (a 1g.5gb slice, placements
  cycling over the GPUs), each followed by an untimed unprepare; p50/p90/p99/max;
- **concurrent**: 50 claims (50 of the 56 1g.5gb placements of 8 GPUs) prepared by 50 kubelet
  threads at once, one claim per call; claims/s = 50 / wall time from first send to last answer,
  and the per-call p50/p99 under that load; also the same 50 claims in one call.

Every prepare includes what the real one does besides GPU work: the claim GET from the API server,
two durable checkpoint writes and the CDI spec write (each temp file + fsync + rename + directory
fsync), and the emulated backend's two durable state-file writes. These fsyncs dominate and their
latency depends on the disk and on whatever else writes to it, so everything runs twice: with the
plugin's files on disk (``/tmp``) and on tmpfs (``/dev/shm``, fsync free) — the latter is the
plugin's own CPU overhead. NVML's GPU-instance creation (hundreds of ms on real GPUs) is in neither.
"""

import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from api.names import DRIVER_NAME
from driver.cluster.kube import KubeClusterApi, configuration_for_url
from driver.cluster.port import NODES, RESOURCE_CLAIMS
from driver.cluster.throttle import ClientSettings
from protos.dra.v1 import api_pb2 as dra
from protos.dra.v1 import api_pb2_grpc as dra_grpc
from protos.pluginregistration import api_pb2 as reg
from protos.pluginregistration import api_pb2_grpc as reg_grpc

NODE = "bench-node"
GPUS = 8
SLOTS_PER_GPU = 7  # 1g.5gb placements on an A100-40GB
CONCURRENT_CLAIMS = 50
TARGET_P99_MS = 20.0
TMPFS = "/dev/shm"


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


class _Bench:
    """The API server and the plugin each in a process of their own; this process is the kubelet
    (and writes the claims, as the controller would)."""

    def __init__(self, root: Path) -> None:
        self._processes: list[subprocess.Popen[str]] = []
        self.channel: grpc.Channel | None = None
        try:
            self._start(root)
        except BaseException:
            self.close()
            raise

    def _start(self, root: Path) -> None:
        apiserver = self._spawn(["-m", "localcluster", "--kubeconfig", str(root / "kubeconfig")])
        url = ""
        while not url:
            line = apiserver.stdout.readline() if apiserver.stdout else ""
            if not line:
                raise RuntimeError("the local API server did not start")
            if line.startswith("serving on "):
                url = line.removeprefix("serving on ").strip()
        self.api = KubeClusterApi(
            configuration=configuration_for_url(url),
            settings=ClientSettings(qps=0, connection_pool_maxsize=64),
        )
        self.api.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        registry = root / "reg"
        self._spawn(
            ["-m", "kubeletplugin", "--node-name", NODE, "--gpu-backend", "emulated",
             "--emulated-gpus", f"{GPUS}xA100-40GB", "--kube-api-url", url,
             "--plugin-registry-dir", str(registry), "--plugin-dir", str(root / "plug"),
             "--cdi-root", str(root / "cdi"), "--state-dir", str(root / "state"),
             "--metrics-address", "", "--healthz-address", "", "--log-level", "WARNING",
             "--kube-api-qps", "0"],
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not list(registry.glob("*-reg.sock")):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self._processes):
                raise RuntimeError("the kubelet plugin did not start")
            time.sleep(0.05)
        (socket,) = registry.glob("*-reg.sock")
        with grpc.insecure_channel(f"unix://{socket}") as channel:  # as the kubelet registers it
            info = reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=5)
            reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=True), timeout=5
            )
        self.channel = grpc.insecure_channel(f"unix://{info.endpoint}")
        self.stub = dra_grpc.DRAPluginStub(self.channel)
        self.counter = 0

    def _spawn(self, args: list[str]) -> "subprocess.Popen[str]":
        process = subprocess.Popen(
            [sys.executable, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        self._processes.append(process)
        return process

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if hasattr(self, "api"):
            self.api.close()
        for process in reversed(self._processes):
            process.send_signal(signal.SIGTERM)
            try:
                process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()

    def claim(self, slot: int) -> dra.Claim:
        """An allocated claim for the ``slot``-th 1g.5gb placement of the node."""
        self.counter += 1
        gpu, start = slot % GPUS, (slot // GPUS) % SLOTS_PER_GPU
        obj = self.api.create(
            RESOURCE_CLAIMS,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"bench-{self.counter}", "namespace": "default"},
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME}}]
                    }
                },
            },
        )
        obj["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER_NAME,
                            "pool": NODE,
                            "device": f"gpu-{gpu}-1g-5gb-{start}",
                        }
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [NODE]}
                            ]
                        }
                    ]
                },
                "allocationTimestamp": "2026-05-01T10:00:00Z",
            }
        }
        obj = self.api.update_status(RESOURCE_CLAIMS, obj)
        return dra.Claim(
            uid=obj["metadata"]["uid"], namespace="default", name=obj["metadata"]["name"]
        )

    def prepare(self, claims: Sequence[dra.Claim]) -> float:
        started = time.perf_counter()
        response = self.stub.NodePrepareResources(
            dra.NodePrepareResourcesRequest(claims=list(claims)), timeout=45
        )
        elapsed = time.perf_counter() - started
        errors = [r.error for r in response.claims.values() if r.error]
        if errors or len(response.claims) != len(claims):
            raise RuntimeError(f"prepare failed: {errors[:3]}")
        return elapsed

    def unprepare(self, claims: Sequence[dra.Claim]) -> None:
        response = self.stub.NodeUnprepareResources(
            dra.NodeUnprepareResourcesRequest(claims=list(claims)), timeout=45
        )
        errors = [r.error for r in response.claims.values() if r.error]
        if errors:
            raise RuntimeError(f"unprepare failed: {errors[:3]}")


def _single(bench: _Bench, rounds: int) -> dict[str, Any]:
    for slot in range(5):  # warm-up: connections, caches
        claim = bench.claim(slot)
        bench.prepare([claim])
        bench.unprepare([claim])
    latencies = []
    for slot in range(rounds):
        claim = bench.claim(slot)
        latencies.append(bench.prepare([claim]))
        bench.unprepare([claim])
    return {
        "calls": rounds,
        "p50_ms": _ms(statistics.median(latencies)),
        "p90_ms": _ms(_percentile(latencies, 0.90)),
        "p99_ms": _ms(_percentile(latencies, 0.99)),
        "max_ms": _ms(max(latencies)),
        "mean_ms": _ms(statistics.fmean(latencies)),
    }


def _concurrent(bench: _Bench, rounds: int) -> dict[str, Any]:
    walls, call_latencies, batch_walls = [], [], []
    for _ in range(rounds):
        claims = [bench.claim(slot) for slot in range(CONCURRENT_CLAIMS)]
        barrier = threading.Barrier(CONCURRENT_CLAIMS)

        def one(claim: dra.Claim, barrier: threading.Barrier = barrier) -> float:
            barrier.wait()
            return bench.prepare([claim])

        with ThreadPoolExecutor(max_workers=CONCURRENT_CLAIMS) as pool:
            started = time.perf_counter()
            latencies = list(pool.map(one, claims))
            walls.append(time.perf_counter() - started)
        call_latencies.extend(latencies)
        bench.unprepare(claims)
        claims = [bench.claim(slot) for slot in range(CONCURRENT_CLAIMS)]
        batch_walls.append(bench.prepare(claims))
        bench.unprepare(claims)
    wall = statistics.median(walls)
    batch = statistics.median(batch_walls)
    return {
        "claims": CONCURRENT_CLAIMS,
        "gpus": GPUS,
        "rounds": rounds,
        "claims_per_second": round(CONCURRENT_CLAIMS / wall, 1),
        "wall_ms": _ms(wall),
        "call_p50_ms": _ms(statistics.median(call_latencies)),
        "call_p99_ms": _ms(_percentile(call_latencies, 0.99)),
        "one_call_claims_per_second": round(CONCURRENT_CLAIMS / batch, 1),
        "one_call_wall_ms": _ms(batch),
    }


def _measure(*, base: str, quick: bool) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(dir=base, prefix="isb-"))
    try:
        bench = _Bench(root)
        try:
            return {
                "state_on": base,
                "single_claim": _single(bench, rounds=10 if quick else 300),
                "concurrent": _concurrent(bench, rounds=1 if quick else 5),
            }
        finally:
            bench.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(*, quick: bool) -> dict[str, Any]:
    runs = {"disk": _measure(base="/tmp", quick=quick)}
    if Path(TMPFS).is_dir():
        runs["tmpfs"] = _measure(base=TMPFS, quick=quick)
    return {
        "backend": f"emulated {GPUS}xA100-40GB (file state)",
        "processes": "API server, plugin and kubelet client each in their own process",
        "api_server": "localcluster (HTTP, loopback)",
        "runs": runs,
        "target_p99_ms": TARGET_P99_MS,
        "meets_target": {
            name: r["single_claim"]["p99_ms"] <= TARGET_P99_MS for name, r in runs.items()
        },
        "quick": quick,
    }


def summary(result: dict[str, Any]) -> str:
    lines = []
    for name, run_result in result["runs"].items():
        single, concurrent = run_result["single_claim"], run_result["concurrent"]
        met = "met" if result["meets_target"][name] else "MISSED"
        lines += [
            f"[{name}: state, checkpoint and CDI under {run_result['state_on']}]",
            f"  one claim per NodePrepareResources ({single['calls']} calls): "
            f"p50 {single['p50_ms']} ms, p90 {single['p90_ms']} ms, p99 {single['p99_ms']} ms, "
            f"max {single['max_ms']} ms (target p99 <= {result['target_p99_ms']} ms: {met})",
            f"  {concurrent['claims']} concurrent calls over {concurrent['gpus']} GPUs: "
            f"{concurrent['claims_per_second']} claims/s (wall {concurrent['wall_ms']} ms, "
            f"per call p50 {concurrent['call_p50_ms']} ms, p99 {concurrent['call_p99_ms']} ms)",
            f"  {concurrent['claims']} claims in one call: "
            f"{concurrent['one_call_claims_per_second']} claims/s "
            f"(wall {concurrent['one_call_wall_ms']} ms)",
        ]
    return "\n".join(lines)
