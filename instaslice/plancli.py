"""``instaslice simulate`` and ``instaslice defrag``: capacity planning and defragmentation advice.

``simulate --trace FILE --gpus 20x8xA100-40GB``  replay a request trace per placement policy, with
                                                the fluid floor beside them (``instaslice.planning``)
``simulate … --queue [--preemption] [--starvation-after S]``  waits instead of rejections, by pod
                                                priority; preempting lower priorities; GPUs
                                                reserved for requests waiting longer than S
``simulate … --defrag-on-reject K``              move up to K running pods to admit a rejected request
``simulate … --defrag-whole-gpu-below PCT``      … whole-GPU requests only below PCT% memory in use
``simulate … --defrag-whole-gpu-reserve F``      … only if F mean request lifetimes of smaller
                                                requests' demand stay free
``simulate --synthesize --trace FILE …``         write a synthetic trace to start from
``simulate --from-cluster [--add 3g.20gb=4]``   how many more of each profile fit the cluster now
``defrag --profile 7g.40gb [--count N]``          the fewest pods to move to make room; ``--apply``
                                                evicts them through the Eviction API

Every input is checked before any work starts (``instaslice.flags`` says which flag belongs to which
mode of ``simulate``, ``instaslice.planning.limits`` how large an input may be): first the command
line alone (a refusal exits 2), then the files and the cluster it names (a refusal exits 1); a
refusal is one line on stderr. Output lives here; the logic is in ``instaslice.planning`` and
``instaslice.clusterplan``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TextIO

from driver.errors import ConfigError, DriverError, TooManyRequestsError
from driver.placement import DEFAULT_POLICY, POLICIES
from instaslice.flags import (
    DEFAULT_EVENTS,
    DEFAULT_LOAD,
    DEFAULT_MEAN_DURATION,
    DEFAULT_MIX,
    DEFAULT_SEED,
    MAX_DEFRAG_COUNT,
    simulate_flag_problem,
)
from instaslice.inputs import (
    ArgumentError,
    command_line_checks,
    connect_cluster,
    connection_flag_problem,
    refuse,
)
from instaslice.planning.defrag import DefragPlan, NoPlan, plan_defrag
from instaslice.planning.figures import ReplayResult
from instaslice.planning.fleet import Fleet, parse_fleet
from instaslice.planning.headroom import BatchResult, fit_batch, free_by_profile, parse_batch
from instaslice.planning.limits import MAX_DEFRAG_REPLAY_REQUESTS, MAX_REPLAY_WORK
from instaslice.planning.replay import DEMAND_WINDOW_LIFETIMES, FloorResult, fluid_floor, replay
from instaslice.planning.trace import (
    TraceRequest,
    check_counts,
    check_trace,
    parse_mix,
    parse_priorities,
    read_trace,
    save_trace,
    synthesize,
    write_trace,
)
from instaslice.simplot import check_plot_target, plot_results

# ------------------------------------------------------------------------------------ simulate


def _policies(text: str | None) -> list[str]:
    chosen = [p.strip() for p in (text or ",".join(POLICIES)).split(",") if p.strip()]
    unknown = [p for p in chosen if p not in POLICIES]
    if unknown or not chosen:
        raise ConfigError(
            f"unknown placement policy {', '.join(unknown) or '(none)'} (known: {', '.join(POLICIES)})"
        )
    return list(dict.fromkeys(chosen))


@dataclass(frozen=True, slots=True)
class _Replay:
    """A replay's settings from the command line, then (``trace``) its trace checked and read,
    before any policy runs."""

    fleet: Fleet
    policies: list[str]
    defrag_moves: int
    whole_gpu_below: float | None
    whole_gpu_reserve: float | None
    preemption: bool
    starvation_after: float | None
    trace: tuple[TraceRequest, ...] = ()


def run_simulate(args: argparse.Namespace, *, out: TextIO) -> int:
    """``instaslice simulate``: the command line is checked first (a refusal exits 2), then the
    files and the cluster it names (exit 1), all before any work."""
    try:
        with command_line_checks():
            _check_simulate_flags(args)
        if args.from_cluster:
            return _from_cluster(args, out=out)
        with command_line_checks():
            fleet = parse_fleet(args.gpus)
        if args.synthesize:
            return _synthesize(args, fleet=fleet, out=out)
        with command_line_checks():
            settings = _replay_settings(args, fleet)
        run = _read_replay(args, settings)
    except DriverError as exc:
        return refuse("simulate", exc)
    floor = fluid_floor(run.trace, run.fleet)
    results = [_replay_one(run, policy, queue=args.queue, timeline=args.plot is not None)
               for policy in run.policies]  # fmt: skip
    priorities = len({r.priority for r in run.trace})
    if args.json:
        out.write(json.dumps(simulation_json(results, floor), sort_keys=True) + "\n")
    else:
        span = run.trace[-1].t - run.trace[0].t
        out.write(
            f"trace {args.trace}: {len(run.trace)} requests over {span:,.0f} s on {fleet.text} "
            f"({fleet.gpu_count} GPUs, {fleet.memory_slices} memory slices)\n"
        )
        out.write(render_simulation(results, floor, queue=args.queue, priorities=priorities))
    out.flush()
    if args.plot is None:
        return 0
    return _plot(results, floor, args=args, fleet=fleet)


def _check_simulate_flags(args: argparse.Namespace) -> None:
    """``ConfigError`` unless the flags make one mode, each given flag is one of that mode, and
    the mode has what it needs."""
    problem = simulate_flag_problem(args) or connection_flag_problem(args)
    if problem is not None:
        raise ConfigError(problem)
    if not args.from_cluster and (args.gpus is None or args.trace is None):
        raise ConfigError("give --gpus and --trace (or --from-cluster)")


def _replay_settings(args: argparse.Namespace, fleet: Fleet) -> _Replay:
    """A replay's settings from the command line alone (its trace not read yet)."""
    for flag, given in (
        ("--preemption", args.preemption),
        ("--starvation-after", args.starvation_after),
    ):
        if given not in (None, False) and not args.queue:
            raise ConfigError(f"{flag} needs --queue: without it nothing waits")
    return _Replay(
        fleet,
        _policies(args.policy),
        _defrag_moves(args),
        _whole_gpu_below(args),
        _whole_gpu_reserve(args),
        preemption=args.preemption,
        starvation_after=args.starvation_after,
    )


def _read_replay(args: argparse.Namespace, settings: _Replay) -> _Replay:
    """``settings`` with the trace: the plot's path, the trace and the replay's size checked."""
    if args.plot is not None:
        check_plot_target(args.plot)
    trace = read_trace(args.trace)
    if not trace:
        raise ConfigError(f"trace {args.trace} has no requests")
    check_trace(trace, settings.fleet, source=str(args.trace))
    check_counts(trace, settings.fleet, source=str(args.trace))
    _check_replay_size(len(trace), settings.fleet, defrag=settings.defrag_moves > 0)
    return replace(settings, trace=trace)


def _check_replay_size(requests: int, fleet: Fleet, *, defrag: bool) -> None:
    """``ConfigError`` if replaying ``requests`` on ``fleet`` could take unbounded time."""
    work = requests * fleet.gpu_count
    if work > MAX_REPLAY_WORK:
        raise ConfigError(
            f"{requests:,} requests on {fleet.gpu_count:,} GPUs is {work:,} request-GPUs to "
            f"replay; at most {MAX_REPLAY_WORK:,}: shorten the trace or shrink the fleet"
        )
    if defrag and requests > MAX_DEFRAG_REPLAY_REQUESTS:
        raise ConfigError(
            f"with --defrag-on-reject a trace holds at most {MAX_DEFRAG_REPLAY_REQUESTS:,} "
            f"requests (each rejection may search thousands of plans), this one {requests:,}"
        )


def _replay_one(run: _Replay, policy: str, *, queue: bool, timeline: bool) -> ReplayResult:
    return replay(
        run.trace,
        run.fleet,
        policy=policy,
        queue=queue,
        timeline=timeline,
        defrag_moves=run.defrag_moves,
        defrag_whole_gpu_below=run.whole_gpu_below,
        defrag_whole_gpu_reserve=run.whole_gpu_reserve,
        preemption=run.preemption,
        starvation_after=run.starvation_after,
    )


def _plot(
    results: Sequence[ReplayResult], floor: FloorResult, *, args: argparse.Namespace, fleet: Fleet
) -> int:
    """Draw the plot after the table is out; a failure is one line and status 1, the table stays."""
    try:
        plot_results(results, floor, path=args.plot, title=f"{args.trace.name} on {fleet.text}")
    except DriverError as exc:
        return refuse("simulate", exc)
    print(f"instaslice simulate: wrote the plot to {args.plot}", file=sys.stderr)
    return 0


def _defrag_moves(args: argparse.Namespace) -> int:
    """``--defrag-on-reject`` as ``replay``'s ``defrag_moves`` (0: not given)."""
    moves: int | None = args.defrag_on_reject
    if moves is None:
        return 0
    if not 1 <= moves <= MAX_DEFRAG_COUNT:
        raise ConfigError(
            f"--defrag-on-reject must be at least 1 and at most {MAX_DEFRAG_COUNT:,} (the most "
            f"running pods moved to admit one rejected request), got {moves}"
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
    return {
        "policies": {r.policy: _result_json(r) for r in results},
        "floor": {"rejected": floor.rejected},
    }


def _result_json(r: ReplayResult) -> dict[str, Any]:
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
        entry.update(
            queued=r.queued,
            wait_p50_s=r.wait_p50_s,
            wait_p99_s=r.wait_p99_s,
            largest_profile=r.largest_profile,
            largest_wait_p50_s=r.largest_wait_p50_s,
            largest_wait_p99_s=r.largest_wait_p99_s,
            by_priority={
                str(p.priority): {
                    "requests": p.requests,
                    "admitted": p.admitted,
                    "rejected": p.rejected,
                    "preempted": p.preempted,
                    "wait_p50_s": p.wait_p50_s,
                    "wait_p99_s": p.wait_p99_s,
                }
                for p in r.by_priority
            },
        )
    if r.preemption:
        entry["preempted"] = r.preempted
    if r.starvation_after_s is not None:
        entry.update(starvation_after_s=r.starvation_after_s, reservations=r.reservations)
    if r.defrag_moves:
        entry.update(
            defrag_moves=r.defrag_moves,
            defragged=r.defragged,
            moves=r.moves,
            defrag_budget_hit=r.defrag_budget_hit,
            defrag_searched=r.defrag_searched,
            defrag_search_steps=r.defrag_search_steps,
            defrag_budget_spent=r.defrag_budget_spent,
            defrag_unsearched=r.defrag_unsearched,
        )
    if r.defrag_whole_gpu_below is not None:
        entry["defrag_whole_gpu_below"] = r.defrag_whole_gpu_below
    if r.defrag_whole_gpu_reserve is not None:
        entry["defrag_whole_gpu_reserve_lifetimes"] = r.defrag_whole_gpu_reserve
    return entry


def render_simulation(
    results: Sequence[ReplayResult], floor: FloorResult, *, queue: bool = False, priorities: int = 1
) -> str:
    """The table of policies beside the floor, and notes; with ``queue`` and more than one
    priority in the trace, a second table of each policy's figures per priority."""
    defrag = any(r.defrag_moves for r in results)
    preemption = any(r.preemption for r in results)
    reserving = any(r.starvation_after_s is not None for r in results)
    largest = next((r.largest_profile for r in results if r.largest_profile), None)
    header = ["policy", "requests", "accepted", "rejected", "above floor", "stranded"]
    header += ["mean util", "peak util", "wall s"]
    if queue:
        header += ["queued", "wait p50 s", "wait p99 s"]
        if largest is not None:
            header += [f"{largest} wait p50 s", f"{largest} wait p99 s"]
        header += ["preempted"] * preemption + ["reservations"] * reserving
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
            if largest is not None:
                row += [f"{r.largest_wait_p50_s or 0:.1f}", f"{r.largest_wait_p99_s or 0:.1f}"]
            row += [str(r.preempted)] * preemption + [str(r.reservations)] * reserving
        if defrag:
            row += [str(r.defragged), str(r.moves)]
        rows.append(row)
    notes = _floor_notes(results, floor, queue=queue)
    if queue:
        notes += _queue_notes(results, largest=largest)
    if defrag:
        notes += _defrag_notes(results)
    text = "\n".join(_aligned(rows)) + "\n" + notes
    if queue and priorities > 1:
        text += "\n" + render_priorities(results)
    return text


def render_priorities(results: Sequence[ReplayResult]) -> str:
    """Per policy and priority (highest first): requests, admitted, rejected, preempted, waits."""
    rows = [["policy", "priority", "requests", "admitted", "rejected", "preempted"]]
    rows[0] += ["wait p50 s", "wait p99 s"]
    for r in results:
        for p in r.by_priority:
            counts = (p.requests, p.admitted, p.rejected, p.preempted)
            waits = (p.wait_p50_s, p.wait_p99_s)
            rows.append(
                [r.policy, str(p.priority), *map(str, counts), *(f"{w:.1f}" for w in waits)]
            )
    return "\n".join(_aligned(rows)) + "\n"


def _queue_notes(results: Sequence[ReplayResult], *, largest: str | None) -> str:
    """What the waits, preemptions and reservations count."""
    note = (
        "waits: the time each admitted request spent waiting, all its waits together"
        + (f"; {largest}: the trace's largest profile" if largest is not None else "")
        + ".\n"
    )
    if any(r.preemption for r in results):
        note += (
            "preempted: running requests evicted for a higher priority; each waited again and "
            "restarted from the beginning.\n"
        )
    bounds = {r.starvation_after_s for r in results if r.starvation_after_s is not None}
    if bounds:
        note += (
            f"reservations: GPUs held for requests that had waited {max(bounds):g} s, fit "
            "nowhere and needed more than one departure, as the controller holds them; replay "
            "without --starvation-after to compare the waits.\n"
        )
    return note


def _aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """The rows as text columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]


def _floor_notes(results: Sequence[ReplayResult], floor: FloorResult, *, queue: bool) -> str:
    """What the floor is, and why a policy can reject fewer than it."""
    note = (
        "floor: rejections of a fluid fleet (only the total of free memory slices counts, every "
        "request that fits when it arrives is admitted): the excess above it is what placement "
        "rules cost. It is a lower bound only while the fleet keeps up: under overload, or with "
        "--queue, a policy can reject fewer.\n"
    )
    if queue:
        note += (
            "with --queue, 'rejected' counts requests that never fit, even on empty GPUs, and the "
            "others wait; the floor does not wait (it rejects at arrival).\n"
        )
    below = [r.policy for r in results if r.rejected < floor.rejected]
    if below and not queue:
        note += (
            f"below the floor: {', '.join(below)} ('above floor' negative). Admitting every "
            "request that fits, the floor also admits requests whose slices several later ones "
            "would have used; a policy that turns such a request away admits more in all.\n"
        )
    return note


def _defrag_notes(results: Sequence[ReplayResult]) -> str:
    limit = max(r.defrag_moves for r in results)
    note = (
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
    for r in results:
        if r.defrag_budget_spent:
            note += (
                f"{r.policy}: the defrag search budget for this replay "
                f"({r.defrag_search_budget:,} search steps) was spent after {r.defrag_searched:,} "
                f"searches: {r.defrag_unsearched:,} later rejections were not searched (with more "
                "searching, defrag could admit more than this row shows).\n"
            )
    return note


def _synthesize(args: argparse.Namespace, *, fleet: Fleet, out: TextIO) -> int:
    """Write the trace the flags describe; every problem but writing it is the command line's."""
    load = DEFAULT_LOAD if args.load is None else args.load
    seed = DEFAULT_SEED if args.seed is None else args.seed
    mean_duration = DEFAULT_MEAN_DURATION if args.mean_duration is None else args.mean_duration
    with command_line_checks():
        requests = synthesize(
            fleet=fleet,
            mix=parse_mix(DEFAULT_MIX if args.mix is None else args.mix),
            load=load,
            events=DEFAULT_EVENTS if args.events is None else args.events,
            seed=seed,
            mean_duration=mean_duration,
            priorities=parse_priorities(args.priorities) if args.priorities is not None else (),
        )
    if str(args.trace) == "-":
        write_trace(requests, out)
        return 0
    written = save_trace(requests, args.trace)
    print(
        f"wrote {written} requests to {args.trace} (load {load} on {fleet.text}, seed {seed})",
        file=sys.stderr,
    )
    return 0


# ------------------------------------------------------------------------------------ the cluster


def _from_cluster(args: argparse.Namespace, *, out: TextIO) -> int:
    """How much more fits the cluster now; status 1 when ``--add`` does not fit."""
    from instaslice.clusterplan import read_snapshot  # noqa: PLC0415

    with command_line_checks():
        chosen = _policies(args.policy)
        batch = parse_batch(args.add) if args.add else None
    policy = chosen[0] if len(chosen) == 1 else DEFAULT_POLICY
    with connect_cluster(args) as api:
        try:
            snapshot = read_snapshot(api, policy=policy)
        except DriverError as exc:
            raise ConfigError(f"cannot read the cluster: {exc}") from exc
    engine = snapshot.engine
    headroom = free_by_profile(engine)
    fit = fit_batch(engine, batch) if batch is not None else None
    if args.json:
        obj: dict[str, Any] = {"free": {h.profile: h.free for h in headroom}}
        if fit is not None:
            obj["add"] = {"fits": fit.fits, "placed": dict(fit.placed), "policy": policy}
        out.write(json.dumps(obj, sort_keys=True) + "\n")
    elif not headroom:
        out.write("no node publishes MIG devices of mig.instaslice.dev\n")
    else:
        width = max(len(h.profile) for h in headroom)
        out.write(f"{'profile'.ljust(width)}  more that fit now (each profile alone)\n")
        for h in headroom:
            out.write(f"{h.profile.ljust(width)}  {h.free:>5}   on {h.gpus} GPUs that offer it\n")
        if fit is not None:
            out.write("\n" + _fit_line(fit, policy=policy) + "\n")
    if fit is None or fit.fits:
        return 0
    out.flush()
    missing = ", ".join(f"{w - n} of {w} x {p}" for (p, n), (_, w) in _pairs(fit) if n < w)
    return refuse("simulate", ConfigError(f"--add does not fit now: no room for {missing}"))


def _pairs(fit: BatchResult) -> list[tuple[tuple[str, int], tuple[str, int]]]:
    return list(zip(fit.placed, fit.wanted, strict=True))


def _fit_line(fit: BatchResult, *, policy: str) -> str:
    wanted = ", ".join(f"{n} x {p}" for p, n in fit.wanted)
    if fit.fits:
        return f"{wanted}: fits now (placed with {policy}, largest first)"
    got = ", ".join(f"{n} of {w} x {p}" for (p, n), (_, w) in _pairs(fit))
    return f"{wanted}: does not fit now; {policy}, largest first, placed {got}"


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
        if args.yes and not args.apply:
            raise ArgumentError(
                "--yes applies with --apply only (it answers the eviction question)"
            )
        if not 1 <= args.count <= MAX_DEFRAG_COUNT:
            raise ArgumentError(f"--count must be from 1 to {MAX_DEFRAG_COUNT:,}, got {args.count}")
        api = (connect or connect_cluster)(args)
    except DriverError as exc:
        return refuse("defrag", exc)
    with api:
        try:
            snapshot = read_snapshot(api, policy=args.policy)
        except DriverError as exc:
            return refuse("defrag", ConfigError(f"cannot read the cluster: {exc}"))
        plan = plan_defrag(snapshot.engine, snapshot.units, profile=args.profile, count=args.count)
        if isinstance(plan, NoPlan):
            return refuse("defrag", ConfigError(no_plan_words(plan)))
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
        if not args.yes and not _confirmed(confirm, f"Evict {len(pods)} pod(s)? [y/N] "):
            out.write("Nothing was changed.\n")
            return 1
        return _evict(api, pods, out=out)


def _confirmed(confirm: Callable[[str], str], question: str) -> bool:
    """``confirm``'s answer is yes; no answer at all (stdin closed) is no."""
    try:
        answer = confirm(question)
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def no_plan_words(plan: NoPlan) -> str:
    """Why there is no plan, in words that tell "none exists" from "the search stopped"."""
    if plan.budget_exhausted:
        return (
            f"the search stopped at its budget without a plan ({plan.reason}); a plan may exist "
            "all the same: free some slices by hand, or ask for fewer"
        )
    return f"no plan exists: {plan.reason}"


def _evict(api: Any, pods: Sequence[Any], *, out: TextIO) -> int:
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
