"""How long a high-priority pod waits on a full fleet: our controller preempting lower-priority
pods through the Eviction API, on the real control plane.

Uses the real Kubernetes 1.36 stack as ``bench real`` does (``$INSTASLICE_REALSTACK``, default
``/tmp/k8s``; started fresh with ``start.sh --clean``, stopped at the end; hold its lock; skips with
one line when it is not built), the same nodes (Node objects kept Ready with the ResourceSlices our
kubelet plugin publishes for 8 A100-40GB each, ``bench.realnodes``) and our controller with its
webhook (``bench.real``'s ``_Controller``, default flags, so ``--preemption on``; it logs at INFO,
whose line per preemption gives the decision's fit checks).

The run: PriorityClasses ``bench-low`` (0) and ``bench-high`` (1000); the fleet filled with
``bench-low`` pods of ``--fill-profile`` (3g.20gb: 2 per GPU; 1g.5gb: 7), each with its own
ResourceClaim, until every placement of that profile is taken; then ``bench-high`` pods asking a
3g.20gb, first ``--one-by-one`` of them, each created once the one before is bound, then a
``--burst`` created at once. Each fits nowhere, so the controller picks victims, holds the GPU,
evicts, and places the pod once the victims' claims are deallocated; kube-scheduler binds it.

Nothing stands in for the kubelet: every pod has ``terminationGracePeriodSeconds: 0``, and
kube-apiserver deletes a bound pod whose grace period is 0 at once (no kubelet is asked to confirm a
graceless deletion), whether the Eviction API or anyone else deletes it. With a kubelet and a grace
period, a victim's grace period adds to these figures. The run counts victims seen terminating but
never gone (``stuck_terminating``: must be none; such a victim would keep its slices taken until
the preemptor's hold expired).

Figures per phase: create→bound p50/p99/max (create call sent → ``spec.nodeName`` seen by an
informer here); the victims each preemption took (from the preemptor's hold annotation) against the
fewest the MIG layout allows (``minimal``; ``bench.preemptiontimeline.minimal_victims``); the
preemptions per pod (more than one: its hold expired and it preempted again); the stages of each
pod's way (``STAGES``). Over the run: the ``Preempted`` events (victims per preemptor, victims
evicted more than once: must be none), kube-apiserver's count of eviction requests by response
code, the controller's counters, the fit checks each decision logged, overlapping allocations
(must be 0), and low-priority pods gone that no preemption named (must be none).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from api.names import profile_device_class
from bench.preemptiontimeline import (
    STAGES,
    Seen,
    Timeline,
    evictions_from_events,
    minimal_victims,
    per_gpu,
    stage_figures,
    stage_times,
)
from bench.real import (
    NS,
    _Controller,
    _kubernetes_version,
    _load,
    _setup,
    _terminated,
    missing,
    stack_dir,
)
from bench.realmetrics import controller_counters, counters_delta, samples
from bench.realnodes import GPUS_PER_NODE, MODEL, ReadyNodes, latency_figures, overlaps
from controller.settings import DEFAULT_WORKERS
from driver.cluster.kube import KubeClusterApi, connect
from driver.cluster.port import EVENTS, PODS, PRIORITY_CLASSES, RESOURCE_CLAIMS, JsonObject
from driver.cluster.throttle import ClientSettings

FULL = {"nodes": 20, "one_by_one": 10, "burst": 10}
QUICK = {"nodes": 2, "one_by_one": 2, "burst": 2}
FILL_PROFILES = ("3g.20gb", "1g.5gb")
ASK = "3g.20gb"
CLASSES = {"bench-low": 0, "bench-high": 1000}
CLIENTS = 16
FILL_TIMEOUT_S = 600.0
PREEMPTOR_TIMEOUT_S = 120.0
"""Seconds one preemptor (or the whole burst) may take to be bound; past it the run goes on and
says so."""
_FIT_CHECKS = re.compile(r"pod \S+/(\S+) \(priority -?\d+\) preempts .* \((\d+) fit checks\)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("preemption (python -m bench preemption)")
    group.add_argument(
        "--fleet-nodes",
        type=int,
        help=f"nodes of {GPUS_PER_NODE} {MODEL} (default {FULL['nodes']})",
    )
    group.add_argument(
        "--fill-profile",
        choices=FILL_PROFILES,
        default=FILL_PROFILES[0],
        help="the low-priority pods' MIG profile (default %(default)s)",
    )
    group.add_argument(
        "--one-by-one",
        type=int,
        help=f"preemptors created one at a time (default {FULL['one_by_one']})",
    )
    group.add_argument(
        "--burst",
        type=int,
        help=f"preemptors created at once after those (default {FULL['burst']})",
    )


def run(*, quick: bool, options: argparse.Namespace | None = None) -> dict[str, Any]:
    reason = missing()
    if reason is not None:
        print(f"bench preemption: skipped: {reason}")
        return {"benchmark": "preemption", "skipped": reason}
    size = QUICK if quick else FULL
    nodes = getattr(options, "fleet_nodes", None) or size["nodes"]
    fill = getattr(options, "fill_profile", None) or FILL_PROFILES[0]
    one_by_one = getattr(options, "one_by_one", None) or size["one_by_one"]
    burst = getattr(options, "burst", None) or size["burst"]
    started = datetime.now(UTC)
    machine = f"{os.cpu_count()} CPUs, {_kubernetes_version()}, load before {_load()}"
    # SIGTERM (a `timeout` around the run) unwinds like an exception: controller and stack stop
    signal.signal(signal.SIGTERM, _terminated)
    log = stack_dir() / "logs" / "bench-preemption-start.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        subprocess.run(
            [str(stack_dir() / "start.sh"), "--clean"], check=True, stdout=out, stderr=out
        )
    fleet: ReadyNodes | None = None
    try:
        api = connect(
            kubeconfig=str(stack_dir() / "kubeconfig"),
            settings=ClientSettings(qps=0, connection_pool_maxsize=64, user_agent="bench-preempt"),
        )
        with api:
            _setup(api)
            for name, value in CLASSES.items():
                api.create(PRIORITY_CLASSES, _priority_class(name, value))
            fleet = ReadyNodes(api, nodes)
            fleet.create()
            fleet.wait_schedulable()
            _progress(f"{nodes} nodes and their slices published, no taint left")
            capacity = nodes * GPUS_PER_NODE * per_gpu(model=MODEL, profile=fill)
            figures = _measure(
                api, fill=fill, one_by_one=one_by_one, burst=burst, capacity=capacity
            )
    finally:
        if fleet is not None:
            fleet.stop()
        subprocess.run([str(stack_dir() / "stop.sh"), "--quiet"], check=False)
    return {
        "benchmark": "preemption",
        "result_name": f"preemption-{fill}-{nodes}nodes",
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine,
        "quick": quick,
        "nodes": nodes,
        "gpus_per_node": GPUS_PER_NODE,
        "model": MODEL,
        "fill_profile": fill,
        "ask_profile": ASK,
        "minimal_victims": minimal_victims(model=MODEL, fill=fill, ask=ASK),
        "priority_classes": CLASSES,
        **figures,
    }


def _measure(
    api: KubeClusterApi, *, fill: str, one_by_one: int, burst: int, capacity: int
) -> dict[str, Any]:
    """Start the controller, fill the fleet, run both phases of preemptors, check the outcome."""
    timeline = Timeline(api, namespace=NS)
    with tempfile.TemporaryDirectory(prefix="bench-preemption-") as tmp:
        controller = _Controller(
            api, Path(tmp), workers=DEFAULT_WORKERS, extra=["--log-level", "INFO"], webhook=True
        )
        try:
            timeline.start()
            low = [f"low-{i:05d}" for i in range(capacity)]
            filled = _fill(api, timeline, low, profile=fill)
            _progress(f"fleet full: {filled['bound']} {fill} pods bound in {filled['wall_s']} s")
            apiserver_before = _evictions(api)
            counters_before = controller_counters(controller.scrape())
            ran = [
                _phase(
                    api, timeline, [f"high-a-{i:03d}" for i in range(one_by_one)], at_once=False
                ),
                _phase(api, timeline, [f"high-b-{i:03d}" for i in range(burst)], at_once=True),
            ]
            evictions = counters_delta(apiserver_before, _evictions(api))
            done = {
                key: value
                for key, value in counters_delta(
                    counters_before, controller_counters(controller.scrape())
                ).items()
                if value and ("preempt" in key or "hold" in key or "reserv" in key)
            }
            fit_checks = _fit_checks(Path(tmp) / "controller.log")
        finally:
            controller.stop()
            timeline.stop()
            _keep_log(Path(tmp) / "controller.log")
    events = evictions_from_events(
        api.list_objects(EVENTS, namespace=NS, field_selector="reason=Preempted").items
    )
    allocated, found = overlaps(api, namespace=NS)
    seen = timeline.seen  # the informers are stopped: read without the lock
    named = {v for pod in seen.pods.values() for hold in pod.holds for v in hold.victims}
    gone_low = sorted(n for n in low if (p := seen.pods.get(n)) and p.gone is not None)
    stuck = sorted(n for n in low if (p := seen.pods.get(n)) and p.terminating and p.gone is None)
    return {
        "fill": filled,
        "phases": [_phase_figures(seen, phase, fit_checks) for phase in ran],
        "events": events,
        "eviction_requests_by_code": {k: v for k, v in evictions.items() if v},
        "controller_counters": done,
        "victims_gone": len(gone_low),
        "gone_but_not_named": sorted(set(gone_low) - named),
        "stuck_terminating": stuck,
        "allocated": allocated,
        "overlaps": found,
    }


def _priority_class(name: str, value: int) -> JsonObject:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "description": "bench preemption",
    }


def _claim(name: str, *, profile: str) -> JsonObject:
    request = {"name": "mig", "exactly": {"deviceClassName": profile_device_class(profile)}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [request]}},
    }


def _pod(name: str, *, priority_class: str) -> JsonObject:
    """A pod using the claim of its own name."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "priorityClassName": priority_class,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [
                {"name": "main", "image": "busybox:1", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


def _create(api: KubeClusterApi, timeline: Timeline, name: str, *, priority_class: str) -> None:
    timeline.sent(name)
    timeline.created(
        name, api.create(PODS, _pod(name, priority_class=priority_class), namespace=NS)
    )


def _create_claims(api: KubeClusterApi, names: Sequence[str], *, profile: str) -> None:
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(
            pool.map(
                lambda n: api.create(RESOURCE_CLAIMS, _claim(n, profile=profile), namespace=NS),
                names,
            )
        )


def _fill(
    api: KubeClusterApi, timeline: Timeline, names: list[str], *, profile: str
) -> dict[str, Any]:
    """Every placement of ``profile`` taken by a ``bench-low`` pod (claims made first)."""
    _create_claims(api, names, profile=profile)
    _progress(f"{len(names)} claims created; filling the fleet")
    first = time.monotonic()
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(lambda n: _create(api, timeline, n, priority_class="bench-low"), names))
    finished = timeline.wait_bound(names, timeout=FILL_TIMEOUT_S)
    bound = [s.bound for n in names if (s := timeline.seen.pods[n]).bound is not None]
    last = max(bound, default=first)
    return {
        "pods": len(names),
        "bound": len(bound),
        "finished": finished,
        "wall_s": round(last - first, 2),
        "pods_per_s": round(len(bound) / (last - first), 1) if last > first else 0.0,
    }


@dataclass(frozen=True, slots=True)
class _Ran:
    """One phase as it ran; its figures are read from the timeline afterwards."""

    kind: str
    names: list[str]
    first: float
    """When its first create was sent (monotonic)."""
    finished: bool
    """Every pod bound within ``PREEMPTOR_TIMEOUT_S``."""


def _phase(api: KubeClusterApi, timeline: Timeline, names: list[str], *, at_once: bool) -> _Ran:
    """``bench-high`` pods asking ``ASK`` on the full fleet, one by one or all at once."""
    kind = "burst" if at_once else "one-by-one"
    _create_claims(api, names, profile=ASK)
    _progress(f"{kind}: {len(names)} preemptors")
    first = time.monotonic()
    finished = True
    if at_once:
        with ThreadPoolExecutor(len(names)) as pool:
            list(pool.map(lambda n: _create(api, timeline, n, priority_class="bench-high"), names))
        finished = timeline.wait_bound(names, timeout=PREEMPTOR_TIMEOUT_S)
    else:
        for name in names:
            _create(api, timeline, name, priority_class="bench-high")
            finished = timeline.wait_bound([name], timeout=PREEMPTOR_TIMEOUT_S) and finished
    return _Ran(kind=kind, names=names, first=first, finished=finished)


def _phase_figures(seen: Seen, ran: _Ran, fit_checks: dict[str, int]) -> dict[str, Any]:
    latency: dict[str, float] = {}
    pods: list[dict[str, Any]] = []
    for name in ran.names:
        pod = seen.pods[name]
        if pod.bound is not None and pod.sent is not None:
            latency[name] = pod.bound - pod.sent
        pods.append(
            {
                "pod": name,
                # when its create was sent, from the phase's first; then each stage's seconds
                "sent_s": round(pod.sent - ran.first, 3) if pod.sent is not None else None,
                "latency_s": round(latency[name], 3) if name in latency else None,
                "node": pod.node,
                "gated_at_creation": pod.gated_at_creation,
                "preemptions": len(pod.holds),
                "victims": [list(h.victims) for h in pod.holds],
                "held_node": pod.holds[-1].node if pod.holds else None,
                "fit_checks": fit_checks.get(name),
                "stages_s": {k: round(v, 3) for k, v in stage_times(seen, name).items()},
            }
        )
    victims = [len(h.victims) for name in ran.names for h in seen.pods[name].holds]
    last = max((seen.pods[n].bound or ran.first for n in ran.names), default=ran.first)
    return {
        "phase": ran.kind,
        "pods": len(ran.names),
        "bound": len(latency),
        "finished": ran.finished,
        "wall_s": round(last - ran.first, 3),
        **latency_figures(list(latency.values()), prefix="latency"),
        "preemptions": len(victims),
        "victims_per_preemption": {
            "min": min(victims, default=0),
            "max": max(victims, default=0),
            "mean": round(statistics.fmean(victims), 2) if victims else 0.0,
            "total": sum(victims),
        },
        "pods_preempting_more_than_once": sum(1 for p in pods if p["preemptions"] > 1),
        "pods_without_preemption": sum(1 for p in pods if p["preemptions"] == 0),
        "bound_off_the_held_node": sum(
            1 for p in pods if p["held_node"] and p["node"] and p["node"] != p["held_node"]
        ),
        "stages": stage_figures(stage_times(seen, name) for name in ran.names),
        "per_pod": pods,
    }


def _evictions(api: KubeClusterApi) -> dict[str, float]:
    """kube-apiserver's eviction requests so far, by response code."""
    text = api.request("GET", "/metrics", accept="text/plain").decode()
    found: dict[str, float] = {}
    for sample in samples(text):
        labels = sample.labels
        if (
            sample.name == "apiserver_request_total"
            and labels.get("resource") == "pods"
            and labels.get("subresource") == "eviction"
        ):
            found[labels.get("code", "?")] = found.get(labels.get("code", "?"), 0.0) + sample.value
    return found


def _fit_checks(log: Path) -> dict[str, int]:
    """Per preemptor, the fit checks its last preemption decision took (the controller's log)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return {}
    return {m.group(1): int(m.group(2)) for m in _FIT_CHECKS.finditer(text)}


def _keep_log(log: Path) -> None:
    """The controller's log beside the stack's, for a look after the run."""
    try:
        (stack_dir() / "logs" / "bench-preemption-controller.log").write_bytes(log.read_bytes())
    except OSError as exc:
        print(f"bench preemption: controller log not kept: {exc}", file=sys.stderr)


def _progress(message: str) -> None:
    print(f"bench preemption: {datetime.now(UTC):%H:%M:%S} {message}", file=sys.stderr, flush=True)


def summary(result: dict[str, Any]) -> str:
    if result.get("skipped"):
        return f"skipped: {result['skipped']}"
    fill = result["fill"]
    minimal = result["minimal_victims"]
    lines = [
        f"{result['nodes']} nodes x {result['gpus_per_node']} {result['model']} full of "
        f"{fill['bound']}/{fill['pods']} {result['fill_profile']} bench-low pods (bound in "
        f"{fill['wall_s']} s, {fill['pods_per_s']} pods/s); bench-high pods ask "
        f"{result['ask_profile']} ({result['date']}; {result['machine']})",
        f"{'phase':<11} {'pods':>4} {'bound':>5} {'p50 s':>7} {'p99 s':>7} {'max s':>7} "
        f"{'victims/preemption':>19} {'preemptions':>11} {'fit checks max':>14}",
    ]
    for phase in result["phases"]:
        v = phase["victims_per_preemption"]
        checks = [p["fit_checks"] for p in phase["per_pod"] if p.get("fit_checks") is not None]
        taken = f"{v['min']}-{v['max']} (min {minimal})"
        lines.append(
            f"{phase['phase']:<11} {phase['pods']:>4} {phase['bound']:>5} "
            f"{_s(phase['latency_p50_s'])} {_s(phase['latency_p99_s'])} "
            f"{_s(phase['latency_max_s'])} {taken:>19} {phase['preemptions']:>11} "
            f"{max(checks, default=0):>14}"
        )
    for phase in result["phases"]:
        stages = ", ".join(
            f"{stage} {f['p50_s']}/{f['max_s']}"
            for stage in STAGES
            if (f := phase["stages"].get(stage))
        )
        lines.append(
            f"{phase['phase']}: stages p50/max s: {stages}; pods preempting more than once "
            f"{phase['pods_preempting_more_than_once']}, without a preemption "
            f"{phase['pods_without_preemption']}, bound off the held node "
            f"{phase['bound_off_the_held_node']}"
            + ("" if phase["finished"] else f"; NOT all bound within {PREEMPTOR_TIMEOUT_S:.0f} s")
        )
    events = result["events"]
    lines.append(
        f"evictions: {events['victims']} victims in {events['events']} Preempted events, evicted "
        f"more than once: {events['evicted_more_than_once'] or 'none'}; kube-apiserver eviction "
        f"requests by code {result['eviction_requests_by_code']}; low pods gone "
        f"{result['victims_gone']}, gone but named by no preemption: "
        f"{result['gone_but_not_named'] or 'none'}, stuck terminating: "
        f"{result['stuck_terminating'] or 'none'}; overlaps {result['overlaps']}"
    )
    lines.append(f"controller counters during the preemptions: {result['controller_counters']}")
    return "\n".join(lines)


def _s(value: float | None) -> str:
    return f"{value:>7.2f}" if value is not None else f"{'-':>7}"
