"""Speed on the real control plane: kube-scheduler allocating itself versus our controller with its
webhook on, the same burst both ways in one run, alternating, on the same nodes.

Uses the real Kubernetes 1.36 stack of ``/work/shared/realstack`` (``$INSTASLICE_REALSTACK``,
default ``/tmp/k8s``: etcd, kube-apiserver, kube-scheduler, kube-controller-manager); skips with one
line when it is not built. The run starts it fresh (``start.sh --clean``) and stops it at the end.
Nodes are Node objects kept Ready (their kube-node-lease Leases renewed from here; there is no
kubelet, pods are bound but never run) with the ResourceSlices our kubelet plugin publishes for 8
A100-40GB each; the rounds wait until kube-controller-manager has lifted the not-ready taint
kube-apiserver gives every new Node. This process plays the users: one ResourceClaim per pod
(asking one 1g.5gb) made before the burst — after the controller and its webhook are up, so that on the webhook paths our
claims get their delete-protection finalizer at creation, as in a running cluster (the seconds and
kube-apiserver CPU this takes are reported as ``claims``) — then every pod created at once from
``--clients`` threads. The stand-in webhook of ``stubhook`` takes pods only.

Paths, one round each per repeat, alternating:

* ``scheduler``: no webhook, no controller; kube-scheduler allocates the claims itself and binds.
* ``controller``: ``instaslice-controller`` started for the round (no leader election, its webhook
  process serving ``https://127.0.0.1:<port>`` through the MutatingWebhookConfiguration of
  ``deploy/base/webhook.yaml``): the webhook gates each pod at creation, the controller allocates
  and ungates, kube-scheduler binds.
* ``stubhook`` (with ``--webhook-stub``): as ``controller``, but kube-apiserver calls a stand-in
  webhook instead of ours — ``bench/webhookstub``, a few lines of Go that add the gate to every pod
  and do nothing else. Not a product path: a yardstick. Alternated with ``controller``, it shows
  how much of the webhook latency kube-apiserver measures is ours and how much any webhook would
  get on the same machine under the same burst.
* ``stubcontroller``: pods created already gated (as ``pregated``), placed by a stand-in controller
  instead of ours — ``bench/controllerstub.py``, the same four writes per pod through the same
  Python transport, informers and write functions, with no placement search or checks. Not a
  product path: a yardstick. Alternated with ``pregated``, its CPU per pod is the floor any Python
  controller doing this protocol pays, under ours.

Figures per round: ``pods_per_s`` = pods / (last bound - first create sent); create→bound latency
(create call sent → ``spec.nodeName`` seen by a pod informer here) p50/p99/max; ``overlaps`` (two
allocations sharing a memory slice of one GPU; must be 0); the webhook's latency as kube-apiserver
measured it (``apiserver_admission_webhook_admission_duration_seconds``, the difference over the
burst: mean, share within 25 ms, p99 interpolated in its buckets) beside our webhook server's own
histogram of the same calls (``instaslice_webhook_request_duration_seconds``, read from the
controller's /metrics); CPU seconds of every process
during the burst (controller, its webhook process, kube-apiserver, etcd, kube-scheduler,
kube-controller-manager), the controller's peak RSS and its context switches per pod (voluntary:
a thread blocked on I/O, a lock or the interpreter lock; involuntary: preempted). Where the time goes: each pod's stages
(``STAGES``: create, allocate, ungate, bind) with the slowest 1%'s mean per stage; kube-scheduler's
own client throttling and kube-apiserver's priority-and-fairness queueing from their metrics; the
seconds each process waited for a CPU and the machine's busy CPU (on a shared machine, whether a
figure is work or waiting). Between rounds every pod and claim is
removed (pods with grace period 0; claims freed and their finalizer lifted here, not waiting for
kube-controller-manager's rate-limited client).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from api.names import SCHEDULING_GATE, profile_device_class
from bench.realmetrics import (
    APISERVER_COUNTERS,
    FLOW_WAIT,
    SCHEDULER_COUNTERS,
    SERVER_WEBHOOK_DURATION,
    Profiler,
    by_label,
    controller_counters,
    counters,
    counters_delta,
    histogram,
    histogram_delta,
    scheduler_metrics,
    webhook_histogram,
)
from bench.realnodes import (
    GPUS_PER_NODE,
    MODEL,
    PROFILE,
    ReadyNodes,
    children,
    context_switches,
    cpu_seconds,
    latency_figures,
    machine_busy_s,
    overlaps,
    peak_rss_mib,
    percentile,
    runqueue_wait_s,
    system_cpu_seconds,
)
from controller.settings import DEFAULT_WORKERS
from driver.cluster.informer import Informer, ListWatch
from driver.cluster.kube import KubeClusterApi, connect
from driver.cluster.port import (
    PODS,
    RESOURCE_CLAIMS,
    JsonObject,
    Resource,
    gate_names,
    name_of,
)
from driver.cluster.throttle import ClientSettings
from driver.errors import AlreadyExistsError, ApiNotFoundError, ClusterError, ConflictError
from localcluster.daemonstack import free_port, local_metrics
from localcluster.manifests import (
    MUTATING_WEBHOOK_CONFIGURATIONS,
    NAMESPACES,
    apply_object,
    load_file,
)
from localcluster.stack import (
    DEPLOY_BASE,
    WEBHOOK_PATH,
    webhook_configuration,
    write_webhook_certificates,
)

ROOT = Path(__file__).resolve().parent.parent
NS = "bench"
WEBHOOKS = ("pod-gate.instaslice.dev", "claim-gate.instaslice.dev")
"""Our webhooks of deploy/base/webhook.yaml: classic pods go to the first, pods with claims (every
pod of this benchmark) to the second."""
WEBHOOK_CONFIG = "instaslice-pod-gate"
PATHS = ("scheduler", "controller", "pregated", "stubhook", "stubcontroller")
DEFAULT_PATHS = ("scheduler", "controller")
FULL = {"nodes": 20, "pods": 1000}
QUICK = {"nodes": 2, "pods": 10}
BURST_TIMEOUT_S = 900.0
COMPONENTS = ("kube-apiserver", "etcd", "kube-scheduler", "kube-controller-manager")
OURS = ("controller", "webhook")
"""Our processes in a round (the controller, or its stand-in, and its webhook process)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("real (python -m bench real)")
    group.add_argument("--nodes", type=int, help=f"nodes (default {FULL['nodes']})")
    group.add_argument("--pods", type=int, help=f"pods per burst (default {FULL['pods']})")
    group.add_argument("--repeat", type=int, default=1, help="rounds of each path (default 1)")
    group.add_argument(
        "--paths",
        default=",".join(DEFAULT_PATHS),
        help=f"comma-separated, of {PATHS} (default {','.join(DEFAULT_PATHS)})",
    )
    group.add_argument("--clients", type=int, default=16, help="threads creating pods")
    group.add_argument(
        "--workers",
        type=int,
        default=DEFAULT_WORKERS,
        help=f"controller --workers (default {DEFAULT_WORKERS})",
    )
    group.add_argument(
        "--controller-args",
        default="",
        help="more controller flags, space-separated (the stubcontroller path's stand-in takes "
        "only --[no-]nominate-node)",
    )
    group.add_argument(
        "--burst-timeout",
        type=float,
        default=BURST_TIMEOUT_S,
        help=f"seconds a burst may take; then the pods bound so far are counted "
        f"(default {BURST_TIMEOUT_S:.0f})",
    )
    group.add_argument(
        "--profile",
        metavar="DIR",
        help="sample the controller and its webhook process with py-spy during each burst "
        "(folded stacks and the top functions written to DIR)",
    )
    group.add_argument(
        "--control-plane-nice",
        type=int,
        default=0,
        metavar="N",
        help="the nice value (-20..19) of the control plane's scheduling groups (etcd, "
        "kube-apiserver, kube-scheduler, kube-controller-manager: one autogroup each, from "
        "start.sh's setsid) for the whole run, both paths alike; negative values stand in for "
        "a control plane on cores of its own. Default 0: the kernel's fair share",
    )
    group.add_argument(
        "--controller-nice",
        type=int,
        default=0,
        metavar="N",
        help="the same for the controller's session (it and its webhook process), e.g. to "
        "stand in for a controller pod with CPU of its own on a worker node",
    )
    group.add_argument(
        "--webhook-stub",
        metavar="EXE",
        help="the stand-in webhook for the stubhook path (build: cd bench/webhookstub && "
        "go build -o /tmp/webhookstub .); it gets -addr, -cert and -key",
    )
    group.add_argument(
        "--scheduler-qps",
        type=float,
        default=0.0,
        help="kube-scheduler's client QPS (its clientConnection.qps, flag --kube-api-qps; burst "
        "twice that) for every path of the run; default: kube-scheduler's own (50, burst 100)",
    )


def stack_dir() -> Path:
    """Where the real stack is built: ``$INSTASLICE_REALSTACK``, default ``/tmp/k8s``."""
    return Path(os.environ.get("INSTASLICE_REALSTACK") or "/tmp/k8s")


def missing() -> str | None:
    where = stack_dir()
    for path in (where / "start.sh", where / "stop.sh", where / "bin" / "kube-apiserver"):
        if not path.exists():
            return f"no real control plane built at {where} ({path.name} missing)"
    return None


# -- processes -------------------------------------------------------------------------------


def _component_pids() -> dict[str, int | None]:
    pids: dict[str, int | None] = {}
    for name in COMPONENTS:
        try:
            pids[name] = int((stack_dir() / "run" / f"{name}.pid").read_text().strip())
        except (OSError, ValueError):
            pids[name] = None
    return pids


def tcp_states(port: int) -> dict[str, int]:
    """Sockets on this machine whose local port is ``port``, by TCP state (``/proc/net/tcp``):
    many ``TIME_WAIT`` ones after a burst mean connections were not kept alive."""
    names = {"01": "established", "06": "time_wait", "08": "close_wait"}
    counts: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and int(fields[1].rsplit(":", 1)[1], 16) == port:
                state = names.get(fields[3], fields[3])
                counts[state] = counts.get(state, 0) + 1
    return counts


# -- the cluster -----------------------------------------------------------------------------


SERVICE_ACCOUNTS = Resource(
    group="", version="v1", plural="serviceaccounts", kind="ServiceAccount", namespaced=True
)


def _setup(api: KubeClusterApi) -> None:
    for obj in load_file(DEPLOY_BASE / "deviceclasses.yaml"):
        apply_object(api, obj)
    api.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    # pods need it (ServiceAccount admission); kube-controller-manager makes it a little later
    with contextlib.suppress(AlreadyExistsError):
        api.create(
            SERVICE_ACCOUNTS,
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
            namespace=NS,
        )
    api.create(
        NAMESPACES,
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "instaslice-system"}},
    )


def _claim(i: int) -> JsonObject:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"claim-{i:05d}", "namespace": NS},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "mig", "exactly": {"deviceClassName": profile_device_class(PROFILE)}}
                ]
            }
        },
    }


def _pod(i: int, *, claim: str) -> JsonObject:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"pod-{i:05d}", "namespace": NS},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [
                {"name": "main", "image": "busybox:1", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


def _progress(message: str) -> None:
    print(f"bench real: {datetime.now(UTC):%H:%M:%S} {message}", file=sys.stderr, flush=True)


def _parallel(func: Callable[[Any], object], items: Iterable[Any], threads: int = 16) -> None:
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(func, items))


def _cleanup(api: KubeClusterApi) -> None:
    """Remove every pod (grace 0) and claim of the namespace, freeing the claims ourselves."""
    api.request(
        "DELETE",
        f"/api/v1/namespaces/{NS}/pods",
        body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
    )

    def release(claim: JsonObject) -> None:
        for _ in range(20):
            try:
                if claim.get("status"):
                    claim = api.update_status(RESOURCE_CLAIMS, {**claim, "status": {}})
                if (claim.get("metadata") or {}).get("finalizers"):
                    metadata = {**claim["metadata"], "finalizers": []}
                    claim = api.update(RESOURCE_CLAIMS, {**claim, "metadata": metadata})
                api.delete(RESOURCE_CLAIMS, name=name_of(claim), namespace=NS)
                return
            except ConflictError:
                try:
                    claim = api.get(RESOURCE_CLAIMS, name=name_of(claim), namespace=NS)
                except ApiNotFoundError:
                    return
            except ApiNotFoundError:
                return

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        claims = api.list_objects(RESOURCE_CLAIMS, namespace=NS).items
        pods = api.list_objects(PODS, namespace=NS).items
        if not claims and not pods:
            return
        _parallel(release, claims)
        time.sleep(0.5)
    raise RuntimeError("bench real: pods or claims of the last round are still there")


# -- one round -------------------------------------------------------------------------------


class _Controller:
    """``instaslice-controller`` for one round, its webhook registered with kube-apiserver."""

    def __init__(
        self,
        api: KubeClusterApi,
        tmp: Path,
        *,
        workers: int,
        extra: list[str],
        webhook: bool,
        stub: str | None = None,
        nice: int = 0,
        stand_in: bool = False,
    ) -> None:
        self._api = api
        self._webhook = webhook
        self.port = free_port() if webhook else 0
        self.health = free_port()
        self.metrics = free_port()
        ca = write_webhook_certificates(tmp / "certs")
        self.stub: subprocess.Popen[bytes] | None = None
        self.stub_port = 0
        if stub is not None:  # kube-apiserver calls the stand-in; ours serves nobody
            self.stub_port = free_port()
            self.stub = subprocess.Popen(
                [stub, "-addr", f"127.0.0.1:{self.stub_port}",
                 "-cert", str(tmp / "certs" / "tls.crt"), "-key", str(tmp / "certs" / "tls.key")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        hook_port = self.stub_port or self.port
        url = f"https://127.0.0.1:{hook_port}{WEBHOOK_PATH}"
        self._log = (tmp / "controller.log").open("ab")
        kubeconfig = str(stack_dir() / "kubeconfig")
        command = (
            [sys.executable, "-m", "bench.controllerstub", "--kubeconfig", kubeconfig,
             "--healthz-address", f"127.0.0.1:{self.health}", "--workers", str(workers),
             *extra]
            if stand_in
            else [sys.executable, "-m", "controller", "--kubeconfig", kubeconfig,
             "--no-leader-elect", "--webhook-port", str(self.port),
             "--webhook-cert-dir", str(tmp / "certs"), "--cert-mode", "files",
             "--metrics-address", f"127.0.0.1:{self.metrics}",
             "--healthz-address", f"127.0.0.1:{self.health}",
             "--workers", str(workers), "--log-level", "WARNING", *extra]
        )  # fmt: skip
        self.process = subprocess.Popen(
            command,
            cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
            # A session of its own, like the control plane's processes (start.sh's setsid): with
            # the kernel's autogroups a session is one scheduling group, and left in ours the
            # controller and its webhook process would share one CPU share with this process's
            # 16 creating threads — a cluster runs the controller in a pod (cgroup) of its own.
            start_new_session=True,
        )  # fmt: skip
        if nice:  # the session's autogroup: this process and the webhook process it starts
            _renice(self.process.pid, nice, what="--controller-nice: the controller")
        self._wait_ready()
        if webhook:
            config = webhook_configuration(url=url, ca_bundle=ca)
            if stub is not None:  # the stand-in gates whatever it is sent: pods only
                config["webhooks"] = [
                    hook
                    for hook in config["webhooks"]
                    if all("pods" in rule["resources"] for rule in hook["rules"])
                ]
            apply_object(api, config)
            self._wait_admitting()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the controller exited with {self.process.returncode}")
            try:
                url = f"http://127.0.0.1:{self.health}/readyz"
                with urllib.request.urlopen(url, timeout=1) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("the controller did not become ready")

    def _wait_admitting(self) -> None:
        """Until kube-apiserver calls the webhook: a probe pod (its claim does not exist) is
        gated when the webhook answers."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            probe = _pod(99999, claim="no-such-claim")
            probe["metadata"]["name"] = "webhook-probe"
            try:
                created = self._api.create(PODS, probe, namespace=NS)
            except AlreadyExistsError:
                created = self._api.get(PODS, name="webhook-probe", namespace=NS)
            self._api.request(
                "DELETE",
                f"/api/v1/namespaces/{NS}/pods/webhook-probe",
                body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
            )
            if SCHEDULING_GATE in gate_names(created):
                while True:
                    try:
                        self._api.get(PODS, name="webhook-probe", namespace=NS)
                    except ApiNotFoundError:
                        return
                    time.sleep(0.1)
            time.sleep(0.5)
        raise RuntimeError("kube-apiserver does not call the webhook")

    def scrape(self) -> str:
        """The controller's /metrics (with its webhook process's); empty if unreadable."""
        return local_metrics(self.metrics)

    def pids(self) -> tuple[int, int | None]:
        webhook = children(self.process.pid)
        return self.process.pid, (webhook[0] if webhook else None)

    def stop(self) -> None:
        if self._webhook:
            with contextlib.suppress(ApiNotFoundError):
                self._api.delete(MUTATING_WEBHOOK_CONFIGURATIONS, name=WEBHOOK_CONFIG)
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.stub is not None:
            self.stub.kill()
            self.stub.wait()
        self._log.close()


STAGES = ("create", "allocate", "ungate", "bind")
"""One pod's way, each stage ending when this process sees it: ``create`` (create call sent →
returned: kube-apiserver, with the webhook call on the controller path), ``allocate`` (→ its
claim's allocation seen: the controller's informer, queue and write — or kube-scheduler's on the
scheduler path), ``ungate`` (→ the scheduling gate seen gone: the controller's second write),
``bind`` (→ ``spec.nodeName`` seen: kube-scheduler, rate-limited by its own client)."""


def breakdown(times: dict[str, dict[str, float]], latencies: dict[str, float]) -> dict[str, Any]:
    """Per stage: p50/p99 over every pod, and the mean over the slowest 1% of pods (by create→bound;
    at least one) — which stage the tail is made of. ``times`` holds, per pod, the moment each
    of ``sent`` and the stages was seen; a stage seen out of order counts as 0 s."""
    stages: dict[str, list[float]] = {stage: [] for stage in STAGES}
    per_pod: dict[str, dict[str, float]] = {}
    for pod, seen in times.items():
        if pod not in latencies or "sent" not in seen:
            continue
        previous = seen["sent"]
        spent: dict[str, float] = {}
        for stage in STAGES:
            if stage not in seen:
                continue
            at = max(previous, seen[stage])
            spent[stage] = at - previous
            stages[stage].append(at - previous)
            previous = at
        per_pod[pod] = spent
    if not per_pod:
        return {}
    slowest = sorted((pod for pod in latencies if pod in per_pod), key=lambda pod: -latencies[pod])
    tail = [per_pod[pod] for pod in slowest[: max(1, round(len(slowest) / 100))]]
    figures: dict[str, Any] = {"tail_pods": len(tail)}
    for stage, values in stages.items():
        if not values:
            continue
        figures[stage] = {
            "p50_s": round(statistics.median(values), 3),
            "p99_s": round(percentile(values, 0.99), 3),
            "tail_mean_s": round(statistics.fmean(t.get(stage, 0.0) for t in tail), 3),
        }
    return figures


def _burst(
    api: KubeClusterApi,
    pods: int,
    clients: int,
    *,
    gated: bool,
    pregated: bool,
    timeout: float = BURST_TIMEOUT_S,
) -> dict[str, Any]:
    times: dict[str, dict[str, float]] = {f"pod-{i:05d}": {} for i in range(pods)}
    bound: dict[str, float] = {}
    wrong_gate: list[str] = []
    failed: list[str] = []
    lock = threading.Lock()
    done = threading.Event()

    def seen(pod: JsonObject) -> None:
        name = name_of(pod)
        now = time.monotonic()
        if name not in times:
            return
        with lock:
            if gated and SCHEDULING_GATE not in gate_names(pod):
                times[name].setdefault("ungate", now)
            if not (pod.get("spec") or {}).get("nodeName") or name in bound:
                return
            bound[name] = times[name]["bind"] = now
            if len(bound) + len(failed) >= pods:
                done.set()

    def claim_seen(claim: JsonObject) -> None:
        if not ((claim.get("status") or {}).get("allocation")):
            return
        pod = "pod-" + name_of(claim).removeprefix("claim-")
        now = time.monotonic()
        with lock:
            if pod in times:
                times[pod].setdefault("allocate", now)

    informer = Informer(source=ListWatch(api, PODS, namespace=NS), name="bench-real-pods")
    informer.add_handler(on_add=seen, on_update=lambda old, new: seen(new))
    claims = Informer(source=ListWatch(api, RESOURCE_CLAIMS, namespace=NS), name="bench-claims")
    claims.add_handler(on_add=claim_seen, on_update=lambda old, new: claim_seen(new))
    for each in (informer, claims):
        each.start()
        each.wait_for_sync(timeout=60)

    def create(i: int) -> None:
        name = f"pod-{i:05d}"
        with lock:
            times[name]["sent"] = time.monotonic()
        pod = _pod(i, claim=f"claim-{i:05d}")
        if pregated:  # as the webhook would have made it
            pod["spec"]["schedulingGates"] = [{"name": SCHEDULING_GATE}]
        try:
            created = api.create(PODS, pod, namespace=NS)
        except ClusterError as exc:  # counted: a refused create is a result, not a crash
            print(f"bench real: {name} not created: {exc}", file=sys.stderr)
            with lock:
                failed.append(name)
                if len(bound) + len(failed) >= pods:
                    done.set()
            return
        with lock:
            times[name]["create"] = time.monotonic()
        if (SCHEDULING_GATE in gate_names(created)) != gated:
            with lock:
                wrong_gate.append(name)

    first = time.monotonic()
    _parallel(create, range(pods), clients)
    created_all = time.monotonic()
    finished = done.wait(timeout=timeout)
    informer.stop()
    claims.stop()
    with lock:
        latency = {n: bound[n] - times[n]["sent"] for n in bound if "sent" in times[n]}
        last = max(bound.values(), default=first)
        ours = [t["ungate"] - t["sent"] for t in times.values() if "ungate" in t and "sent" in t]
        theirs = [t["bind"] - t["ungate"] for t in times.values() if "ungate" in t and "bind" in t]
        stages = breakdown(times, latency)
    split = {}
    if ours and theirs:
        # where the time goes: our part (create -> gate lifted), kube-scheduler's (-> bound)
        split = {
            "to_ungated_p50_s": round(statistics.median(ours), 3),
            "to_ungated_p99_s": round(percentile(ours, 0.99), 3),
            "ungated_to_bound_p50_s": round(statistics.median(theirs), 3),
            "ungated_to_bound_p99_s": round(percentile(theirs, 0.99), 3),
        }
    return {
        **split,
        "stages": stages,
        "finished": finished,
        "creation_s": round(created_all - first, 3),
        "wall_s": round(last - first, 3),
        "pods_per_s": round(len(bound) / (last - first), 1) if last > first else 0.0,
        **latency_figures(list(latency.values()), prefix="latency"),
        "bound": len(bound),
        "create_failures": len(failed),
        "wrongly_gated": len(wrong_gate),
    }


def _round(
    api: KubeClusterApi, path: str, options: argparse.Namespace, pods: int, *, last: bool
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        controller = (
            _Controller(
                api,
                Path(tmp),
                workers=options.workers,
                extra=options.controller_args.split(),
                webhook=path in ("controller", "stubhook"),
                stub=_stub(options) if path == "stubhook" else None,
                nice=options.controller_nice,
                stand_in=path == "stubcontroller",
            )
            if path in ("controller", "pregated", "stubhook", "stubcontroller")
            else None
        )
        # after the controller and its webhook are up, as in a running cluster: our claims get the
        # delete-protection finalizer at creation where the webhook is registered
        claims_started = time.monotonic()
        apiserver = _component_pids()["kube-apiserver"]
        apiserver_cpu = cpu_seconds(apiserver)
        _parallel(lambda i: api.create(RESOURCE_CLAIMS, _claim(i), namespace=NS), range(pods))
        claims_s = time.monotonic() - claims_started
        claims_cpu = (cpu_seconds(apiserver) or 0.0) - (apiserver_cpu or 0.0)
        _progress(f"{path}: {pods} claims created")
        try:
            pids: dict[str, int | None] = dict(_component_pids())
            if controller is not None:
                pids["controller"], pids["webhook"] = controller.pids()
            apiserver_before = api.request("GET", "/metrics", accept="text/plain").decode()
            metrics_before = webhook_histogram(apiserver_before, WEBHOOKS)
            ours_before = controller.scrape() if controller else ""
            served_before = histogram(ours_before, SERVER_WEBHOOK_DURATION)
            flow_before = counters(apiserver_before, APISERVER_COUNTERS)
            waits_before = by_label(apiserver_before, FLOW_WAIT, "flow_schema")
            scheduler_before = counters(scheduler_metrics(stack_dir() / "pki"), SCHEDULER_COUNTERS)
            cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            system_before = {name: system_cpu_seconds(pid) for name, pid in pids.items()}
            wait_before = {name: runqueue_wait_s(pid) for name, pid in pids.items()}
            switches_before = {name: context_switches(pids.get(name)) for name in OURS}
            busy_before = machine_busy_s()
            burst_started = time.monotonic()
            profiler = (
                Profiler(
                    Path(options.profile),
                    {"controller": pids.get("controller"), "webhook": pids.get("webhook")},
                    tag=f"{path}-{pods}pods",
                )
                if options.profile and controller is not None
                else None
            )
            _progress(f"{path}: burst of {pods} pods")
            figures = _burst(
                api,
                pods,
                options.clients,
                gated=controller is not None,
                pregated=path in ("pregated", "stubcontroller"),
                timeout=options.burst_timeout,
            )
            cpu_after = {name: cpu_seconds(pid) for name, pid in pids.items()}
            system_after = {name: system_cpu_seconds(pid) for name, pid in pids.items()}
            wait_after = {name: runqueue_wait_s(pid) for name, pid in pids.items()}
            switches_after = {name: context_switches(pids.get(name)) for name in OURS}
            busy = (machine_busy_s() or 0.0) - (busy_before or 0.0)
            burst_s = time.monotonic() - burst_started
            load = _load()
            profile = profiler.stop() if profiler is not None else {}
            port = controller and (controller.stub_port or controller.port)
            sockets = tcp_states(port) if port else {}
            apiserver_after = api.request("GET", "/metrics", accept="text/plain").decode()
            metrics_after = webhook_histogram(apiserver_after, WEBHOOKS)
            ours_after = controller.scrape() if controller else ""
            served_after = histogram(ours_after, SERVER_WEBHOOK_DURATION)
            done_besides = {
                key: value
                for key, value in counters_delta(
                    controller_counters(ours_before), controller_counters(ours_after)
                ).items()
                if value
            }
            flow: dict[str, Any] = counters_delta(
                flow_before, counters(apiserver_after, APISERVER_COUNTERS)
            )
            flow["wait_s_by_flow_schema"] = {
                schema: round(seconds - waits_before.get(schema, 0.0), 3)
                for schema, seconds in by_label(apiserver_after, FLOW_WAIT, "flow_schema").items()
                if seconds - waits_before.get(schema, 0.0) > 0.001
            }
            scheduler = counters_delta(
                scheduler_before,
                counters(scheduler_metrics(stack_dir() / "pki"), SCHEDULER_COUNTERS),
            )
            rss = {
                name: peak_rss_mib(pids.get(name))
                for name in ("controller", "webhook")
                if pids.get(name)
            }
        finally:
            if controller is not None:
                controller.stop()
    allocated, found = overlaps(api, namespace=NS)
    cpu = {
        name: round(after - before, 2)
        for name, after in cpu_after.items()
        if after is not None and (before := cpu_before.get(name)) is not None
    }
    result: dict[str, Any] = {
        "path": path,
        **figures,
        "allocated": allocated,
        "overlaps": found,
        "cpu_s": cpu,
        # the kernel's part of cpu_s (system time: sockets, TLS record syscalls, page faults)
        "system_cpu_s": {
            name: round(after - before, 2)
            for name, after in system_after.items()
            if after is not None and (before := system_before.get(name)) is not None
        },
        # runnable but not running (waiting for a CPU) during the burst
        "runqueue_wait_s": {
            name: round(after - before, 2)
            for name, after in wait_after.items()
            if after is not None and (before := wait_before.get(name)) is not None
        },
        "load_after": load,
        # the claims, created before the burst (with the webhook registered on the paths that
        # have one): how long, and kube-apiserver's CPU for them (webhook calls included)
        "claims": {"created_s": round(claims_s, 2), "kube_apiserver_cpu_s": round(claims_cpu, 2)},
        # every CPU of the machine over the burst: ours, the control plane's, everyone else's
        "machine_cpu_s": {"busy": round(busy, 1), "available": round(burst_s * _cpus(), 1)},
        "peak_rss_mib": rss,
        "kube_scheduler": scheduler,
        "kube_apiserver": flow,
    }
    if path in ("controller", "pregated"):  # the stand-ins count nothing
        result["controller_counters"] = done_besides
    if profile:
        result["profile"] = profile
    if path in ("controller", "stubhook"):
        result["webhook"] = histogram_delta(metrics_before, metrics_after)
    if path == "controller":  # the same calls as our webhook's server timed them
        result["webhook_server"] = histogram_delta(served_before, served_after)
        result["webhook_sockets"] = sockets
    if controller is not None:
        for name in OURS:
            if name in cpu and figures["bound"]:
                result[f"{name}_cpu_ms_per_pod"] = round(1000 * cpu[name] / figures["bound"], 2)
            started, ended = switches_before.get(name), switches_after.get(name)
            if started is not None and ended is not None and figures["bound"]:
                # thread hand-offs per pod: where CPU goes that no profile of Python code shows
                result.setdefault("context_switches_per_pod", {})[name] = {
                    "voluntary": round((ended[0] - started[0]) / figures["bound"], 1),
                    "involuntary": round((ended[1] - started[1]) / figures["bound"], 1),
                }
    if not last:  # after the last round the stack is stopped (and the next run starts clean)
        _progress(f"{path}: burst done ({figures['bound']} bound); removing pods and claims")
        _cleanup(api)
    return result


def _renice_control_plane(nice: int) -> None:
    """With autogroups (``/proc/sys/kernel/sched_autogroup_enabled``), busy sessions share the
    CPUs equally whatever their threads' nice values; a session's weight is set through any of its
    processes' ``/proc/PID/autogroup``."""
    for name, pid in _component_pids().items():
        if pid is None:
            raise SystemExit(f"bench real: --control-plane-nice: no pid for {name}")
        _renice(pid, nice, what=f"--control-plane-nice: {name}")


def _renice(pid: int, nice: int, *, what: str) -> None:
    """Weight the autogroup (session) of ``pid`` like a nice value ``nice``."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")
    except OSError as error:
        raise SystemExit(f"bench real: {what}: {error}") from None


def _stub(options: argparse.Namespace) -> str:
    stub = getattr(options, "webhook_stub", None)
    if not stub or not os.access(stub, os.X_OK):
        raise SystemExit(
            "bench real: the stubhook path needs --webhook-stub EXE (build it: cd "
            "bench/webhookstub && go build -o /tmp/webhookstub .)"
        )
    return str(stub)


def run(*, quick: bool, options: argparse.Namespace | None = None) -> dict[str, Any]:
    reason = missing()
    if reason is not None:
        print(f"bench real: skipped: {reason}")
        return {"benchmark": "real", "skipped": reason}
    if options is None:
        options = argparse.Namespace(
            nodes=None, pods=None, repeat=1, paths=",".join(DEFAULT_PATHS), clients=16,
            workers=DEFAULT_WORKERS,
            controller_args="", scheduler_qps=0.0, profile=None, webhook_stub=None,
            control_plane_nice=0, controller_nice=0,
            burst_timeout=BURST_TIMEOUT_S,
        )  # fmt: skip
    size = QUICK if quick else FULL
    nodes = options.nodes or size["nodes"]
    pods = options.pods or size["pods"]
    paths = [p for p in options.paths.split(",") if p]
    if any(p not in PATHS for p in paths):
        raise SystemExit(f"bench real: --paths takes {PATHS}, got {paths}")
    if "stubhook" in paths:
        _stub(options)  # before the stack starts
    started = datetime.now(UTC)
    # SIGTERM (a `timeout` around the run) unwinds like an exception: the controller, in a session
    # of its own, is stopped and the stack too, instead of being left running against the next run
    signal.signal(signal.SIGTERM, _terminated)
    log = stack_dir() / "logs" / "bench-real-start.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    environment = dict(os.environ)
    if options.scheduler_qps:
        # as an operator would, for the whole cluster: both paths bind through kube-scheduler
        qps = options.scheduler_qps
        environment["SCHED_EXTRA_FLAGS"] = f"--kube-api-qps={qps:g} --kube-api-burst={2 * qps:.0f}"
    with log.open("ab") as out:
        subprocess.run(
            [str(stack_dir() / "start.sh"), "--clean"],
            check=True,
            stdout=out,
            stderr=out,
            env=environment,
        )
    if options.control_plane_nice:
        _renice_control_plane(options.control_plane_nice)
    rounds: list[dict[str, Any]] = []
    fake: ReadyNodes | None = None
    try:
        api = connect(
            kubeconfig=str(stack_dir() / "kubeconfig"),
            settings=ClientSettings(qps=0, connection_pool_maxsize=64, user_agent="bench-real"),
        )
        with api:
            _setup(api)
            fake = ReadyNodes(api, nodes)
            fake.create()
            fake.wait_schedulable()
            _progress(f"{nodes} nodes and their slices published, no taint left")
            plan = [(repeat, path) for repeat in range(options.repeat) for path in paths]
            for index, (repeat, path) in enumerate(plan):
                result = _round(api, path, options, pods, last=index == len(plan) - 1)
                result["repeat"] = repeat
                rounds.append(result)
                print(f"bench real: {_line(result)}", flush=True)
    finally:
        if fake is not None:
            fake.stop()
        subprocess.run([str(stack_dir() / "stop.sh"), "--quiet"], check=False)
    by_path = {
        path: statistics.median(r["pods_per_s"] for r in rounds if r["path"] == path)
        for path in paths
    }
    ratio = (
        round(by_path["controller"] / by_path["scheduler"], 2)
        if by_path.get("scheduler") and "controller" in by_path
        else None
    )
    return {
        "benchmark": "real",
        "result_name": f"real-{pods}pods-{nodes}nodes"
        + (f"-schedqps{options.scheduler_qps:g}" if options.scheduler_qps else "")
        + ("-stubhook" if "stubhook" in paths else "")
        + ("-stubcontroller" if "stubcontroller" in paths else "")
        + (f"-cpnice{options.control_plane_nice}" if options.control_plane_nice else "")
        + (f"-ctlnice{options.controller_nice}" if options.controller_nice else ""),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} CPUs, {_kubernetes_version()}, load before {_load()}",
        "quick": quick,
        "control_plane_nice": options.control_plane_nice,
        "controller_nice": options.controller_nice,
        "nodes": nodes,
        "gpus_per_node": GPUS_PER_NODE,
        "model": MODEL,
        "profile": PROFILE,
        "pods": pods,
        "clients": options.clients,
        "scheduler_client_qps": options.scheduler_qps or "default (50, burst 100)",
        "controller_workers": options.workers,
        "controller_args": options.controller_args,
        "rounds": rounds,
        "pods_per_s": by_path,
        "ratio": ratio,
        "yardsticks": yardstick_ratios(rounds),
        "targets": {"ratio": 3.0, "latency_p99_s": 3.0 if pods >= 1000 else 1.0, "overlaps": 0},
    }


YARDSTICKS: dict[str, tuple[str, str, str, float]] = {
    # name: (product path, yardstick path, figure, goal for the median of the per-round ratios)
    "controller_cpu_pregated_vs_stand_in": ("pregated", "stubcontroller", "cpu", 1.3),
    "controller_cpu_controller_vs_stand_in": ("controller", "stubcontroller", "cpu", 1.3),
    "webhook_latency_vs_stub": ("controller", "stubhook", "webhook", 1.1),
}
"""The product against its yardsticks, round by round (the same repeat index: the rounds of one
repeat run back to back, so they share the machine's state); the median of those ratios is the
figure, because one round's ratio swings with whatever else the machine did meanwhile."""


def _figure(r: dict[str, Any], figure: str) -> float | None:
    if figure == "cpu":
        value = r.get("controller_cpu_ms_per_pod")
    else:  # kube-apiserver's mean latency of the webhook calls of the burst
        value = (r.get("webhook") or {}).get("mean_ms")
    return float(value) if isinstance(value, int | float) and value > 0 else None


def yardstick_ratios(rounds: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each ``YARDSTICKS`` pair the run measured: its per-round ratios, their median, the goal."""
    by_round = {(r["path"], r.get("repeat", 0)): r for r in rounds}
    repeats = sorted({repeat for _, repeat in by_round})
    found: dict[str, dict[str, Any]] = {}
    for name, (product, yardstick, figure, goal) in YARDSTICKS.items():
        ratios = []
        for repeat in repeats:
            mine = _figure(by_round.get((product, repeat), {}), figure)
            theirs = _figure(by_round.get((yardstick, repeat), {}), figure)
            if mine is not None and theirs is not None:
                ratios.append(round(mine / theirs, 2))
        if ratios:
            median = round(statistics.median(ratios), 2)
            found[name] = {"per_round": ratios, "median": median, "goal": goal}
    return found


def _kubernetes_version() -> str:
    try:
        out = subprocess.run(
            [str(stack_dir() / "bin" / "kube-apiserver"), "--version"],
            capture_output=True, text=True, check=False, timeout=10,
        )  # fmt: skip
        return out.stdout.strip() or "kube-apiserver ?"
    except (OSError, subprocess.TimeoutExpired):
        return "kube-apiserver ?"


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _line(r: dict[str, Any]) -> str:
    text = (
        f"{r['path']:>10}: {r['bound']} bound, {r['pods_per_s']} pods/s, create->bound p50 "
        f"{r['latency_p50_s']} s p99 {r['latency_p99_s']} s max {r['latency_max_s']} s, "
        f"overlaps {r['overlaps']}"
    )
    if not r.get("finished", True):
        text += " (NOT all bound within the burst timeout)"
    if r.get("create_failures"):
        text += f", {r['create_failures']} creates refused"
    if "webhook" in r and r["webhook"].get("calls"):
        hook = r["webhook"]
        text += (
            f"; webhook (kube-apiserver) mean {hook['mean_ms']} ms p99 ~{hook['p99_ms']} ms, "
            f"{100 * hook['within_25ms']:.1f}% <= 25 ms, its sockets after {r.get('webhook_sockets')}"
        )
    if r.get("webhook_server", {}).get("calls"):
        served = r["webhook_server"]
        text += (
            f"; webhook (its server) mean {served['mean_ms']} ms p50 ~{served['p50_ms']} ms "
            f"p99 ~{served['p99_ms']} ms"
        )
    if "to_ungated_p99_s" in r:
        text += (
            f"; create->ungated p50 {r['to_ungated_p50_s']} s p99 {r['to_ungated_p99_s']} s, "
            f"ungated->bound p50 {r['ungated_to_bound_p50_s']} s "
            f"p99 {r['ungated_to_bound_p99_s']} s"
        )
    if r.get("stages"):
        stages = r["stages"]
        text += "; stages p50/p99/tail-mean s: " + ", ".join(
            f"{stage} {f['p50_s']}/{f['p99_s']}/{f['tail_mean_s']}"
            for stage in STAGES
            if (f := stages.get(stage))
        )
    if r.get("kube_scheduler"):
        sched = r["kube_scheduler"]
        text += (
            f"; kube-scheduler: {sched.get('client_requests'):.0f} requests, "
            f"{sched.get('client_throttled_s'):.1f} s waiting on its client limit"
        )
    if r.get("kube_apiserver"):
        text += f"; kube-apiserver APF wait {r['kube_apiserver'].get('flowcontrol_wait_s')} s"
    if r.get("runqueue_wait_s"):
        text += f"; waiting for a CPU (s) {r['runqueue_wait_s']}, machine {r.get('machine_cpu_s')}"
    if "controller_cpu_ms_per_pod" in r:
        text += (
            f"; CPU/pod controller {r['controller_cpu_ms_per_pod']} ms, webhook "
            f"{r.get('webhook_cpu_ms_per_pod')} ms; peak RSS {r['peak_rss_mib']}"
        )
    if r.get("system_cpu_s"):
        text += f"; of the CPU seconds, system (kernel) {r['system_cpu_s']}"
    if r.get("context_switches_per_pod"):
        text += f"; context switches per pod {r['context_switches_per_pod']}"
    if r.get("controller_counters"):
        text += f"; controller counters during the burst {r['controller_counters']}"
    return text


def summary(result: dict[str, Any]) -> str:
    if result.get("skipped"):
        return f"skipped: {result['skipped']}"
    lines = [
        f"{result['pods']} pods on {result['nodes']} nodes x {result['gpus_per_node']} "
        f"{result['model']} ({result['date']}; {result['machine']})"
    ]
    lines += [_line(r) for r in result["rounds"]]
    lines.append(f"pods/s (median per path): {json.dumps(result['pods_per_s'])}; "
                 f"ratio controller/scheduler {result['ratio']}")  # fmt: skip
    for name, figures in (result.get("yardsticks") or {}).items():
        verdict = "within" if figures["median"] <= figures["goal"] else "OVER"
        lines.append(
            f"{name}: per round {figures['per_round']}, median {figures['median']}x "
            f"({verdict} the goal of {figures['goal']}x)"
        )
    return "\n".join(lines)
