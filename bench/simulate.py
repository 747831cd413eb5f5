"""Capacity planning: every placement policy against the fluid floor on the kept traces, and how
fast ``instaslice simulate`` replays 100,000 requests.

The traces live in ``bench/traces/`` (gzipped JSON Lines, the format ``instaslice simulate`` reads)
and are reproducible: each is ``synthesize`` with the parameters in ``TRACES``;
``python -m bench.simulate --regenerate`` writes them again, byte for byte. The goal: on every trace,
the best setting's rejections above the floor at most a quarter of first-fit's.

``--defrag-moves 1,2,4`` also replays every kept trace per policy with defragmentation on rejection
(``replay(defrag_moves=K)``: a rejected request is admitted if moving at most K running requests makes
room), each K in turn, against the same floor and first-fit's rejections without moves.
That takes minutes per K and policy, so it is off by default. ``--defrag-whole-gpu-below PCT``
adds ``replay(defrag_whole_gpu_below=PCT / 100)`` to those replays: whole-GPU requests move others
only below PCT% of memory slices in use. ``--defrag-whole-gpu-reserve F`` adds
``replay(defrag_whole_gpu_reserve=F)``: whole-GPU requests move others only if the slices left free
hold F mean request lifetimes of the smaller requests' recent demand.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.placement import POLICIES
from instaslice.planning.fleet import Fleet, parse_fleet
from instaslice.planning.replay import fluid_floor, replay
from instaslice.planning.trace import TraceRequest, parse_mix, read_trace, save_trace, synthesize

TRACES_DIR = Path(__file__).resolve().parent / "traces"

MIX_ISSUE = "1g.5gb=45,1g.10gb=10,2g.10gb=15,3g.20gb=15,4g.20gb=5,7g.40gb=5,1g.5gb+me=5"
MIX_SMALL = "1g.5gb=60,1g.10gb=10,2g.10gb=15,3g.20gb=5,7g.40gb=10"
MIX_LARGE = "1g.5gb=30,2g.10gb=20,3g.20gb=30,4g.20gb=10,7g.40gb=10"
MIX_H100 = "1g.10gb=45,1g.20gb=10,2g.20gb=15,3g.40gb=15,4g.40gb=5,7g.80gb=5,1g.10gb+me=5"


@dataclass(frozen=True, slots=True)
class TraceSpec:
    gpus: str
    mix: str
    load: float
    seed: int
    events: int = 20_000
    mean_duration: float = 300.0


TRACES: dict[str, TraceSpec] = {
    "a100-issue-mix-load090-seed1": TraceSpec("20x8xA100-40GB", MIX_ISSUE, 0.90, 1),
    "a100-issue-mix-load095-seed1": TraceSpec("20x8xA100-40GB", MIX_ISSUE, 0.95, 1),
    "a100-issue-mix-load090-seed2": TraceSpec("20x8xA100-40GB", MIX_ISSUE, 0.90, 2),
    "a100-issue-mix-load095-seed2": TraceSpec("20x8xA100-40GB", MIX_ISSUE, 0.95, 2),
    "a100-small-mix-load090-seed3": TraceSpec("20x8xA100-40GB", MIX_SMALL, 0.90, 3),
    "a100-large-mix-load085-seed4": TraceSpec("20x8xA100-40GB", MIX_LARGE, 0.85, 4),
    "a100-h100-issue-mix-load090-seed5": TraceSpec(
        "10x8xA100-40GB,10x8xH100-80GB", MIX_ISSUE + "," + MIX_H100, 0.90, 5
    ),
}
"""Trace name → how it was synthesized (``bench/traces/<name>.jsonl.gz``)."""

HELD_OUT: dict[str, TraceSpec] = {
    "a100-10x8-issue-mix-load095-seed34": TraceSpec("10x8xA100-40GB", MIX_ISSUE, 0.95, 34),
    "a100-issue-mix-load085-seed23": TraceSpec("20x8xA100-40GB", MIX_ISSUE, 0.85, 23),
    "a100-small-mix-load090-seed32": TraceSpec("20x8xA100-40GB", MIX_SMALL, 0.90, 32),
    # Jobs of a 60 s and a 1,800 s mean lifetime, where a reserve counted in seconds misses.
    "a100-issue-mix-load095-dur60-seed41": TraceSpec(
        "20x8xA100-40GB", MIX_ISSUE, 0.95, 41, mean_duration=60.0
    ),
    "a100-issue-mix-load090-dur1800-seed44": TraceSpec(
        "20x8xA100-40GB", MIX_ISSUE, 0.90, 44, mean_duration=1800.0
    ),
    # No setting measured meets the goal here.
    "a100-small-mix-load090-dur1800-seed46": TraceSpec(
        "20x8xA100-40GB", MIX_SMALL, 0.90, 46, mean_duration=1800.0
    ),
}
"""Traces kept to check a rule on traffic it was not tuned on (the held-out traces of
``bench/traces/README.md``). ``--regenerate`` writes them too; ``python -m bench simulate`` does
not replay them."""

DEFRAG_SEARCH_STEPS = 1_000_000_000_000
"""The replays' budget of plan-search steps: far above what any kept trace spends, so each
rejection gets ``plan_defrag``'s own per-search budget and the figures stay comparable with those
of ``bench/traces/README.md``; ``instaslice simulate`` caps a replay at
``MAX_DEFRAG_SEARCH_STEPS_PER_REPLAY`` instead, to answer in bounded time. A row's ``unsearched``
says if even this was spent."""
SPEED_GPUS = "20x8xA100-40GB"
SPEED_EVENTS = 100_000


def trace_path(name: str) -> Path:
    return TRACES_DIR / f"{name}.jsonl.gz"


def regenerate() -> None:
    TRACES_DIR.mkdir(exist_ok=True)
    for name, spec in (TRACES | HELD_OUT).items():
        requests = synthesize(
            fleet=parse_fleet(spec.gpus),
            mix=parse_mix(spec.mix),
            load=spec.load,
            events=spec.events,
            seed=spec.seed,
            mean_duration=spec.mean_duration,
        )
        save_trace(requests, trace_path(name))
        print(f"wrote {trace_path(name)}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--defrag-moves",
        default="",
        metavar="K,...",
        help="simulate: also replay each trace with defragmentation on rejection, at most K moves "
        "per rejected request, for each K given (e.g. 1,2,4); minutes per K and policy",
    )
    parser.add_argument(
        "--defrag-whole-gpu-below",
        type=float,
        metavar="PCT",
        help="simulate, with --defrag-moves: whole-GPU requests move others only while less than "
        "PCT%% of the fleet's memory slices are in use (more than 0, at most 100)",
    )
    parser.add_argument(
        "--defrag-whole-gpu-reserve",
        type=float,
        metavar="LIFETIMES",
        help="simulate, with --defrag-moves: whole-GPU requests move others only if the memory "
        "slices left free hold LIFETIMES mean request lifetimes of the smaller requests' recent "
        "demand (more than 0, at most 1)",
    )


def _moves_list(text: str) -> tuple[int, ...]:
    moves = tuple(int(k) for k in text.split(",") if k.strip())
    if any(k < 1 for k in moves):
        raise SystemExit(f"--defrag-moves: each K must be at least 1, got {text}")
    return moves


def _whole_gpu_below(percent: float | None, *, moves: tuple[int, ...]) -> float | None:
    checked = _whole_gpu_rule("--defrag-whole-gpu-below", percent, moves=moves, most=100)
    return None if checked is None else checked / 100


def _whole_gpu_reserve(lifetimes: float | None, *, moves: tuple[int, ...]) -> float | None:
    return _whole_gpu_rule("--defrag-whole-gpu-reserve", lifetimes, moves=moves, most=1)


def _whole_gpu_rule(
    flag: str, value: float | None, *, moves: tuple[int, ...], most: float
) -> float | None:
    """A whole-GPU admission rule's value as given (None: not given), checked: it needs
    ``--defrag-moves`` and lies in (0, ``most``]."""
    if value is None:
        return None
    if not moves:
        raise SystemExit(f"{flag} needs --defrag-moves")
    if not 0 < value <= most:
        raise SystemExit(f"{flag}: more than 0 and at most {most:g}, got {value:g}")
    return value


def defrag_rows(
    trace: Sequence[TraceRequest],
    fleet: Fleet,
    *,
    floor: int,
    firstfit: int,
    moves: tuple[int, ...],
    whole_gpu_below: float | None = None,
    whole_gpu_reserve: float | None = None,
) -> list[dict[str, Any]]:
    """Per K and policy: rejections with at most K moves per rejected request, the gap against
    first-fit's excess without moves, the requests admitted by moving others, moves per 1,000
    requests, searches that hit ``plan_defrag``'s budget, and the replay's CPU seconds."""
    rows = []
    excess = firstfit - floor
    below: dict[str, Any] = {} if whole_gpu_below is None else {"whole_gpu_below": whole_gpu_below}
    if whole_gpu_reserve is not None:
        below["whole_gpu_reserve_lifetimes"] = whole_gpu_reserve
    for k in moves:
        for policy in POLICIES:
            cpu = time.process_time()
            result = replay(
                trace,
                fleet,
                policy=policy,
                defrag_moves=k,
                defrag_whole_gpu_below=whole_gpu_below,
                defrag_whole_gpu_reserve=whole_gpu_reserve,
                defrag_search_steps=DEFRAG_SEARCH_STEPS,
            )
            rows.append(
                below
                | {
                    "moves_max": k,
                    "policy": policy,
                    "rejected": result.rejected,
                    "gap_ratio": round((result.rejected - floor) / excess, 3) if excess else None,
                    "defragged": result.defragged,
                    "moves": result.moves,
                    "moves_per_1000": round(1000 * result.moves / len(trace), 2),
                    "searched": result.defrag_searched,
                    "budget_hit": result.defrag_budget_hit,
                    "search_steps": result.defrag_search_steps,
                    "unsearched": result.defrag_unsearched,
                    "cpu_s": round(time.process_time() - cpu, 2),
                }
            )
    return rows


def _compare(
    name: str,
    spec: TraceSpec,
    *,
    moves: tuple[int, ...] = (),
    whole_gpu_below: float | None = None,
    whole_gpu_reserve: float | None = None,
) -> dict[str, Any]:
    fleet = parse_fleet(spec.gpus)
    trace = read_trace(trace_path(name))
    floor = fluid_floor(trace, fleet).rejected
    rejected = {policy: replay(trace, fleet, policy=policy).rejected for policy in POLICIES}
    first_gap = rejected["firstfit"] - floor
    best = min(rejected, key=lambda p: rejected[p])
    defrag = (
        {
            "defrag": defrag_rows(
                trace,
                fleet,
                floor=floor,
                firstfit=rejected["firstfit"],
                moves=moves,
                whole_gpu_below=whole_gpu_below,
                whole_gpu_reserve=whole_gpu_reserve,
            )
        }
        if moves
        else {}
    )
    return {
        "trace": name,
        "gpus": spec.gpus,
        "load": spec.load,
        "requests": len(trace),
        "floor": floor,
        "rejected": rejected,
        "best": best,
        "goal": floor + first_gap / 4,
        "gap_ratio": round((rejected[best] - floor) / first_gap, 3) if first_gap else None,
        **defrag,
    }


def _speed(events: int) -> list[dict[str, Any]]:
    fleet = parse_fleet(SPEED_GPUS)
    trace = synthesize(fleet=fleet, mix=parse_mix(MIX_ISSUE), load=0.9, events=events, seed=11)
    runs = []
    # CPU time is what the speed goal is stated in: on a shared machine the wall clock also
    # counts other people's work.
    for policy in POLICIES:
        started, cpu = time.perf_counter(), time.process_time()
        result = replay(trace, fleet, policy=policy)
        runs.append(
            {
                "policy": policy,
                "requests": result.requests,
                "cpu_s": round(time.process_time() - cpu, 2),
                "wall_s": round(time.perf_counter() - started, 2),
            }
        )
    started, cpu = time.perf_counter(), time.process_time()
    fluid_floor(trace, fleet)
    runs.append(
        {
            "policy": "floor",
            "requests": events,
            "cpu_s": round(time.process_time() - cpu, 2),
            "wall_s": round(time.perf_counter() - started, 2),
        }
    )
    return runs


def run(*, quick: bool, options: argparse.Namespace | None = None) -> dict[str, Any]:
    moves = _moves_list(getattr(options, "defrag_moves", "") or "")
    below = _whole_gpu_below(getattr(options, "defrag_whole_gpu_below", None), moves=moves)
    reserve = _whole_gpu_reserve(getattr(options, "defrag_whole_gpu_reserve", None), moves=moves)
    names = list(TRACES)[:1] if quick else list(TRACES)
    comparisons = []
    for name in names:
        spec = TRACES[name]
        if quick:
            spec = TraceSpec(spec.gpus, spec.mix, spec.load, spec.seed, events=300)
            fleet = parse_fleet(spec.gpus)
            trace = synthesize(
                fleet=fleet, mix=parse_mix(spec.mix), load=spec.load, events=300, seed=1
            )
            floor = fluid_floor(trace, fleet).rejected
            rejected = {p: replay(trace, fleet, policy=p).rejected for p in POLICIES}
            quick_result: dict[str, Any] = {"trace": "quick", "floor": floor, "rejected": rejected}
            if moves:
                quick_result["defrag"] = defrag_rows(
                    trace,
                    fleet,
                    floor=floor,
                    firstfit=rejected["firstfit"],
                    moves=moves,
                    whole_gpu_below=below,
                    whole_gpu_reserve=reserve,
                )
            comparisons.append(quick_result)
            continue
        comparisons.append(
            _compare(name, spec, moves=moves, whole_gpu_below=below, whole_gpu_reserve=reserve)
        )
    return {
        "benchmark": "simulate",
        "quick": quick,
        "comparisons": comparisons,
        "speed": _speed(2_000 if quick else SPEED_EVENTS),
    }


def summary(result: dict[str, Any]) -> str:
    lines = []
    for c in result["comparisons"]:
        rejected = ", ".join(f"{p} {n}" for p, n in c["rejected"].items())
        line = f"{c['trace']}: floor {c['floor']}, {rejected}"
        if "goal" in c:
            line += (
                f" (goal <= {c['goal']:.0f}; best {c['best']}: {c['gap_ratio']} of first-fit's gap)"
            )
        lines.append(line)
        for d in c.get("defrag", ()):
            lines.append(
                f"  defrag <= {d['moves_max']} moves{_below_text(d)}, {d['policy']}: "
                f"{d['rejected']} rejected "
                f"(gap {d['gap_ratio']}), {d['defragged']} admitted by {d['moves']} moves "
                f"({d['moves_per_1000']} per 1,000 requests), {d['budget_hit']} of "
                f"{d['searched']} searches at budget, {d['cpu_s']} s CPU"
                + (f", {d['unsearched']} rejections not searched" if d.get("unsearched") else "")
            )
    for s in result["speed"]:
        lines.append(
            f"replay {s['requests']} requests with {s['policy']}: {s['cpu_s']} s CPU "
            f"({s['wall_s']} s wall)"
        )
    return "\n".join(lines)


def _below_text(row: dict[str, Any]) -> str:
    below = row.get("whole_gpu_below")
    text = "" if below is None else f" (whole GPU below {below * 100:g}% use)"
    reserve = row.get("whole_gpu_reserve_lifetimes")
    if reserve is not None:
        text += f" (whole GPU only if {reserve:g} lifetimes of smaller demand stay free)"
    return text


if __name__ == "__main__":
    if sys.argv[1:] == ["--regenerate"]:
        regenerate()
        sys.exit(0)
    print(
        "usage: python -m bench.simulate --regenerate   (run the benchmark: python -m bench simulate)"
    )
    sys.exit(2)
