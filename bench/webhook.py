"""Our webhook server's own cost per admission, apart from kube-apiserver: ``python -m bench webhook``.

On the real control plane (``bench real``) kube-apiserver's figure for a webhook call is mostly its
own wait for a CPU, and swings between rounds. This benchmark takes kube-apiserver out: the real
``WebhookServer`` (TLS, HTTP/1.1 keep-alive, the connection guards, the admission decision and its
metrics) runs in a process of its own, answering the ``AdmissionReview`` kube-apiserver sends for a
``bench real`` pod (one ResourceClaim of ours: gated), from a context that knows that claim — the
lookups an informer cache answers, without the informers. This process plays kube-apiserver:
``CONNECTIONS`` keep-alive connections, each sending one review every ``PACE_S`` seconds, as a burst
of pod creations does. Measured: the server process's CPU (user + system) per answered review, and
the latency each call sees from this side (p50 / p99 / mean).

With ``--webhook-stub EXE`` (``bench/webhookstub``, the Go stand-in ``bench real`` compares our
webhook with), the same load goes to it as well, alternating, for the same figures: the ratio of the
two CPU figures is what our server costs over the cheapest native one, protocol work included.
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import orjson

from api.names import DEVICE_CLASS_ANY, profile_device_class
from bench.realnodes import PROFILE, cpu_seconds
from controller.webhook.admission import review_pod
from controller.webhook.server import WebhookServer
from driver.mig.catalog import CATALOG
from localcluster.daemonstack import free_port, write_webhook_certificates

CONNECTIONS: Final = 16
PACE_S: Final = 0.08
"""Seconds between one connection's reviews: 16 connections at 12.5 reviews/s, 200/s in all."""
FULL: Final = {"reviews": 3200, "rounds": 2}
QUICK: Final = {"reviews": 64, "rounds": 1}
PATH: Final = "/mutate-v1-pod?timeout=10s"
NAMESPACE: Final = "bench"
START_TIMEOUT_S: Final = 30.0
_PROFILES: Final = frozenset(p for model in CATALOG.values() for p in model.profile_names)
_OUR_CLASSES: Final = frozenset({DEVICE_CLASS_ANY, *(profile_device_class(p) for p in _PROFILES)})


class _BenchContext:
    """The admission context of a cluster in which every claim asks for ``PROFILE``."""

    def claim_device_classes(self, *, namespace: str, name: str) -> Sequence[str] | None:
        return [profile_device_class(PROFILE)]

    def template_device_classes(self, *, namespace: str, name: str) -> Sequence[str] | None:
        return None

    def our_device_classes(self) -> frozenset[str]:
        return _OUR_CLASSES  # the controller's context remembers them between admissions too

    def known_profiles(self) -> frozenset[str]:
        return _PROFILES

    def max_slices_per_gpu(self, profile: str) -> int:
        return 7


def review_body(i: int) -> bytes:
    """The AdmissionReview kube-apiserver sends for pod ``i`` of ``bench real`` (with the defaults
    it has set by then)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"pod-{i:05d}", "namespace": NAMESPACE},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": f"claim-{i:05d}"}],
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1",
                    "resources": {"claims": [{"name": "gpu"}]},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 0,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {
                    "key": f"node.kubernetes.io/{key}",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
                for key in ("not-ready", "unreachable")
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {"phase": "Pending", "qosClass": "BestEffort"},
    }
    pod_resource = {"group": "", "version": "v1", "resource": "pods"}
    request = {
        "uid": f"00000000-0000-0000-0000-{i:012d}",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": pod_resource,
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": pod_resource,
        "namespace": NAMESPACE,
        "operation": "CREATE",
        "userInfo": {"username": "bench", "groups": ["system:authenticated"]},
        "object": pod,
        "oldObject": None,
        "dryRun": False,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
    }
    review = {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request}
    return orjson.dumps(review)


def serve(certs: Path, port: int) -> None:
    """Our webhook server on 127.0.0.1:``port`` until killed (the server process of a round)."""
    context = _BenchContext()
    server = WebhookServer(
        review=lambda review: review_pod(review, context),
        cert_file=certs / "tls.crt",
        key_file=certs / "tls.key",
        address=("127.0.0.1", port),
    )
    server.start()
    threading.Event().wait()


def _wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the webhook server exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"no webhook server on port {port} after {START_TIMEOUT_S:.0f}s")


def _drive(port: int, ca: Path, reviews: int, pace: float) -> list[float]:
    """``reviews`` calls over ``CONNECTIONS`` keep-alive connections; each call's seconds."""
    tls = ssl.create_default_context(cafile=str(ca))
    latencies: list[float] = []
    lock = threading.Lock()
    failures: list[str] = []

    def connection(first: int, count: int) -> None:
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=tls, timeout=30)
        mine = []
        try:
            for i in range(first, first + count):
                body = review_body(i)
                started = time.perf_counter()
                conn.request("POST", PATH, body=body, headers={"Content-Type": "application/json"})
                reply = conn.getresponse()
                answer = orjson.loads(reply.read())
                mine.append(time.perf_counter() - started)
                if reply.status != 200 or not answer["response"].get("patch"):
                    failures.append(f"review {i}: HTTP {reply.status}, {answer}")
                    return
                time.sleep(pace)
        finally:
            conn.close()
            with lock:
                latencies.extend(mine)

    per = max(1, reviews // CONNECTIONS)
    threads = [threading.Thread(target=connection, args=(n * per, per)) for n in range(CONNECTIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"the server did not gate every pod: {failures[0]}")
    return latencies


def _round(command: list[str], port: int, ca: Path, reviews: int, pace: float) -> dict[str, Any]:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port, process)
        _drive(port, ca, CONNECTIONS, 0.0)  # every connection open and warm before measuring
        before = cpu_seconds(process.pid) or 0.0
        latencies = sorted(_drive(port, ca, reviews, pace))
        cpu = (cpu_seconds(process.pid) or 0.0) - before
    finally:
        process.kill()
        process.wait()
    return {
        "reviews": len(latencies),
        "cpu_ms_per_review": round(1000 * cpu / len(latencies), 3),
        "p50_ms": round(1000 * latencies[len(latencies) // 2], 2),
        "p99_ms": round(1000 * latencies[int(len(latencies) * 0.99)], 2),
        "mean_ms": round(1000 * statistics.mean(latencies), 2),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("webhook (python -m bench webhook)")
    group.add_argument(
        "--webhook-stub",
        metavar="EXE",
        help="also measure the Go stand-in (build: cd bench/webhookstub && go build -o "
        "/tmp/webhookstub .); it gets -addr, -cert and -key",
    )


def run(*, quick: bool, options: argparse.Namespace | None = None) -> dict[str, Any]:
    size = QUICK if quick else FULL
    stub = getattr(options, "webhook_stub", None) if options is not None else None
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-webhook-") as tmp:
        certs = Path(tmp)
        write_webhook_certificates(certs)
        for repeat in range(size["rounds"]):
            servers = {"ours": [sys.executable, "-m", "bench.webhook", "serve", str(certs)]}
            if stub:
                servers["stub"] = [stub, "-cert", str(certs / "tls.crt"), "-key",
                                   str(certs / "tls.key"), "-addr"]  # fmt: skip
            for name, command in servers.items():
                port = free_port()
                address = f"127.0.0.1:{port}" if name == "stub" else str(port)
                figures = _round([*command, address], port, certs / "ca.crt",
                                 size["reviews"], PACE_S)  # fmt: skip
                rounds.append({"server": name, "repeat": repeat, **figures})
    result: dict[str, Any] = {
        "benchmark": "webhook",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} CPUs, load before {os.getloadavg()[0]:.2f}",
        "quick": quick,
        "connections": CONNECTIONS,
        "reviews_per_s": round(CONNECTIONS / PACE_S, 1),
        "rounds": rounds,
    }
    ours = [r["cpu_ms_per_review"] for r in rounds if r["server"] == "ours"]
    theirs = [r["cpu_ms_per_review"] for r in rounds if r["server"] == "stub"]
    if ours and theirs and min(theirs) > 0:
        result["cpu_ratio_median"] = round(statistics.median(ours) / statistics.median(theirs), 2)
    return result


def summary(result: dict[str, Any]) -> str:
    lines = [
        f"webhook server alone, {result['connections']} keep-alive connections, "
        f"{result['reviews_per_s']} reviews/s ({result['date']}; {result['machine']})"
    ]
    for r in result["rounds"]:
        lines.append(
            f"  {r['server']:>4} round {r['repeat']}: {r['reviews']} reviews, CPU "
            f"{r['cpu_ms_per_review']} ms/review; latency p50 {r['p50_ms']} ms, "
            f"p99 {r['p99_ms']} ms, mean {r['mean_ms']} ms"
        )
    if "cpu_ratio_median" in result:
        lines.append(
            f"CPU per review, ours / the Go stand-in (medians): {result['cpu_ratio_median']}x"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.webhook")
    sub = parser.add_subparsers(dest="command", required=True)
    serving = sub.add_parser("serve", help="our webhook server alone (a round's server process)")
    serving.add_argument("certs", type=Path, help="folder with tls.crt and tls.key")
    serving.add_argument("port", type=int)
    args = parser.parse_args(argv)
    serve(args.certs, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
