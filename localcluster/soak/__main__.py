"""``python -m localcluster.soak [--minutes M] [--seed S] [--nodes N] [--out DIR]``: one soak on the
real stack (``localcluster.soak``); exit status 0 when it passed, 1 when it failed, and a one-line
skip (status 0) where the real stack is not built."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from localcluster.realstack import describe_missing
from localcluster.soak.faults import KINDS
from localcluster.soak.report import render, write
from localcluster.soak.run import SoakConfig, run_soak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument(
        "--warmup", type=float, default=150.0, help="seconds of churn before faults"
    )
    parser.add_argument("--cooldown", type=float, default=120.0, help="seconds of churn after them")
    parser.add_argument(
        "--faults",
        default=",".join(KINDS),
        help=f"comma-separated fault kinds (default: all: {', '.join(KINDS)})",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("/tmp/instaslice-soak") / time.strftime("%Y%m%d-%H%M%S"),
        help="report, timeline and daemon logs (default: /tmp/instaslice-soak/<time>)",
    )
    args = parser.parse_args(argv)
    missing = describe_missing()
    if missing is not None:
        print(f"soak: skipped: {missing}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=[logging.StreamHandler(), logging.FileHandler(args.out / "soak.log")],
    )
    # the checks open the nodes' emulated GPU state every few seconds; each open says so
    logging.getLogger("driver.gpu.emulated").setLevel(logging.WARNING)
    result = run_soak(
        SoakConfig(
            minutes=args.minutes,
            seed=args.seed,
            nodes=args.nodes,
            out=args.out,
            warmup_s=args.warmup,
            cooldown_s=args.cooldown,
            kinds=tuple(k for k in args.faults.split(",") if k),
        )
    )
    write(result, args.out)
    print(render(result))
    print(f"soak: report, timeline and logs in {args.out}")
    return 0 if result.passed() else 1


if __name__ == "__main__":
    sys.exit(main())
