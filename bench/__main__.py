"""``python -m bench [--quick] [NAME …]``: run benchmarks, print their tables, write their JSON.

Each benchmark is a module with ``run(*, quick: bool) -> dict`` (the figures, JSON-serialisable) and
``summary(result: dict) -> str`` (a short table for people). Adding one is one line in
``BENCHMARKS``. Figures go to ``bench/results/<name>.json`` (or ``<result_name>.json`` when the
result names itself, e.g. per size); ``--quick`` runs a tiny size for smoke tests (its figures mean
nothing). A module may add flags of its own with ``add_arguments(parser)``; its ``run`` then gets
them as ``options``.
"""

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

BENCHMARKS: dict[str, str] = {
    "placement": "bench.placement",
    "controller": "bench.controller",
    "prepare": "bench.prepare",
    "simulate": "bench.simulate",
    "real": "bench.real",
    "webhook": "bench.webhook",
    "preemption": "bench.preemption",
}
"""Benchmark name -> module path. Register a new benchmark here."""
ON_REQUEST = frozenset({"real", "preemption"})
"""Run only when named: ``real`` and ``preemption`` restart the shared real control plane (hold its
lock)."""

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "names",
        nargs="*",
        help=f"benchmarks to run (default: all of {list(BENCHMARKS)} but {sorted(ON_REQUEST)})",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for smoke tests")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON results")
    known, _ = parser.parse_known_args(argv)
    modules = {}
    default = [name for name in BENCHMARKS if name not in ON_REQUEST]
    for name in known.names or default:
        if name in BENCHMARKS:
            modules[name] = importlib.import_module(BENCHMARKS[name])
            if hasattr(modules[name], "add_arguments"):
                modules[name].add_arguments(parser)
    args = parser.parse_args(argv)
    names = args.names or default
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; known: {list(BENCHMARKS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        module = modules[name]
        started = time.perf_counter()
        if hasattr(module, "add_arguments"):
            result = module.run(quick=args.quick, options=args)
        else:
            result = module.run(quick=args.quick)
        path = args.out / f"{result.get('result_name', name)}.json"
        path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        print(f"== {name} ({time.perf_counter() - started:.1f} s) -> {path}")
        print(module.summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
