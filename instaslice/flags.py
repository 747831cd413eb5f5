"""The flags of every ``instaslice`` sub-command, one function per sub-command (and per group of
``simulate``), with the limits each one accepts stated in its help.

``simulate`` has three modes — replay a trace (the default), ``--synthesize`` and
``--from-cluster`` — and each flag belongs to some of them: ``SIMULATE_MODE_FLAGS`` says which, and
``simulate_flag_problem`` names a flag given to a mode that would ignore it. Mode flags have no
argparse default for that reason (``None`` is "not given"); ``plancli`` fills the defaults.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from driver.placement import DEFAULT_POLICY, POLICIES
from instaslice.inputs import api_server_url, integer_between, number_between
from instaslice.planning.limits import (
    MAX_COUNT_PER_GPU,
    MAX_DEFRAG_REPLAY_REQUESTS,
    MAX_DEFRAG_SEARCH_STEPS_PER_REPLAY,
    MAX_FLEET_GPUS,
    MAX_FLEET_NODES,
    MAX_GPUS_PER_NODE,
    MAX_MEAN_DURATION,
    MAX_REPLAY_WORK,
    MAX_TRACE_BYTES,
    MAX_TRACE_LINE_BYTES,
    MAX_TRACE_REQUESTS,
    MAX_TRACE_SECONDS,
)
from instaslice.planning.replay import DEMAND_WINDOW_LIFETIMES, LIFETIME_SAMPLE

DEFAULT_MIX = "1g.5gb=45,1g.10gb=10,2g.10gb=15,3g.20gb=15,4g.20gb=5,7g.40gb=5,1g.5gb+me=5"
DEFAULT_LOAD = 0.9
DEFAULT_EVENTS = 20_000
DEFAULT_SEED = 1
DEFAULT_MEAN_DURATION = 300.0
MIN_WATCH_S = 0.5
MAX_WATCH_S = 3600.0
MAX_DEFRAG_COUNT = 10_000
"""``defrag --count``: more slices than any cluster this tool reads publishes."""

_CONNECTION = ("kubeconfig", "context", "kube_api_url")
SIMULATE_MODE_FLAGS: dict[str, frozenset[str]] = {
    "replay": frozenset(
        {"trace", "gpus", "policy", "json", "queue", "plot", "defrag_on_reject"}
        | {"defrag_whole_gpu_below", "defrag_whole_gpu_reserve", "preemption", "starvation_after"}
    ),
    "synthesize": frozenset(
        {"trace", "gpus", "mix", "load", "events", "seed", "mean_duration", "priorities"}
    ),
    "from_cluster": frozenset({"policy", "json", "add", *_CONNECTION}),
}
"""Per mode of ``simulate``, the flags (argparse ``dest``) it uses."""

SIMULATE_LIMITS = (
    f"Limits (larger inputs are refused before any work): a fleet of at most "
    f"{MAX_FLEET_NODES:,} nodes, {MAX_GPUS_PER_NODE} GPUs per node and {MAX_FLEET_GPUS:,} GPUs; a "
    f"trace of at most {MAX_TRACE_REQUESTS:,} requests (--events too) and lines, "
    f"{MAX_TRACE_LINE_BYTES:,} bytes per line and {MAX_TRACE_BYTES // 2**20} MiB decompressed, read "
    f"only from a regular file; times and durations from 0 to {MAX_TRACE_SECONDS:g} s; at most "
    f"{MAX_COUNT_PER_GPU} slices per request, and no more than one GPU of the fleet holds (they "
    f"share a GPU); requests x GPUs of a replay at most {MAX_REPLAY_WORK:,}, and with "
    f"--defrag-on-reject at most {MAX_DEFRAG_REPLAY_REQUESTS:,} requests, whose plan searches "
    f"spend at most {MAX_DEFRAG_SEARCH_STEPS_PER_REPLAY:,} search steps per policy in all (later "
    "rejections are not searched, and the output says so)."
)


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cluster connection")
    group.add_argument(
        "--kubeconfig",
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)",
    )
    group.add_argument("--context", help="kubeconfig context (default: the current one)")
    group.add_argument(
        "--kube-api-url",
        type=api_server_url,
        metavar="URL",
        help="plain API server URL without auth, http(s)://HOST[:PORT] (e.g. the demo's local "
        "API server); not with --kubeconfig or --context",
    )


def add_status_parser(sub: Any) -> None:
    status = sub.add_parser(
        "status",
        help="show each GPU's MIG slice map",
        description="Each GPU's MIG slice map from the published ResourceSlices and the "
        "allocated ResourceClaims of mig.instaslice.dev: which placements are taken, by which "
        "claim and pod, and which placement starts are still free per profile.",
    )
    add_connection_flags(status)
    status.add_argument(
        "--node",
        action="append",
        default=[],
        help="only this node (may be repeated); a node that does not exist or publishes no MIG "
        "devices is an error",
    )
    status.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="kubelet-plugin checkpoint to read MIG UUIDs from (on a node: "
        "/var/lib/instaslice/checkpoint.json; may be repeated; must exist)",
    )
    status.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=number_between(MIN_WATCH_S, MAX_WATCH_S, what="seconds"),
        metavar="SECONDS",
        help=f"redraw every SECONDS (default 2; from {MIN_WATCH_S:g} to {MAX_WATCH_S:g}) until "
        "Ctrl-C",
    )
    status.add_argument("--short-uuids", action="store_true", help="shorten UUIDs to fit")
    status.add_argument("--no-color", action="store_true", help="plain text (also: NO_COLOR=1)")


def add_demo_parser(sub: Any) -> None:
    # The demo's arguments (and its --help) belong to localcluster.demo, which only a source
    # checkout has: the installed package neither contains nor imports the lab, and
    # `instaslice demo` only starts it by name (cli.run_demo).
    sub.add_parser(
        "demo",
        add_help=False,
        help="run the whole system on this machine with emulated GPUs (from a source checkout; "
        "`instaslice demo --help` for its options)",
    )


def add_simulate_parser(sub: Any) -> None:
    simulate = sub.add_parser(
        "simulate",
        help="replay a request trace per placement policy; or what fits the cluster now",
        description="Replay a JSON Lines trace of MIG requests on a hypothetical fleet with the "
        "controller's own placement engine, once per policy, beside the fluid floor (the "
        "rejections of a fleet where only the total of free memory slices counts). With "
        "--synthesize, write such a trace instead; with --from-cluster, report how many more "
        "slices of each profile fit the cluster now. Each flag belongs to its mode: one given "
        "to another mode is refused.",
        epilog=SIMULATE_LIMITS,
    )
    _replay_flags(simulate)
    _defrag_flags(simulate)
    _synthesis_flags(simulate.add_argument_group("synthetic traces (--synthesize)"))
    live = simulate.add_argument_group("the cluster now (--from-cluster)")
    live.add_argument(
        "--from-cluster", action="store_true", help="start from the cluster's current occupancy"
    )
    live.add_argument(
        "--add",
        metavar="BATCH",
        help="does this batch fit now? 3g.20gb=4,1g.5gb=10 (exit status 1 when it does not)",
    )
    add_connection_flags(simulate)


def _replay_flags(simulate: argparse.ArgumentParser) -> None:
    simulate.add_argument(
        "--trace", type=Path, metavar="FILE", help="the trace (.gz: compressed; a regular file)"
    )
    simulate.add_argument(
        "--gpus",
        metavar="SPEC",
        help=f"the fleet: NODESxGPUSxMODEL[,…], e.g. 20x8xA100-40GB (at most {MAX_FLEET_NODES:,} "
        f"nodes, {MAX_GPUS_PER_NODE} GPUs per node, {MAX_FLEET_GPUS:,} GPUs)",
    )
    simulate.add_argument(
        "--policy",
        metavar="LIST",
        help=f"policies to compare, comma-separated (default: all of {', '.join(POLICIES)}); "
        f"with --from-cluster, the one that places --add (default {DEFAULT_POLICY})",
    )
    simulate.add_argument("--json", action="store_true", help="print one JSON object")
    simulate.add_argument(
        "--queue",
        action="store_true",
        help="requests that do not fit wait instead of leaving; whenever slices free, every "
        "waiting request that fits is placed, by priority (the trace's 'priority', highest "
        "first), then arrival. Reports waits per priority and the largest profile's waits",
    )
    simulate.add_argument(
        "--preemption",
        action="store_true",
        help="with --queue: a request that fits nowhere evicts running requests of lower priority "
        "when that makes room on one GPU, chosen as kube-scheduler chooses victims (the lowest "
        "highest priority, then the lowest sum, then the fewest, then the latest started); an "
        "evicted request waits again and restarts from the beginning. A trace line with "
        '"preemptionPolicy": "Never" never preempts',
    )
    simulate.add_argument(
        "--starvation-after",
        type=number_between(0, MAX_TRACE_SECONDS, low_included=False, what="seconds"),
        metavar="SECONDS",
        help="with --queue: a request that has waited SECONDS and still fits nowhere reserves the "
        "GPU cheapest to empty (the fewest running requests, then the oldest): no request of its "
        "priority or lower is placed there until it is. Replay once with and once without to "
        "compare the waits",
    )
    simulate.add_argument(
        "--plot",
        type=Path,
        metavar="IMAGE",
        help="also draw utilization and rejections over time into IMAGE (.png, .svg, .pdf…; "
        "needs matplotlib); the table is printed all the same",
    )


def _defrag_flags(simulate: argparse.ArgumentParser) -> None:
    simulate.add_argument(
        "--defrag-on-reject",
        type=int,
        metavar="K",
        help="when a request does not fit, move at most K running requests elsewhere if that "
        "makes room for it (the plan `instaslice defrag` would give); a move stands for evicting "
        "a running pod so that it restarts on other slices. Reports per policy the requests "
        "admitted so and the moves (not with --queue)",
    )
    simulate.add_argument(
        "--defrag-whole-gpu-below",
        type=float,
        metavar="PCT",
        help="with --defrag-on-reject: a request that takes a whole GPU (such as 7g.40gb) may "
        "move running requests only while less than PCT%% of the fleet's memory slices are in "
        "use (more than 0, at most 100); smaller requests always may",
    )
    simulate.add_argument(
        "--defrag-whole-gpu-reserve",
        type=float,
        metavar="LIFETIMES",
        help="with --defrag-on-reject: a request that takes a whole GPU may move running requests "
        "only if the memory slices left free once it is placed would still hold the smaller "
        "requests' demand over LIFETIMES mean request lifetimes (the memory slices they asked for "
        f"per second over the last {DEMAND_WINDOW_LIFETIMES:g} lifetimes; the mean lifetime is "
        f"that of the last {LIFETIME_SAMPLE:,} requests to depart; more than 0, at most 1; 0.04 "
        "suggested, with --policy scarcity --defrag-on-reject 2); smaller requests always may",
    )


def _synthesis_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--synthesize", action="store_true", help="write a synthetic trace to --trace (- : stdout)"
    )
    group.add_argument("--mix", help=f"PROFILE=WEIGHT,… (default {DEFAULT_MIX})")
    group.add_argument(
        "--load",
        type=number_between(0, 10, low_included=False),
        help=f"offered load, more than 0 and at most 10 (default {DEFAULT_LOAD})",
    )
    group.add_argument(
        "--events",
        type=integer_between(1, MAX_TRACE_REQUESTS),
        help=f"requests, at most {MAX_TRACE_REQUESTS:,} (default {DEFAULT_EVENTS})",
    )
    group.add_argument("--seed", type=int, help=f"random seed (default {DEFAULT_SEED})")
    group.add_argument(
        "--priorities",
        metavar="MIX",
        help="PRIORITY=WEIGHT,… e.g. 1000=0.2,0=0.8: each request's pod priority drawn from "
        "these (default: every request priority 0); the same seed gives the same arrivals, "
        "profiles and durations with or without them",
    )
    group.add_argument(
        "--mean-duration",
        type=number_between(0, MAX_MEAN_DURATION, low_included=False, what="seconds"),
        help=f"mean seconds held, at most {MAX_MEAN_DURATION:g} (default "
        f"{DEFAULT_MEAN_DURATION:g})",
    )


def add_defrag_parser(sub: Any) -> None:
    defrag = sub.add_parser(
        "defrag",
        help="the fewest pods to move so that a MIG profile fits",
        description="Finds the fewest running pods whose slices, placed elsewhere, free a "
        "placement for --count slices of --profile, and prints the plan. Changes nothing unless "
        "--apply: then, after confirmation, it evicts those pods through the Eviction API, so "
        "PodDisruptionBudgets hold. Create the pod that needs the slice first: the controller "
        "places waiting pods as soon as the slices free up. Exit status 1 says why there is no "
        "plan: none exists, or the search stopped at its budget (a plan may exist).",
    )
    defrag.add_argument("--profile", required=True, help="the MIG profile to make room for")
    defrag.add_argument(
        "--count",
        type=integer_between(1, MAX_DEFRAG_COUNT),
        default=1,
        help=f"how many slices of it (default 1, at most {MAX_DEFRAG_COUNT:,})",
    )
    defrag.add_argument(
        "--policy",
        default="firstfit",
        choices=tuple(POLICIES),
        help="placement policy used to re-place moved pods (the controller's; default firstfit)",
    )
    defrag.add_argument("--apply", action="store_true", help="evict the pods of the plan")
    defrag.add_argument("--yes", action="store_true", help="with --apply: do not ask")
    add_connection_flags(defrag)


def simulate_mode(args: argparse.Namespace) -> str:
    """``replay``, ``synthesize`` or ``from_cluster``."""
    if args.synthesize:
        return "synthesize"
    return "from_cluster" if args.from_cluster else "replay"


def simulate_flag_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the mode flags of ``simulate``: two modes at once, or a flag the chosen
    mode would ignore (None: nothing)."""
    if args.synthesize and args.from_cluster:
        return "--synthesize and --from-cluster are two modes; give one"
    mode = simulate_mode(args)
    every = frozenset().union(*SIMULATE_MODE_FLAGS.values())
    ignored = sorted(
        dest
        for dest in every - SIMULATE_MODE_FLAGS[mode]
        if getattr(args, dest) not in (None, False)
    )
    if not ignored:
        return None
    return "; ".join(f"{_flag(d)} applies {_modes_of(d)}, not {_mode_words(mode)}" for d in ignored)


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _modes_of(dest: str) -> str:
    modes: Sequence[str] = [m for m, flags in SIMULATE_MODE_FLAGS.items() if dest in flags]
    return " or ".join(_mode_words(m) for m in modes)


def _mode_words(mode: str) -> str:
    return {
        "replay": "when replaying a trace",
        "synthesize": "with --synthesize",
        "from_cluster": "with --from-cluster",
    }[mode]
