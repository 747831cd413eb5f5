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
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from driver.errors import DriverError
from instaslice.status import ClusterView, Style, mig_uuids_from_checkpoints, read_view, render_view

CLEAR_SCREEN = "\x1b[H\x1b[2J"


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cluster connection")
    group.add_argument(
        "--kubeconfig",
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)",
    )
    group.add_argument("--context", help="kubeconfig context (default: the current one)")
    group.add_argument(
        "--kube-api-url",
        help="plain API server URL without auth (e.g. the demo's local API server)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="instaslice",
        description="InstaSlice operator tools: MIG slices created on demand for Kubernetes pods.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    status = sub.add_parser(
        "status",
        help="show each GPU's MIG slice map",
        description="Each GPU's MIG slice map from the published ResourceSlices and the "
        "allocated ResourceClaims of mig.instaslice.dev: which placements are taken, by which "
        "claim and pod, and which placement starts are still free per profile.",
    )
    add_connection_flags(status)
    status.add_argument(
        "--node", action="append", default=[], help="only this node (may be repeated)"
    )
    status.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="kubelet-plugin checkpoint to read MIG UUIDs from (on a node: "
        "/var/lib/instaslice/checkpoint.json; may be repeated)",
    )
    status.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=float,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2) until Ctrl-C",
    )
    status.add_argument("--short-uuids", action="store_true", help="shorten UUIDs to fit")
    status.add_argument("--no-color", action="store_true", help="plain text (also: NO_COLOR=1)")

    uninstall = sub.add_parser(
        "uninstall",
        help="remove InstaSlice without stranding pods (`make undeploy`)",
        description="Remove the objects of the rendered manifests (`make manifests`) in an order "
        "that strands no pod: while pods hold MIG slices it refuses and lists them, changing "
        "nothing; with --drain it deletes the DeviceClasses (nothing new is allocated), evicts "
        "those pods and waits until their slices are released, then removes the kubelet "
        "plugins, the ResourceSlices, the webhook, the controller and the namespace, and lifts "
        "the placement gate from pods still carrying it.",
    )
    add_connection_flags(uninstall)
    uninstall.add_argument(
        "-f",
        "--filename",
        required=True,
        metavar="FILE",
        help="the rendered manifests of what was deployed (`make manifests`); - reads stdin",
    )
    uninstall.add_argument(
        "--drain",
        action="store_true",
        help="evict the pods holding slices first (their owners may recreate them: they wait "
        "Pending until InstaSlice is installed again)",
    )
    uninstall.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long each wait may take (pods ending, plugins going; default 300)",
    )

    # The demo's arguments (and its --help) belong to localcluster.demo, which only a source
    # checkout has: the installed package neither contains nor imports the test emulator.
    sub.add_parser(
        "demo",
        add_help=False,
        help="run the whole system on this machine with emulated GPUs (from a source checkout; "
        "`instaslice demo --help` for its options)",
    )
    from instaslice.plancli import add_planning_parsers  # noqa: PLC0415

    add_planning_parsers(sub, add_connection_flags)
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
        )
    return render_view(view, style=style)


def run_status(
    args: argparse.Namespace,
    *,
    out: TextIO,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    from driver.cluster.kube import connect  # noqa: PLC0415 - imports kubernetes only when used
    from driver.cluster.throttle import ClientSettings  # noqa: PLC0415

    style = Style(color=use_color(no_color=args.no_color, stream=out), short_uuids=args.short_uuids)
    try:
        api = connect(
            kubeconfig=args.kubeconfig,
            context=args.context,
            url=args.kube_api_url,
            settings=ClientSettings(user_agent="instaslice-cli"),
        )
    except DriverError as exc:
        print(f"instaslice status: {exc}", file=sys.stderr)
        return 1
    with api:
        while True:
            try:
                view = read_view(api, mig_uuids=mig_uuids_from_checkpoints(args.checkpoint))
            except DriverError as exc:
                print(f"instaslice status: cannot read the cluster: {exc}", file=sys.stderr)
                return 1
            text = render_status(view, nodes=args.node, style=style)
            if args.watch is None:
                out.write(text)
                out.flush()
                return 0
            out.write((CLEAR_SCREEN if style.color else "\n") + text)
            out.flush()
            sleep(args.watch)


def run_uninstall(args: argparse.Namespace, *, out: TextIO, stdin: TextIO) -> int:
    import yaml  # noqa: PLC0415

    from driver.cluster.kube import connect  # noqa: PLC0415 - imports kubernetes only when used
    from driver.cluster.throttle import ClientSettings  # noqa: PLC0415
    from instaslice.uninstall.run import Uninstaller  # noqa: PLC0415

    try:
        text = stdin.read() if args.filename == "-" else Path(args.filename).read_text("utf-8")
        objects = [o for o in yaml.safe_load_all(text) if isinstance(o, dict)]
    except (OSError, yaml.YAMLError) as exc:
        print(f"instaslice uninstall: cannot read the manifests: {exc}", file=sys.stderr)
        return 2
    try:
        api = connect(
            kubeconfig=args.kubeconfig,
            context=args.context,
            url=args.kube_api_url,
            settings=ClientSettings(user_agent="instaslice-cli"),
        )
        with api:

            def read_metrics(namespace: str, pod: str, port: int) -> str:
                path = f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/metrics"
                return api.request("GET", path, accept="text/plain").decode()

            uninstaller = Uninstaller(
                api=api, out=out, read_metrics=read_metrics, timeout_s=args.timeout
            )
            return uninstaller.run(objects, drain=args.drain)
    except DriverError as exc:
        print(f"instaslice uninstall: {exc}", file=sys.stderr)
        return 1


DEMO_NEEDS_CHECKOUT = (
    "instaslice demo: the demo runs on the local cluster emulator (localcluster/), which is part of "
    "the source repository, not of the installed package: run `make demo` in a checkout"
)


def run_demo(argv: Sequence[str]) -> int:
    """Hand ``argv`` to ``localcluster.demo``; one clear line when it is not importable."""
    try:
        from localcluster import demo  # noqa: PLC0415 - a checkout's test emulator, never shipped
    except ModuleNotFoundError as exc:
        if exc.name != "localcluster":
            raise
        print(DEMO_NEEDS_CHECKOUT, file=sys.stderr)
        return 2
    return demo.main(argv, prog="instaslice demo")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command != "demo" and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
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
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
