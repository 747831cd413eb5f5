"""Placement engine under a seeded churn trace: speed, memory, acceptance and stranding per policy.

The cluster: N nodes x 8 GPUs, each node one model (35 % A100-40GB, 20 % A100-80GB, 30 % H100-80GB,
15 % H200-141GB). Pods arrive as a Poisson process and live an exponential time (mean 1); each asks
for one profile class of one GPU family (demand follows supply): mostly 1g, some 1g with double
memory, 2g, 3g, 4g, 7g, a few 1g+me, and pods asking 2 or 3 slices on one GPU. The arrival rate is set
so that the *offered* load — arrival rate x mean lifetime x mean memory slices per pod — is the given
fraction of the cluster's memory slices.

Each run starts from the steady-state population (placed at time 0, not measured), then runs
``warm-up`` arrivals (not measured) and ``measured`` arrivals with their departures. A decision is
``place`` plus, when it fits, ``commit``; its time is what the latency figures describe.
``stranded`` counts rejected pods for which some single GPU had enough free memory slices when
counted without placement rules (the fragmentation a policy causes). Every (nodes, policy, load)
runs in a fresh subprocess so peak RSS is its own.
"""

import gc
import heapq
import itertools
import json
import math
import random
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from driver.mig.catalog import gpu_model
from driver.mig.model import GpuModel
from driver.placement import (
    DeviceRequest,
    Engine,
    GpuSpec,
    NodeSpec,
    Placed,
    PodRequest,
    same_gpu,
)

SEED = 20251130
GPUS_PER_NODE = 8
MODEL_MIX = (("A100-40GB", 35), ("A100-80GB", 20), ("H100-80GB", 30), ("H200-141GB", 15))

# Profile classes by position in the catalog's 8-slice profile tuple:
# 0 1g, 1 1g+me, 2 1g with 2x memory, 3 2g, 4 3g, 5 4g, 6 7g.
# A pod kind is a list of (class, count) that must share one GPU when there is more than one device.
POD_MIX: tuple[tuple[tuple[tuple[int, int], ...], int], ...] = (
    (((0, 1),), 49),
    (((1, 1),), 1),
    (((2, 1),), 6),
    (((3, 1),), 12),
    (((4, 1),), 8),
    (((5, 1),), 4),
    (((6, 1),), 5),
    (((0, 2),), 7),
    (((0, 3),), 4),
    (((0, 1), (3, 1)), 4),
)

FULL_SIZES = (100, 1_000, 10_000)
FULL_LOADS = (0.90, 0.95)
FULL_MEASURED_ARRIVALS = 50_000  # plus as many departures: ~100,000 events per run
WARMUP_TURNOVERS = 2.0  # warm-up arrivals = this x the steady-state population ...
WARMUP_CAP = 150_000  # ... but at most this many (about half a turnover at 10,000 nodes)


@dataclass(frozen=True, slots=True)
class RunSpec:
    nodes: int
    policy: str
    load: float
    measured_arrivals: int
    warmup_arrivals: int | None = None
    seed: int = SEED


@dataclass(frozen=True, slots=True)
class PodKind:
    request: PodRequest
    slices: int
    """Memory slices on the family it was drawn for (for the offered load)."""
    needs: tuple[tuple[str, int], ...]
    """(model name, memory slices on that model) for every model that has all its profiles."""


def _models() -> list[GpuModel]:
    return [gpu_model(name) for name, _ in MODEL_MIX]


def build_cluster(nodes: int, rng: random.Random) -> list[NodeSpec]:
    """Nodes of each model in exact proportion to ``MODEL_MIX`` (so each pool gets its share of
    the load), in a seeded random name order."""
    models = _models()
    total = sum(w for _, w in MODEL_MIX)
    counts = [nodes * w // total for _, w in MODEL_MIX]
    counts[0] += nodes - sum(counts)
    assigned = [m for m, c in zip(models, counts, strict=True) for _ in range(c)]
    rng.shuffle(assigned)
    specs = []
    for n, model in enumerate(assigned):
        gpus = tuple(
            GpuSpec(index=i, model=model, uuid=f"GPU-{n:05d}-{i}") for i in range(GPUS_PER_NODE)
        )
        specs.append(NodeSpec(name=f"node-{n:05d}", gpus=gpus))
    return specs


def pod_kinds() -> tuple[list[PodKind], list[float]]:
    models = _models()
    kinds: list[PodKind] = []
    weights: list[float] = []
    family_weights = [w for _, w in MODEL_MIX]
    for classes, weight in POD_MIX:
        for model, family_weight in zip(models, family_weights, strict=True):
            requests = tuple(
                DeviceRequest(
                    name=f"r{i}", profiles=frozenset({model.profiles[c].name}), count=count
                )
                for i, (c, count) in enumerate(classes)
            )
            many = sum(count for _, count in classes) > 1
            request = PodRequest(requests=requests, constraints=(same_gpu(),) if many else ())
            slices = sum(model.profiles[c].memory_slices * count for c, count in classes)
            needs = []
            for other in models:
                names = {p.name: p.memory_slices for p in other.profiles}
                wanted = [(next(iter(r.profiles)), r.count) for r in requests]
                if all(n in names for n, _ in wanted):
                    needs.append((other.name, sum(names[n] * c for n, c in wanted)))
            kinds.append(PodKind(request=request, slices=slices, needs=tuple(needs)))
            weights.append(weight * family_weight)
    return kinds, weights


class _FreeSlices:
    """Per model, how many GPUs have each number of free memory slices (for ``stranded``)."""

    def __init__(self, cluster: list[NodeSpec]) -> None:
        self.free: dict[tuple[str, int], int] = {}
        self.model: dict[tuple[str, int], str] = {}
        self.hist: dict[str, list[int]] = {}
        for node in cluster:
            for gpu in node.gpus:
                key = (node.name, gpu.index)
                slices = gpu.model.memory_slices
                self.free[key] = slices
                self.model[key] = gpu.model.name
                hist = self.hist.setdefault(gpu.model.name, [0] * (slices + 1))
                hist[slices] += 1

    def change(self, placed: Placed, sign: int) -> None:
        for a in placed.assignments:
            key = (a.node, a.gpu_index)
            hist = self.hist[self.model[key]]
            hist[self.free[key]] -= 1
            self.free[key] -= sign * a.size
            hist[self.free[key]] += 1

    def stranded(self, kind: PodKind) -> bool:
        """Some GPU of a model that has the pod's profiles has enough free slices for all of it."""
        for model, need in kind.needs:
            hist = self.hist.get(model)
            if hist is not None and any(hist[need:]):
                return True
        return False


def _percentile(sorted_values: list[int], fraction: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, math.ceil(fraction * len(sorted_values)) - 1))
    return float(sorted_values[index])


def simulate(spec: RunSpec) -> dict[str, Any]:
    """One run in this process: the figures for one (nodes, policy, load)."""
    started = time.perf_counter()
    rng = random.Random(spec.seed * 1_000_003 + spec.nodes)
    cluster = build_cluster(spec.nodes, rng)
    kinds, weights = pod_kinds()
    cumulative = list(itertools.accumulate(weights))
    mean_slices = sum(k.slices * w for k, w in zip(kinds, weights, strict=True)) / sum(weights)
    capacity = sum(g.model.memory_slices for n in cluster for g in n.gpus)
    rate = spec.load * capacity / mean_slices  # arrivals per unit time; lifetimes have mean 1
    population = round(rate)
    warmup = spec.warmup_arrivals
    if warmup is None:
        warmup = min(WARMUP_CAP, round(WARMUP_TURNOVERS * population))

    engine = Engine(policy=spec.policy)
    for node in cluster:
        engine.set_node(node)
    free = _FreeSlices(cluster)
    departures: list[tuple[float, int, Placed]] = []
    sequence = 0

    def admit(kind: PodKind, now: float, life: float) -> tuple[bool, int]:
        nonlocal sequence
        t0 = time.perf_counter_ns()
        result = engine.place(kind.request)
        if isinstance(result, Placed):
            engine.commit(result)
            elapsed = time.perf_counter_ns() - t0
            free.change(result, +1)
            sequence += 1
            heapq.heappush(departures, (now + life, sequence, result))
            return True, elapsed
        return False, time.perf_counter_ns() - t0

    def depart_until(now: float) -> None:
        while departures and departures[0][0] <= now:
            _, _, placed = heapq.heappop(departures)
            engine.release_placed(placed)
            free.change(placed, -1)

    # The steady-state population, in random order at time 0 (residual lifetimes are Exp(1) too).
    trace = random.Random(spec.seed)
    for _ in range(population):
        admit(trace.choices(kinds, cum_weights=cumulative)[0], 0.0, trace.expovariate(1.0))
    prefill_s = time.perf_counter() - started

    now = 0.0
    latencies: list[int] = []
    accepted = rejected = stranded = events = 0
    for arrival in range(warmup + spec.measured_arrivals):
        now += trace.expovariate(rate)
        kind = trace.choices(kinds, cum_weights=cumulative)[0]
        life = trace.expovariate(1.0)
        before = len(departures)
        depart_until(now)
        measured = arrival >= warmup
        if measured:
            events += 1 + before - len(departures)
        ok, elapsed = admit(kind, now, life)
        if not measured:
            continue
        latencies.append(elapsed)
        if ok:
            accepted += 1
        else:
            rejected += 1
            stranded += free.stranded(kind)

    latencies.sort()
    decisions = len(latencies)
    total_s = sum(latencies) / 1e9
    return {
        **asdict(spec),
        "warmup_arrivals": warmup,
        "prefill_pods": population,
        "events": events,
        "decisions": decisions,
        "accepted": accepted,
        "rejected": rejected,
        "stranded": stranded,
        "decisions_per_s": round(decisions / total_s, 1) if total_s else 0.0,
        "p50_us": round(_percentile(latencies, 0.50) / 1e3, 1),
        "p99_us": round(_percentile(latencies, 0.99) / 1e3, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "acceptance_rate": round(accepted / decisions, 4) if decisions else 0.0,
        "stranded_rate": round(stranded / decisions, 4) if decisions else 0.0,
        "mean_slices_per_pod": round(mean_slices, 3),
        "prefill_s": round(prefill_s, 1),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def _in_subprocess(spec: RunSpec) -> dict[str, Any]:
    output = subprocess.run(
        [sys.executable, "-m", "bench.placement", json.dumps(asdict(spec))],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return result


BENCH_POLICIES = ("firstfit", "bestfit")
"""The policies this benchmark compares at up to 10,000 nodes. ``scarcity`` is measured by the
simulate benchmark (``bench/simulate.py``) on the kept traces; its decision cost grows with the
number of distinct GPU states and it has not been measured at this benchmark's sizes."""


def run(*, quick: bool) -> dict[str, Any]:
    """Every (nodes, policy, load) of the full benchmark, or a tiny in-process one for ``quick``."""
    runs: list[dict[str, Any]] = []
    if quick:
        for policy in BENCH_POLICIES:
            spec = RunSpec(
                nodes=8, policy=policy, load=0.9, measured_arrivals=300, warmup_arrivals=100
            )
            runs.append(simulate(spec))
    else:
        for nodes in FULL_SIZES:
            for load in FULL_LOADS:
                for policy in BENCH_POLICIES:
                    spec = RunSpec(
                        nodes=nodes,
                        policy=policy,
                        load=load,
                        measured_arrivals=FULL_MEASURED_ARRIVALS,
                    )
                    runs.append(_in_subprocess(spec))
    return {
        "benchmark": "placement",
        "quick": quick,
        "seed": SEED,
        "runs": runs,
        "comparisons": _comparisons(runs),
        "scaling": _scaling(runs),
    }


def _comparisons(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (nodes, load): how many fewer requests bestfit rejects and strands than firstfit."""
    by_key = {(r["nodes"], r["load"], r["policy"]): r for r in runs}
    result = []
    for nodes, load in sorted({(r["nodes"], r["load"]) for r in runs}):
        first, best = by_key.get((nodes, load, "firstfit")), by_key.get((nodes, load, "bestfit"))
        if first is None or best is None:
            continue
        result.append(
            {
                "nodes": nodes,
                "load": load,
                "rejected": [first["rejected"], best["rejected"]],
                "stranded": [first["stranded"], best["stranded"]],
                "fewer_rejections": _fewer(first["rejected"], best["rejected"]),
                "fewer_stranded": _fewer(first["stranded"], best["stranded"]),
            }
        )
    return result


def _fewer(before: int, after: int) -> float | None:
    return round(1 - after / before, 3) if before else None


def _scaling(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (policy, load): decision time at the largest cluster over the smallest (p50 and mean)."""
    result = []
    for policy, load in sorted({(r["policy"], r["load"]) for r in runs}):
        sized = sorted(
            (r for r in runs if (r["policy"], r["load"]) == (policy, load)),
            key=lambda r: r["nodes"],
        )
        small, large = sized[0], sized[-1]
        if small is large or not small["decisions_per_s"] or not large["decisions_per_s"]:
            continue
        result.append(
            {
                "policy": policy,
                "load": load,
                "nodes": [small["nodes"], large["nodes"]],
                "p50_ratio": round(large["p50_us"] / small["p50_us"], 2),
                "mean_ratio": round(small["decisions_per_s"] / large["decisions_per_s"], 2),
            }
        )
    return result


_COLUMNS = (
    ("nodes", "{:>6}"),
    ("load", "{:>5.2f}"),
    ("policy", "{:>9}"),
    ("decisions_per_s", "{:>10.0f}"),
    ("p50_us", "{:>8.1f}"),
    ("p99_us", "{:>8.1f}"),
    ("peak_rss_mb", "{:>8.1f}"),
    ("acceptance_rate", "{:>8.4f}"),
    ("stranded_rate", "{:>8.4f}"),
)


def summary(result: dict[str, Any]) -> str:
    header = (
        "nodes",
        "load",
        "policy",
        "decisions/s",
        "p50 µs",
        "p99 µs",
        "RSS MB",
        "accept",
        "strand",
    )
    widths = (6, 5, 9, 10, 8, 8, 8, 8, 8)
    lines = [" ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    for r in result["runs"]:
        lines.append(" ".join(fmt.format(r[key]) for key, fmt in _COLUMNS))
    for c in result.get("comparisons", []):
        lines.append(
            f"{c['nodes']:>6} nodes, load {c['load']:.2f}: bestfit rejects "
            f"{c['rejected'][1]} vs firstfit {c['rejected'][0]} ({_percent(c['fewer_rejections'])} "
            f"fewer), strands {c['stranded'][1]} vs {c['stranded'][0]} "
            f"({_percent(c['fewer_stranded'])} fewer)"
        )
    for sc in result.get("scaling", []):
        lines.append(
            f"{sc['policy']:>9} at load {sc['load']:.2f}: decision time at {sc['nodes'][1]} nodes / "
            f"{sc['nodes'][0]} nodes = {sc['p50_ratio']}x (p50), {sc['mean_ratio']}x (mean)"
        )
    return "\n".join(lines)


def _percent(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{fraction:.0%}"


def _worker(argv: list[str]) -> int:
    gc.collect()
    spec = RunSpec(**json.loads(argv[0]))
    print(json.dumps(simulate(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
