"""The soak's result: what was injected, what the pods did, what broke, how the daemons grew —
as ``report.json`` (every figure) and ``report.txt`` (for a person), and whether it passed."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from localcluster.soak.checks import Violation
from localcluster.soak.faults import KINDS, FaultRecord
from localcluster.soak.resources import Growth

DAEMON_KINDS = ("controller", "webhook", "plugin")


def _daemon_kind(role: str) -> str:
    """``controller-1`` → ``controller``, ``plugin/node-2`` → ``plugin``."""
    return role.split("/", 1)[0].split("-", 1)[0]


@dataclass(frozen=True, slots=True)
class SoakResult:
    seed: int
    kinds: tuple[str, ...]
    """The fault kinds asked for."""
    minutes: float
    nodes: int
    faults: list[FaultRecord]
    pods: dict[str, Counter[str]]
    churn: dict[str, int]
    violations: list[Violation]
    growth: list[Growth]
    checks: int
    failed_reads: int
    cache_excess: dict[str, float]

    def faults_by_kind(self) -> dict[str, int]:
        counts = Counter(f.kind for f in self.faults)
        return {kind: counts.get(kind, 0) for kind in KINDS if kind in self.kinds}

    def problems(self) -> list[str]:
        """Why the soak failed; empty when it passed."""
        found = [f"{v.kind} at {v.at_s:.0f}s: {v.text}" for v in self.violations]
        found += [f"fault {k} never injected" for k, n in self.faults_by_kind().items() if not n]
        for fault in self.faults:
            if "error" in fault.details:
                found.append(f"fault {fault.kind} at {fault.started_s:.0f}s failed: "
                             f"{fault.details['error']}")  # fmt: skip
            if fault.recovered_s is None:
                found.append(f"not whole again after {fault.kind} at {fault.started_s:.0f}s")
        found += [
            f"{g.role} (pid {g.pid}{f', {g.phase}' if g.phase else ''}) {g.figure} grew "
            f"{g.growth:+.1%} ({g.start:g} -> {g.end:g})"
            for g in self.growth
            if g.judged and not g.within
        ]
        judged = {_daemon_kind(g.role) for g in self.growth if g.judged}
        found += [
            f"no {kind} lived long enough to judge its growth"
            for kind in DAEMON_KINDS
            if kind not in judged
        ]
        found += [f"{n} pod(s) did not run and said nothing" for n in
                  [self.pods["did not run"].get("without a reason", 0)] if n]  # fmt: skip
        return found

    def passed(self) -> bool:
        return not self.problems()

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed(),
            "problems": self.problems(),
            "seed": self.seed,
            "minutes": self.minutes,
            "nodes": self.nodes,
            "faults_by_kind": self.faults_by_kind(),
            "faults": [asdict(f) for f in self.faults],
            "pods": {k: dict(v) for k, v in self.pods.items()},
            "churn": self.churn,
            "violations": [asdict(v) for v in self.violations],
            "growth": [asdict(g) for g in self.growth],
            "checks": self.checks,
            "failed_reads": self.failed_reads,
            "informer_cache_excess": self.cache_excess,
        }


def render(result: SoakResult) -> str:
    lines = [
        f"soak: {'PASSED' if result.passed() else 'FAILED'} — {result.minutes:g} min, "
        f"{result.nodes} nodes, seed {result.seed}",
        "",
        "faults injected (kind: count, recovery seconds):",
    ]
    for kind, count in result.faults_by_kind().items():
        recoveries = [f.recovered_s for f in result.faults if f.kind == kind]
        shown = ", ".join("never" if r is None else f"{r:.0f}" for r in recoveries)
        lines.append(f"  {kind:22} {count}  ({shown})")
    ran, not_run = result.pods["ran"], result.pods["did not run"]
    lines += ["", f"pods: {sum(ran.values()) + sum(not_run.values())} created, "
              f"{sum(ran.values())} ran ({_counts(ran)})"]  # fmt: skip
    lines += [f"  did not run: {n:4} {reason}" for reason, n in not_run.most_common()]
    lines += ["", f"invariant checks: {result.checks} ({result.failed_reads} skipped: API down)",
              f"violations: {len(result.violations)}"]  # fmt: skip
    lines += [f"  {v.at_s:7.0f}s {v.kind}: {v.text}" for v in result.violations]
    if result.cache_excess:
        worst = max(result.cache_excess.items(), key=lambda kv: kv[1])
        lines += ["", f"informer caches: at most {worst[1]:+.0f} objects beyond those that "
                  f"existed ({worst[0]}), once a minute over {len(result.cache_excess)} caches"]  # fmt: skip
    lines += ["", "growth after warm-up (start -> end, growth, slope per hour; * = judged):"]
    for g in result.growth:
        mark = "*" if g.judged else " "
        verdict = "" if g.within or not g.judged else "  OVER LIMIT"
        role = f"{g.role} ({g.phase})" if g.phase else g.role
        lines.append(
            f" {mark}{role:28} pid {g.pid:<7} {g.figure:8} {g.start:>9.0f} -> {g.end:>9.0f}  "
            f"{g.growth:+6.1%}  {g.slope_per_hour:+6.1%}/h{verdict}"
        )
    problems = result.problems()
    if problems:
        lines += ["", "problems:"] + [f"  {p}" for p in problems]
    return "\n".join(lines) + "\n"


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counter.most_common())


def write(result: SoakResult, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.json").write_text(
        json.dumps(result.to_json(), indent=1, default=str) + "\n", encoding="utf-8"
    )
    (directory / "report.txt").write_text(render(result), encoding="utf-8")
