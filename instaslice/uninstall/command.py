"""The ``instaslice uninstall`` sub-command: its flags and its run (``make undeploy``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TextIO

import yaml

from driver.errors import ConfigError, DriverError
from instaslice.flags import add_connection_flags
from instaslice.inputs import (
    ArgumentError,
    check_regular_file,
    connect_cluster,
    connection_flag_problem,
    number_between,
    refuse,
)
from instaslice.uninstall.manifests import deletion_plan
from instaslice.uninstall.run import DEFAULT_TIMEOUT_S, Uninstaller

MAX_MANIFESTS_BYTES = 16 * 1024 * 1024
"""A rendered overlay is tens of kilobytes."""
MAX_TIMEOUT_S = 86_400.0
"""``--timeout``: a day; a wait longer than that is a hang, not a drain."""


def add_uninstall_parser(sub: Any) -> None:
    uninstall = sub.add_parser(
        "uninstall",
        help="remove InstaSlice without stranding pods (`make undeploy`)",
        description="Remove the objects of the rendered manifests (`make manifests`) in an order "
        "that strands no pod: while pods hold MIG slices it refuses and lists them, changing "
        "nothing; with --drain it deletes the DeviceClasses (nothing new is allocated), evicts "
        "those pods and waits until every node has released their slices, then removes the "
        "kubelet plugins, the ResourceSlices, the webhook, the controller and the namespace, and "
        "lifts the placement gate from the DRA pods still carrying it.",
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
        type=number_between(0, MAX_TIMEOUT_S, low_included=False, what="seconds"),
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"how long each wait may take (pods ending, nodes releasing slices, plugins going; "
        f"default {DEFAULT_TIMEOUT_S:g}, at most {MAX_TIMEOUT_S:g})",
    )


def run_uninstall(args: argparse.Namespace, *, out: TextIO, stdin: TextIO) -> int:
    """The command line is checked before the manifests are read, those before the cluster."""
    if (problem := connection_flag_problem(args)) is not None:
        return refuse("uninstall", ArgumentError(problem))
    try:
        objects = _read_manifests(args.filename, stdin=stdin)
        deletion_plan(objects)  # refuses what is not an installation before any connection
        api = connect_cluster(args)
    except DriverError as exc:
        return refuse("uninstall", exc)
    with api:

        def read_metrics(namespace: str, pod: str, port: int) -> str:
            path = f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/metrics"
            return str(api.request("GET", path, accept="text/plain").decode())

        uninstaller = Uninstaller(
            api=api, out=out, read_metrics=read_metrics, timeout_s=args.timeout
        )
        try:
            return uninstaller.run(objects, drain=args.drain)
        except DriverError as exc:
            return refuse("uninstall", exc)


def _read_manifests(filename: str, *, stdin: TextIO) -> list[dict[str, Any]]:
    try:
        if filename == "-":
            text = stdin.read(MAX_MANIFESTS_BYTES + 1)
        else:
            check_regular_file(Path(filename), what="manifests", max_bytes=MAX_MANIFESTS_BYTES)
            text = Path(filename).read_text(encoding="utf-8")
        if len(text) > MAX_MANIFESTS_BYTES:
            raise ConfigError(f"manifests of more than {MAX_MANIFESTS_BYTES} bytes")
        return [o for o in yaml.safe_load_all(text) if isinstance(o, dict)]
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the manifests: {exc}") from exc
