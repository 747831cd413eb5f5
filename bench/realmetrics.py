"""Reading the real control plane's own figures, and where a Python process spends its CPU.

``bench real`` differences these over a burst: kube-apiserver's webhook admission histogram and its
priority-and-fairness queueing, kube-scheduler's client throttling (Prometheus text from their
``/metrics``, read by ``prometheus_client``'s parser of the text exposition format); and it can
sample the controller and its webhook process with py-spy. Pure arithmetic on parsed samples here,
apart from the one scrape of kube-scheduler and the py-spy processes.
"""

from __future__ import annotations

import functools
import signal
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

APISERVER_WEBHOOK_DURATION = "apiserver_admission_webhook_admission_duration_seconds"
SERVER_WEBHOOK_DURATION = "instaslice_webhook_request_duration_seconds"
"""Our webhook's own histogram of the same calls (server side), in the controller's /metrics."""


@functools.lru_cache(maxsize=8)
def samples(metrics: str) -> tuple[Sample, ...]:
    """Every sample of a ``/metrics`` text (parsed once per text: a scrape is read several ways)."""
    return tuple(s for family in text_string_to_metric_families(metrics) for s in family.samples)


def webhook_histogram(metrics: str, webhooks: Iterable[str]) -> dict[str, Any]:
    """kube-apiserver's admission-duration histogram of ``webhooks`` (summed over label sets)."""
    names = frozenset(webhooks)
    return histogram(
        metrics, APISERVER_WEBHOOK_DURATION, keep=lambda labels: labels.get("name") in names
    )


def histogram(
    metrics: str, name: str, *, keep: Callable[[Mapping[str, str]], bool] = lambda labels: True
) -> dict[str, Any]:
    """The histogram ``name`` (its series whose labels ``keep`` accepts, summed over label sets)."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    for sample in samples(metrics):
        if not sample.name.startswith(name) or not keep(sample.labels):
            continue
        if sample.name == f"{name}_bucket":
            le = float(sample.labels["le"])
            buckets[le] = buckets.get(le, 0.0) + sample.value
        elif sample.name == f"{name}_sum":
            total += sample.value
        elif sample.name == f"{name}_count":
            count += sample.value
    return {"buckets": buckets, "sum": total, "count": count}


def histogram_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the histogram gained between two scrapes: calls, mean, share ≤ 25 ms, p50/p99 (linear
    inside a bucket, as Prometheus' ``histogram_quantile``)."""
    count = float(after["count"] - before["count"])
    if count <= 0:
        return {"calls": 0}
    cumulative: list[tuple[float, float]] = sorted(
        (le, after["buckets"][le] - before["buckets"].get(le, 0.0)) for le in after["buckets"]
    )

    def quantile(q: float) -> float:
        rank = q * count
        lower, below = 0.0, 0.0
        for le, seen in cumulative:
            if seen >= rank:
                if le == float("inf"):
                    return lower
                share = (rank - below) / (seen - below) if seen > below else 1.0
                return lower + (le - lower) * share
            lower, below = le, seen
        return lower

    within = dict(cumulative).get(0.025, 0.0)
    return {
        "calls": int(count),
        "mean_ms": round(1000 * (after["sum"] - before["sum"]) / count, 2),
        "p50_ms": round(1000 * quantile(0.50), 2),
        "p99_ms": round(1000 * quantile(0.99), 2),
        "within_25ms": round(within / count, 4),
        "over_100ms": round(1 - dict(cumulative).get(0.1, 0.0) / count, 4),
        "buckets": {str(le): int(seen) for le, seen in cumulative},
    }


def metric_total(metrics: str, name: str, *, labels: Mapping[str, str] | None = None) -> float:
    """The sum of the samples of ``name`` (every label set; only those with ``labels``' values)."""
    wanted = (labels or {}).items()
    return sum(
        sample.value
        for sample in samples(metrics)
        if sample.name == name and wanted <= sample.labels.items()
    )


SCHEDULER_COUNTERS = {
    # kube-scheduler's client: time its requests waited for its own QPS limit, and how many it sent
    "client_throttled_s": "rest_client_rate_limiter_duration_seconds_sum",
    "client_throttled_requests": "rest_client_rate_limiter_duration_seconds_count",
    "client_requests": "rest_client_requests_total",
    "schedule_attempts": "scheduler_schedule_attempts_total",
}
APISERVER_COUNTERS = {
    # kube-apiserver's priority and fairness: time requests queued before being served
    "flowcontrol_wait_s": "apiserver_flowcontrol_request_wait_duration_seconds_sum",
    "flowcontrol_requests": "apiserver_flowcontrol_request_wait_duration_seconds_count",
}


def by_label(metrics: str, name: str, label: str) -> dict[str, float]:
    """The samples of ``name`` summed per value of ``label``."""
    found: dict[str, float] = {}
    for sample in samples(metrics):
        if sample.name == name:
            key = sample.labels.get(label, "")
            found[key] = found.get(key, 0.0) + sample.value
    return found


FLOW_WAIT = "apiserver_flowcontrol_request_wait_duration_seconds_sum"


def counters(metrics: str, names: dict[str, str]) -> dict[str, float]:
    return {key: metric_total(metrics, name) for key, name in names.items()}


def counters_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: round(after[key] - before.get(key, 0.0), 3) for key in after}


CONTROLLER_COUNTER_PREFIX = "instaslice_controller_"


def controller_counters(metrics: str) -> dict[str, float]:
    """Every counter sample of our controller's ``/metrics``, keyed ``name{label=value,…}``: what
    a burst made it do besides placing pods (problems reported, write conflicts, hand-offs)."""
    found: dict[str, float] = {}
    for sample in samples(metrics):
        if sample.name.startswith(CONTROLLER_COUNTER_PREFIX) and sample.name.endswith("_total"):
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            found[f"{sample.name.removeprefix(CONTROLLER_COUNTER_PREFIX)}{{{labels}}}"] = (
                sample.value
            )
    return found


def scheduler_metrics(pki: Path) -> str:
    """kube-scheduler's /metrics (its secure port, read as the admin whose certificate is in
    ``pki``)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # its serving certificate is self-signed
    context.load_cert_chain(certfile=pki / "admin.crt", keyfile=pki / "admin.key")
    try:
        with urllib.request.urlopen(
            "https://127.0.0.1:10259/metrics", context=context, timeout=10
        ) as reply:
            return str(reply.read().decode())
    except OSError as exc:
        print(f"bench: kube-scheduler metrics unread: {exc}", file=sys.stderr)
        return ""


class Profiler:
    """py-spy sampling some processes until ``stop``; their folded stacks land in ``folder``. Only
    samples of a thread holding the interpreter lock are kept (``--gil``): where the CPU goes, not
    where threads wait for the API server."""

    def __init__(self, folder: Path, pids: dict[str, int | None], *, tag: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.outputs: dict[str, Path] = {}
        self._processes: list[subprocess.Popen[bytes]] = []
        spy = Path(sys.executable).parent / "py-spy"
        for name, pid in pids.items():
            if pid is None:
                continue
            output = folder / f"{tag}-{name}.folded"
            self.outputs[name] = output
            command = [str(spy) if spy.exists() else "py-spy", "record", "--pid", str(pid),
                       "--rate", "200", "--format", "raw", "--output", str(output),
                       "--nonblocking", "--gil"]  # fmt: skip
            self._processes.append(
                subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )

    def stop(self) -> dict[str, dict[str, list[tuple[str, float]]]]:
        for process in self._processes:
            process.send_signal(signal.SIGINT)
        for process in self._processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return {name: top_functions(path) for name, path in self.outputs.items() if path.exists()}


def top_functions(folded: Path, count: int = 15) -> dict[str, list[tuple[str, float]]]:
    """From py-spy's folded stacks: the functions most often on top of a stack (``self``) and
    anywhere in it (``total``), as shares of all samples, idle threads left out."""
    own: dict[str, int] = {}
    anywhere: dict[str, int] = {}
    samples = 0
    for line in folded.read_text().splitlines():
        stack, _, number = line.rpartition(" ")
        if not stack or not number.isdigit():
            continue
        frames = []
        for frame in stack.split(";"):  # "function (path/file.py:line)"
            function, _, where = frame.rpartition(" (")
            frames.append(f"{function} ({where.rstrip(')').rsplit('/', 1)[-1]})")
        n = int(number)
        samples += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames[1:]):  # the first frame is the thread
            anywhere[frame] = anywhere.get(frame, 0) + n

    def top(table: dict[str, int]) -> list[tuple[str, float]]:
        ranked = sorted(table.items(), key=lambda item: -item[1])[:count]
        return [(frame, round(n / samples, 3)) for frame, n in ranked]

    return {"samples": [("all", float(samples))], "self": top(own), "total": top(anywhere)}
