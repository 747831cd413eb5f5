"""The ``instaslice`` command: operator tools.

``instaslice status``  each GPU's MIG slice map (who holds which placement), for any cluster
                       reachable through a kubeconfig or a plain API server URL.
``instaslice simulate`` capacity planning: replay a request trace per placement policy beside
                       the fluid floor, or how much more fits the cluster now.
``instaslice defrag``  the fewest pods to move so that a profile fits; ``--apply`` evicts them.
``instaslice uninstall`` remove InstaSlice without stranding a pod: refuses while pods hold
                       slices, or (``--drain``) evicts them and waits for their slices first.
``instaslice demo``    the whole system on this machine: a local API server, emulated kubelets,
                       the real controller and kubelet plugins, the samples applied and removed.
                       The demo is the lab's (``localcluster.demo``, in a checkout only); this
                       command only starts it, by name, and imports nothing of the lab.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from api import names
from driver.checkpoint import CheckpointStore
from driver.cluster.port import NODES
from driver.errors import ApiNotFoundError, CheckpointError, ConfigError, DriverError
from instaslice.flags import (
    add_defrag_parser,
    add_demo_parser,
    add_simulate_parser,
    add_status_parser,
)
from instaslice.inputs import (
    ArgumentError,
    CommandParser,
    check_regular_file,
    connect_cluster,
    connection_flag_problem,
    package_version,
    refuse,
)
from instaslice.status import ClusterView, Style, mig_uuids_from_checkpoints, read_view, render_view
from instaslice.uninstall.command import add_uninstall_parser, run_uninstall

CLEAR_SCREEN = "\x1b[H\x1b[2J"
MAX_CHECKPOINT_BYTES = 64 * 1024 * 1024
"""A kubelet-plugin checkpoint holds a node's prepared claims: kilobytes, never this much."""


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="instaslice",
        description="InstaSlice operator tools: MIG slices created on demand for Kubernetes pods.",
    )
    parser.add_argument("--version", action="version", version=package_version())
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_status_parser(sub)
    add_demo_parser(sub)
    add_simulate_parser(sub)
    add_defrag_parser(sub)
    add_uninstall_parser(sub)
    for command in sub.choices.values():
        # whose refusal an argument left over is: "instaslice status: unrecognized arguments"
        command.set_defaults(command_parser=command)
    return parser


def use_color(*, no_color: bool, stream: TextIO) -> bool:
    if no_color or os.getenv("NO_COLOR"):
        return False
    return stream.isatty()


def render_status(view: ClusterView, *, nodes: Sequence[str], style: Style) -> str:
    if nodes:
        wanted = set(nodes)
        view = ClusterView(
            gpus=tuple(g for g in view.gpus if g.node in wanted),
            strays=tuple(s for s in view.strays if s.pool in wanted),
            holds=tuple(h for h in view.holds if h.node in wanted),
        )
    return render_view(view, style=style)


def run_status(
    args: argparse.Namespace,
    *,
    out: TextIO,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """``instaslice status``: the command line, then the checkpoints and the connection are
    checked before the first read; a node named by ``--node`` that shows no GPU at the first read
    is an error."""
    if (problem := connection_flag_problem(args)) is not None:
        return refuse("status", ArgumentError(problem))
    try:
        check_checkpoints(args.checkpoint)
        api = connect_cluster(args)
    except DriverError as exc:
        return refuse("status", exc)
    style = Style(color=use_color(no_color=args.no_color, stream=out), short_uuids=args.short_uuids)
    with api:
        first = True
        while True:
            try:
                view = read_view(api, mig_uuids=mig_uuids_from_checkpoints(args.checkpoint))
            except DriverError as exc:
                return refuse("status", ConfigError(f"cannot read the cluster: {exc}"))
            if first and (problem := missing_nodes(api, view, args.node)):
                return refuse("status", ConfigError(problem))
            first = False
            text = render_status(view, nodes=args.node, style=style)
            if args.watch is None:
                out.write(text)
                out.flush()
                return 0
            out.write((CLEAR_SCREEN if style.color else "\n") + text)
            out.flush()
            sleep(args.watch)


def check_checkpoints(paths: Sequence[Path]) -> None:
    """``ConfigError`` unless every ``--checkpoint`` is a readable kubelet-plugin checkpoint."""
    for path in paths:
        check_regular_file(path, what="checkpoint", max_bytes=MAX_CHECKPOINT_BYTES)
        try:
            CheckpointStore(path).load()
        except CheckpointError as exc:
            raise ConfigError(str(exc)) from exc


def missing_nodes(api: Any, view: ClusterView, nodes: Sequence[str]) -> str | None:
    """Why the nodes of ``nodes`` that show no GPU in ``view`` show none (None: all show some)."""
    shown = {gpu.node for gpu in view.gpus}
    problems = []
    for node in dict.fromkeys(n for n in nodes if n not in shown):
        try:
            api.get(NODES, name=node)
        except ApiNotFoundError:
            problems.append(f"node {node} does not exist")
            continue
        except DriverError as exc:
            problems.append(
                f"node {node} publishes no MIG devices of {names.DRIVER_NAME} (whether it exists "
                f"could not be read: {exc})"
            )
            continue
        problems.append(
            f"node {node} publishes no MIG devices of {names.DRIVER_NAME} (is the kubelet plugin "
            "running there, and are its GPUs in MIG mode?)"
        )
    return "; ".join(problems) or None


LAB_PACKAGE = "localcluster"
DEMO_MODULE = "localcluster.demo"
"""The demo lives in the lab, which a checkout has and the installed package does not: the product
never imports it (docs/design.md "Components"), it only starts it by this name."""
DEMO_NEEDS_CHECKOUT = (
    "instaslice demo: the demo runs on the local cluster emulator (localcluster/), which is part of "
    "the source repository, not of the installed package: run `make demo` in a checkout"
)


def run_demo(argv: Sequence[str]) -> int:
    """Become ``python -m localcluster.demo ARGV`` (the same process: the demo's output, Ctrl-C
    and exit status are the command's), with the checkout that holds the lab first on the path;
    one clear line where no checkout is on this interpreter's path."""
    checkout = _checkout_with_the_lab()
    if checkout is not None:
        path = os.pathsep.join(p for p in (str(checkout), os.environ.get("PYTHONPATH", "")) if p)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(  # noqa: S606 - this interpreter, a fixed module, the user's own arguments
            sys.executable,
            [sys.executable, "-m", DEMO_MODULE, *argv],
            {**os.environ, "PYTHONPATH": path},
        )
    print(DEMO_NEEDS_CHECKOUT, file=sys.stderr)
    return 1  # nothing wrong with the arguments: the demo is not where this command runs


def _checkout_with_the_lab() -> Path | None:
    """The folder holding ``localcluster/`` on this interpreter's path, found without importing
    anything of it; None where there is none (an installed package)."""
    try:
        spec = importlib.util.find_spec(LAB_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).resolve().parent.parent


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command != "demo" and rest:
        args.command_parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return _run(args, rest)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of our output went away (``| head``): nothing more to say, and nothing to
        # flush at exit either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _run(args: argparse.Namespace, rest: Sequence[str]) -> int:
    if args.command == "status":
        return run_status(args, out=sys.stdout)
    if args.command == "uninstall":
        return run_uninstall(args, out=sys.stdout, stdin=sys.stdin)
    if args.command in ("simulate", "defrag"):
        from instaslice import plancli  # noqa: PLC0415

        if args.command == "simulate":
            return plancli.run_simulate(args, out=sys.stdout)
        return plancli.run_defrag(args, out=sys.stdout)
    return run_demo(rest)


if __name__ == "__main__":
    sys.exit(main())
