"""One soak from start to report: the stack up, warm-up under churn, the faults, a cool-down, the
churn quiesced and the final checks, then the figures.

The fault phase lasts until ``minutes`` minus the cool-down, and at least until one round of every
kind is done (on a slow machine the soak then runs longer than asked rather than skip a kind).
"""

from __future__ import annotations

import csv
import logging
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from localcluster.realstack import RealStackConfig
from localcluster.soak import checks, faults
from localcluster.soak.checks import Invariants, Violation
from localcluster.soak.churn import Churn
from localcluster.soak.faults import FaultRunner
from localcluster.soak.ledger import PodLedger
from localcluster.soak.metrics import leading
from localcluster.soak.report import SoakResult
from localcluster.soak.resources import ResourceSampler, Sample, growth
from localcluster.soak.stack import Daemon, SoakStack
from localcluster.soak.timeline import Timeline

log = logging.getLogger(__name__)

NODE_MONITOR_GRACE: Final = "20s"
"""kube-controller-manager marks a silent Node NotReady after this (its default is 50 s)."""


@dataclass(frozen=True, slots=True)
class SoakConfig:
    minutes: float = 20.0
    seed: int = 1
    nodes: int = 3
    gpus: str = "2xA100-40GB"
    out: Path = Path("/tmp/instaslice-soak")
    warmup_s: float = 150.0
    cooldown_s: float = 120.0
    kinds: tuple[str, ...] = faults.KINDS
    """The fault kinds to inject (all by default)."""


def _stack_config(config: SoakConfig) -> RealStackConfig:
    return RealStackConfig(
        nodes=config.nodes,
        gpus=config.gpus,
        controllers=2,
        control_plane_env={"KCM_EXTRA_FLAGS": f"--node-monitor-grace-period={NODE_MONITOR_GRACE}"},
    )


def run_soak(config: SoakConfig) -> SoakResult:
    config.out.mkdir(parents=True, exist_ok=True)
    timeline = Timeline(config.out / "timeline.jsonl")
    stack = SoakStack(_stack_config(config))
    timeline.note("phase", "starting the stack", root=str(stack.root))
    stack.start()
    try:
        return _soak(config, stack, timeline)
    finally:
        timeline.note("phase", "stopping the stack")
        stack.stop(keep_logs=config.out / "logs")
        control_plane_logs = stack.paths.control_plane / "logs"
        if control_plane_logs.is_dir():
            shutil.copytree(
                control_plane_logs, config.out / "logs" / "control-plane", dirs_exist_ok=True
            )


def _soak(config: SoakConfig, stack: SoakStack, timeline: Timeline) -> SoakResult:
    rng = random.Random(config.seed)  # noqa: S311 - a reproducible churn, not security
    churn = Churn(api=stack.api, rng=rng, timeline=timeline)
    churn.setup()
    ledger = PodLedger(api=stack.api, now=timeline.now)
    ledger.start()
    runner = FaultRunner(stack=stack, timeline=timeline)
    invariants = Invariants(
        stack=stack, ledger=ledger, timeline=timeline, expected_down=runner.expected_down
    )
    sampler = ResourceSampler(
        daemons=stack.running_daemons, now=timeline.now, phase=lambda d: _phase(stack, d)
    )
    sampler.start()
    invariants.start()
    churn.start()
    timeline.note("phase", f"warm-up {config.warmup_s:.0f}s")
    time.sleep(config.warmup_s)
    warmed_at = timeline.now()

    total_s = config.minutes * 60
    fault_end = total_s - config.cooldown_s
    planned = faults.plan(seed=config.seed, nodes=stack.node_names, rounds=50, kinds=config.kinds)
    timeline.note("phase", f"faults until {fault_end:.0f}s (at least one of each kind)")
    for index, fault in enumerate(planned):
        if index >= len(config.kinds) and timeline.now() + fault.pause_s >= fault_end:
            break
        time.sleep(fault.pause_s)
        runner.run(fault)
    timeline.note("phase", "cool-down")
    time.sleep(max(0.0, total_s - timeline.now()))
    churn_end = timeline.now()

    timeline.note("phase", "quiescing: every workload deleted")
    churn.quiesce()
    invariants.stop()
    sampler.stop()
    final = _after_quiesce(stack, timeline)
    write_samples(sampler.snapshot(), config.out / "resources.csv")
    outcomes = ledger.outcomes()
    ledger.stop()
    timeline.note("phase", "done")
    return SoakResult(
        seed=config.seed,
        kinds=config.kinds,
        minutes=round(churn_end / 60, 1),
        nodes=config.nodes,
        faults=runner.records,
        pods=outcomes,
        churn={**dict(churn.actions), **{f"failed {k}": v for k, v in churn.failed_writes.items()}},
        violations=[*invariants.violations, *final],
        growth=growth(
            [s for s in sampler.snapshot() if s.at_s <= churn_end],
            soak_s=churn_end,
            soak_warmup_s=warmed_at,
        ),
        checks=invariants.checks,
        failed_reads=invariants.failed_reads,
        cache_excess=dict(invariants.cache_excess),
    )


def _phase(stack: SoakStack, daemon: Daemon) -> str | None:
    """A controller leads or stands by (None: it did not say); the other daemons have no phase."""
    if not daemon.role.startswith("controller"):
        return ""
    lead = leading(stack.metrics_text(daemon))
    return None if lead is None else ("leader" if lead else "standby")


def write_samples(samples: list[Sample], path: Path) -> None:
    """Every resource sample, one CSV row each (for plots)."""
    with path.open("w", encoding="utf-8", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["at_s", "role", "pid", "phase", "rss_kib", "fds", "threads"])
        for s in samples:
            writer.writerow([s.at_s, s.role, s.pid, s.phase, s.rss_kib, s.fds, s.threads])


def _after_quiesce(stack: SoakStack, timeline: Timeline) -> list[Violation]:
    found = []
    for kind, check, timeout in (
        ("finalizer left", lambda: checks.leftovers(stack), checks.QUIESCE_S),
        ("node leftover", lambda: checks.node_leftovers(stack), 120.0),
        ("informer cache", lambda: checks.informer_mismatches(stack), 60.0),
    ):
        for text in checks.wait_quiet(check, timeout=timeout):
            violation = Violation(at_s=timeline.now(), kind=kind, text=text)
            timeline.note("violation", f"{kind}: {text}")
            found.append(violation)
    return found
