"""``instaslice simulate`` and ``instaslice defrag``: capacity planning and defragmentation advice.

``simulate --trace FILE --gpus 20x8xA100-40GB``  replay a request trace per placement policy, with
                                                the fluid floor beside them (``instaslice.planning``)
``simulate … --defrag-on-reject K``              move up to K running pods to admit a rejected request
``simulate … --defrag-whole-gpu-below PCT``      … whole-GPU requests only below PCT% memory in use
``simulate … --defrag-whole-gpu-reserve F``      … only if F mean request lifetimes of smaller
                                                requests' demand stay free
``simulate --synthesize --trace FILE …``         write a synthetic trace to start from
``simulate --from-cluster [--add 3g.20gb=4]``   how many more of each profile fit the cluster now
``defrag --profile 7g.40gb [--count N]``          the fewest pods to move to make room; ``--apply``
                                                evicts them through the Eviction API

Parsing and output live here; the logic is in ``instaslice.planning`` and ``instaslice.clusterplan``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from driver.errors import ConfigError, DriverError, TooManyRequestsError
from driver.placement import DEFAULT_POLICY, POLICIES
from instaslice.planning.defrag import DefragPlan, plan_defrag
from instaslice.planning.fleet import parse_fleet
from instaslice.planning.headroom import fit_batch, free_by_profile, parse_batch
from instaslice.planning.replay import (
    DEMAND_WINDOW_LIFETIMES,
    LIFETIME_SAMPLE,
    FloorResult,
    ReplayResult,
    check_trace,
    fluid_floor,
    replay,
)
from instaslice.planning.trace import (
    parse_mix,
    read_trace,
    save_trace,
    synthesize,
    write_trace,
)

DEFAULT_MIX = "1g.5gb=45,1g.10gb=10,2g.10gb=15,3g.20gb=15,4g.20gb=5,7g.40gb=5,1g.5gb+me=5"


def add_planning_parsers(
    sub: Any, add_connection_flags: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Add ``simulate`` and ``defrag`` to the ``instaslice`` sub-command parser."""
    simulate = sub.add_parser(
        "simulate",
        help="replay a request trace per placement policy; or what fits the cluster now",
        description="Replay a JSON Lines trace of MIG requests on a hypothetical fleet with the "
        "controller's own placement engine, once per policy, beside the fluid floor (the "
        "rejections of perfect packing). With --synthesize, write such a trace instead; with "
        "--from-cluster, report how many more slices of each profile fit the cluster now.",
    )
    simulate.add_argument("--trace", type=Path, metavar="FILE", help="the trace (.gz: compressed)")
    simulate.add_argument(
        "--gpus", metavar="SPEC", help="the fleet: NODESxGPUSxMODEL[,…], e.g. 20x8xA100-40GB"
    )
    simulate.add_argument(
        "--policy",
        default=",".join(POLICIES),
        metavar="LIST",
        help=f"policies to compare, comma-separated (default: all of {', '.join(POLICIES)}); "
        f"with --from-cluster, the one that places --add (default {DEFAULT_POLICY})",
    )
    simulate.add_argument("--json", action="store_true", help="print one JSON object")
    simulate.add_argument(
        "--queue", action="store_true", help="rejected requests wait (FIFO) instead of leaving"
    )
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
    simulate.add_argument(
        "--plot", type=Path, metavar="PNG", help="utilization and rejections over time (matplotlib)"
    )
    synth = simulate.add_argument_group("synthetic traces (--synthesize)")
    synth.add_argument(
        "--synthesize", action="store_true", help="write a synthetic trace to --trace (- : stdout)"
    )
    synth.add_argument(
        "--mix", default=DEFAULT_MIX, help=f"PROFILE=WEIGHT,… (default {DEFAULT_MIX})"
    )
    synth.add_argument("--load", type=float, default=0.9, help="offered load (default 0.9)")
    synth.add_argument("--events", type=int, default=20_000, help="requests (default 20000)")
    synth.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    synth.add_argument(
        "--mean-duration", type=float, default=300.0, help="mean seconds held (default 300)"
    )
    live = simulate.add_argument_group("the cluster now (--from-cluster)")
    live.add_argument(
        "--from-cluster", action="store_true", help="start from the cluster's current occupancy"
    )
    live.add_argument("--add", metavar="BATCH", help="does this batch fit now? 3g.20gb=4,1g.5gb=10")
    add_connection_flags(simulate)

    defrag = sub.add_parser(
        "defrag",
        help="the fewest pods to move so that a MIG profile fits",
        description="Finds the fewest running pods whose slices, placed elsewhere, free a "
        "placement for --count slices of --profile, and prints the plan. Changes nothing unless "
        "--apply: then, after confirmation, it evicts those pods through the Eviction API, so "
        "PodDisruptionBudgets hold. Create the pod that needs the slice first: the controller "
        "places waiting pods as soon as the slices free up.",
    )
    defrag.add_argument("--profile", required=True, help="the MIG profile to make room for")
    defrag.add_argument("--count", type=int, default=1, help="how many slices of it (default 1)")
    defrag.add_argument(
        "--policy",
        default="firstfit",
        choices=tuple(POLICIES),
        help="placement policy used to re-place moved pods (the controller's; default firstfit)",
    )
    defrag.add_argument("--apply", action="store_true", help="evict the pods of the plan")
    defrag.add_argument("--yes", action="store_true", help="with --apply: do not ask")
    add_connection_flags(defrag)


# ------------------------------------------------------------------------------------ simulate


def _policies(text: str) -> list[str]:
    chosen = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in POLICIES]
    if unknown or not chosen:
        raise ConfigError(
            f"unknown placement policy {', '.join(unknown) or '(none)'} (known: {', '.join(POLICIES)})"
        )
    return list(dict.fromkeys(chosen))


def run_simulate(args: argparse.Namespace, *, out: TextIO) -> int:
    try:
        if args.from_cluster:
            return _from_cluster(args, out=out)
        if args.gpus is None or args.trace is None:
            raise ConfigError("give --gpus and --trace (or --from-cluster)")
        fleet = parse_fleet(args.gpus)
        if args.synthesize:
            return _synthesize(args, fleet_text=args.gpus, out=out)
        policies = _policies(args.policy)
        defrag_moves = _defrag_moves(args)
        whole_gpu_below = _whole_gpu_below(args)
        whole_gpu_reserve = _whole_gpu_reserve(args)
        trace = read_trace(args.trace)
        if not trace:
            raise ConfigError(f"trace {args.trace} has no requests")
        check_trace(trace, fleet, source=str(args.trace))
        floor = fluid_floor(trace, fleet)
        results = [
            replay(
                trace,
                fleet,
                policy=p,
                queue=args.queue,
                timeline=args.plot is not None,
                defrag_moves=defrag_moves,
                defrag_whole_gpu_below=whole_gpu_below,
                defrag_whole_gpu_reserve=whole_gpu_reserve,
            )
            for p in policies
        ]
        if args.plot is not None:
            from instaslice.simplot import plot_results  # noqa: PLC0415 - optional matplotlib

            plot_results(results, floor, path=args.plot, title=f"{args.trace.name} on {fleet.text}")
    except DriverError as exc:
        print(f"instaslice simulate: {exc}", file=sys.stderr)
        return 1
    if args.json:
        out.write(json.dumps(simulation_json(results, floor), sort_keys=True) + "\n")
    else:
        span = trace[-1].t - trace[0].t
        out.write(
            f"trace {args.trace}: {len(trace)} requests over {span:,.0f} s on {fleet.text} "
            f"({fleet.gpu_count} GPUs, {fleet.memory_slices} memory slices)\n"
        )
        out.write(render_simulation(results, floor, queue=args.queue))
    return 0


def _defrag_moves(args: argparse.Namespace) -> int:
    """``--defrag-on-reject`` as ``replay``'s ``defrag_moves`` (0: not given)."""
    moves: int | None = args.defrag_on_reject
    if moves is None:
        return 0
    if moves < 1:
        raise ConfigError(
            f"--defrag-on-reject must be at least 1 (the most running pods moved to admit one "
            f"rejected request), got {moves}"
        )
    if args.queue:
        raise ConfigError(
            "--defrag-on-reject and --queue do not combine: with --queue a request that does not "
            "fit waits instead of being rejected"
        )
    return moves


def _whole_gpu_below(args: argparse.Namespace) -> float | None:
    """``--defrag-whole-gpu-below`` as ``replay``'s fraction (None: not given)."""
    percent = _whole_gpu_rule(
        args,
        "--defrag-whole-gpu-below",
        args.defrag_whole_gpu_below,
        "a percentage of the fleet's memory slices in use",
        most=100,
    )
    return None if percent is None else percent / 100


def _whole_gpu_reserve(args: argparse.Namespace) -> float | None:
    """``--defrag-whole-gpu-reserve`` as ``replay``'s share of the mean lifetime (None: not
    given)."""
    return _whole_gpu_rule(
        args,
        "--defrag-whole-gpu-reserve",
        args.defrag_whole_gpu_reserve,
        "a share of the mean request lifetime",
        most=1,
    )


def _whole_gpu_rule(
    args: argparse.Namespace, flag: str, value: float | None, what: str, *, most: float
) -> float | None:
    """A whole-GPU admission rule's value as given (None: not given), checked: it needs
    ``--defrag-on-reject`` and lies in (0, ``most``]."""
    if value is None:
        return None
    if args.defrag_on_reject is None:
        raise ConfigError(f"{flag} needs --defrag-on-reject K")
    if not 0 < value <= most:  # also refuses nan
        raise ConfigError(f"{flag} is {what}, more than 0 and at most {most:g}, got {value:g}")
    return value


def simulation_json(results: Sequence[ReplayResult], floor: FloorResult) -> dict[str, Any]:
    policies: dict[str, Any] = {}
    for r in results:
        entry: dict[str, Any] = {
            "requests": r.requests,
            "accepted": r.accepted,
            "rejected": r.rejected,
            "stranded": r.stranded,
            "mean_utilization": r.mean_utilization,
            "peak_utilization": r.peak_utilization,
            "wall_s": r.wall_s,
        }
        if r.wait_p50_s is not None:
            entry.update(queued=r.queued, wait_p50_s=r.wait_p50_s, wait_p99_s=r.wait_p99_s)
        if r.defrag_moves:
            entry.update(
                defrag_moves=r.defrag_moves,
                defragged=r.defragged,
                moves=r.moves,
                defrag_budget_hit=r.defrag_budget_hit,
            )
        if r.defrag_whole_gpu_below is not None:
            entry["defrag_whole_gpu_below"] = r.defrag_whole_gpu_below
        if r.defrag_whole_gpu_reserve is not None:
            entry["defrag_whole_gpu_reserve_lifetimes"] = r.defrag_whole_gpu_reserve
        policies[r.policy] = entry
    return {"policies": policies, "floor": {"rejected": floor.rejected}}


def render_simulation(
    results: Sequence[ReplayResult], floor: FloorResult, *, queue: bool = False
) -> str:
    header = ["policy", "requests", "accepted", "rejected", "above floor", "stranded"]
    header += ["mean util", "peak util", "wall s"]
    if queue:
        header += ["queued", "wait p50 s", "wait p99 s"]
    defrag = any(r.defrag_moves for r in results)
    if defrag:
        header += ["defragged", "moves"]
    rows = [header]
    rows.append(["floor", str(floor.requests), str(floor.requests - floor.rejected)])
    rows[-1] += [str(floor.rejected), "0"] + ["-"] * (len(header) - 5)
    for r in results:
        row = [r.policy, str(r.requests), str(r.accepted), str(r.rejected)]
        row += [str(r.rejected - floor.rejected), str(r.stranded)]
        row += [f"{r.mean_utilization:.1%}", f"{r.peak_utilization:.1%}", f"{r.wall_s:.1f}"]
        if queue:
            row += [str(r.queued), f"{r.wait_p50_s or 0:.1f}", f"{r.wait_p99_s or 0:.1f}"]
        if defrag:
            row += [str(r.defragged), str(r.moves)]
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    note = (
        "floor: rejections of a fluid fleet (only the total of free memory slices counts, every "
        "request that fits is admitted): the excess above it is what placement rules cost.\n"
    )
    if queue:
        note += "with --queue, 'rejected' counts requests that never fit, even on empty GPUs.\n"
    if defrag:
        limit = max(r.defrag_moves for r in results)
        note += (
            f"defragged: requests admitted by moving at most {limit} running request(s) each "
            "(a move is a pod evicted to restart elsewhere); moves: requests moved in all.\n"
        )
        below = [r.defrag_whole_gpu_below for r in results if r.defrag_whole_gpu_below is not None]
        if below:
            note += (
                f"whole-GPU requests moved others only below {max(below) * 100:g}% of memory slices "
                "in use; so a policy may reject fewer than the floor (which admits every request "
                "that fits): the slices of a whole-GPU request turned away can hold several small "
                "ones.\n"
            )
        reserve = [
            r.defrag_whole_gpu_reserve for r in results if r.defrag_whole_gpu_reserve is not None
        ]
        if reserve:
            note += (
                f"whole-GPU requests moved others only if the memory slices left free held "
                f"{max(reserve):g} mean request lifetimes of the smaller requests' demand (slices "
                f"asked per second over the last {DEMAND_WINDOW_LIFETIMES:g} lifetimes); so a policy "
                "may reject fewer than the floor.\n"
            )
        hit = [f"{r.policy} {r.defrag_budget_hit}" for r in results if r.defrag_budget_hit]
        if hit:
            note += f"plan searches that stopped at their budget: {', '.join(hit)}.\n"
    return "\n".join(lines) + "\n" + note


def _synthesize(args: argparse.Namespace, *, fleet_text: str, out: TextIO) -> int:
    fleet = parse_fleet(fleet_text)
    requests = synthesize(
        fleet=fleet,
        mix=parse_mix(args.mix),
        load=args.load,
        events=args.events,
        seed=args.seed,
        mean_duration=args.mean_duration,
    )
    if str(args.trace) == "-":
        write_trace(requests, out)
        return 0
    written = save_trace(requests, args.trace)
    print(
        f"wrote {written} requests to {args.trace} (load {args.load} on {fleet.text}, "
        f"seed {args.seed})",
        file=sys.stderr,
    )
    return 0


def _connect(args: argparse.Namespace) -> Any:
    from driver.cluster.kube import connect  # noqa: PLC0415 - imports kubernetes only when used
    from driver.cluster.throttle import ClientSettings  # noqa: PLC0415

    return connect(
        kubeconfig=args.kubeconfig,
        context=args.context,
        url=args.kube_api_url,
        settings=ClientSettings(user_agent="instaslice-cli"),
    )


def _from_cluster(args: argparse.Namespace, *, out: TextIO) -> int:
    from instaslice.clusterplan import read_snapshot  # noqa: PLC0415

    chosen = _policies(args.policy)
    policy = chosen[0] if len(chosen) == 1 else DEFAULT_POLICY
    batch = parse_batch(args.add) if args.add else None
    with _connect(args) as api:
        snapshot = read_snapshot(api, policy=policy)
    engine = snapshot.engine
    headroom = free_by_profile(engine)
    fit = fit_batch(engine, batch) if batch is not None else None
    if args.json:
        obj: dict[str, Any] = {"free": {h.profile: h.free for h in headroom}}
        if fit is not None:
            obj["add"] = {"fits": fit.fits, "placed": dict(fit.placed), "policy": policy}
        out.write(json.dumps(obj, sort_keys=True) + "\n")
        return 0
    if not headroom:
        out.write("no node publishes MIG devices of mig.instaslice.dev\n")
        return 0
    width = max(len(h.profile) for h in headroom)
    out.write(f"{'profile'.ljust(width)}  more that fit now (each profile alone)\n")
    for h in headroom:
        out.write(f"{h.profile.ljust(width)}  {h.free:>5}   on {h.gpus} GPUs that offer it\n")
    if fit is not None:
        wanted = ", ".join(f"{n} x {p}" for p, n in fit.wanted)
        if fit.fits:
            out.write(f"\n{wanted}: fits now (placed with {policy}, largest first)\n")
        else:
            got = ", ".join(
                f"{n} of {w} x {p}" for (p, n), (_, w) in zip(fit.placed, fit.wanted, strict=True)
            )
            out.write(f"\n{wanted}: does not fit now; {policy}, largest first, placed {got}\n")
    return 0


# ------------------------------------------------------------------------------------ defrag


def run_defrag(
    args: argparse.Namespace,
    *,
    out: TextIO,
    confirm: Callable[[str], str] = input,
    connect: Callable[[argparse.Namespace], Any] | None = None,
) -> int:
    """``connect`` (args → a ``ClusterApi`` usable as a context manager) defaults to the
    kubeconfig/URL flags."""
    from instaslice.clusterplan import read_snapshot  # noqa: PLC0415

    try:
        if args.count < 1:
            raise ConfigError(f"--count must be at least 1, got {args.count}")
        api = (connect or _connect)(args)
    except DriverError as exc:
        print(f"instaslice defrag: {exc}", file=sys.stderr)
        return 1
    with api:
        try:
            snapshot = read_snapshot(api, policy=args.policy)
        except DriverError as exc:
            print(f"instaslice defrag: cannot read the cluster: {exc}", file=sys.stderr)
            return 1
        plan = plan_defrag(snapshot.engine, snapshot.units, profile=args.profile, count=args.count)
        if not isinstance(plan, DefragPlan):
            print(f"instaslice defrag: {plan.reason}", file=sys.stderr)
            return 1
        out.write(render_plan(plan))
        pods = [pod for move in plan.moves for pod in snapshot.pods[move.unit.key]]
        if not pods:
            return 0
        if not args.apply:
            out.write(
                "Nothing was changed. Run with --apply to evict these pods through the Eviction "
                "API (PodDisruptionBudgets hold).\n"
            )
            return 0
        if not args.yes:
            answer = confirm(f"Evict {len(pods)} pod(s)? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                out.write("Nothing was changed.\n")
                return 1
        failed = 0
        for pod in pods:
            try:
                api.evict(name=pod.name, namespace=pod.namespace)
            except TooManyRequestsError as exc:
                failed += 1
                out.write(f"  {pod.key}: not evicted, a PodDisruptionBudget refuses now ({exc})\n")
            except DriverError as exc:
                failed += 1
                out.write(f"  {pod.key}: not evicted: {exc}\n")
            else:
                out.write(f"  {pod.key}: evicted\n")
        return 1 if failed else 0


def render_plan(plan: DefragPlan) -> str:
    where = "; ".join(f"{t.node} GPU {t.gpu_index} start {t.start}" for t in plan.targets)
    head = f"To fit {plan.count} x {plan.profile} ({where})"
    if not plan.moves:
        return f"{head}: nothing has to move, it fits now.\n"
    count = len(plan.moves)
    lines = [f"{head}, move {count} pod{'s' if count != 1 else ''}:"]
    for move in plan.moves:
        for old, new in zip(move.unit.slices, move.to, strict=True):
            lines.append(
                f"  {move.unit.key}  {old.profile}  {old.node} GPU {old.gpu_index} start {old.start}"
                f"  ->  {new.node} GPU {new.gpu_index} start {new.start}"
            )
    if not plan.proven_minimal:
        lines.append(f"  (the search stopped after {plan.checked} plans: a smaller plan may exist)")
    return "\n".join(lines) + "\n"
