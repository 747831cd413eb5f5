"""``make demo`` / ``instaslice demo``: the whole system on this machine, no GPU, no cluster.

Starts :class:`~localcluster.stack.InstaSliceStack` (local API server, emulated kubelets and
scheduler, the real controller and one real kubelet plugin per node), applies ``samples/`` as
``kubectl apply -k samples/`` would, prints every pod's way through InstaSlice (Pending → gated →
placed → bound → Running) and the GPUs' memory-slice bars as they fill, then the full slice map;
deletes the samples, shows the slices go, and stops everything. Ctrl-C (or SIGTERM) at any point
stops every process and removes every socket and temporary file.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, TextIO

from driver.errors import ConfigError
from driver.gpu.emulated import parse_gpu_spec
from instaslice.inputs import CommandParser, check_regular_file, integer_between, number_between
from instaslice.status import ClusterView, Style, TakenSlice, memory_bar, render_view
from localcluster import podstages
from localcluster.manifests import render_kustomization
from localcluster.podstages import StageChange

if TYPE_CHECKING:
    from localcluster.stack import InstaSliceStack

DEMO_COMMAND = "instaslice demo"
"""The demo's name in its usage and messages, however it was started: ``instaslice demo`` is the
name users know; it starts ``python -m localcluster.demo``, which ``make demo`` runs directly."""
DEFAULT_NODES = 2
DEFAULT_GPUS = "2xA100-40GB"
DEFAULT_SAMPLES = Path(__file__).resolve().parent.parent / "samples"
SETTLE_TIMEOUT_S = 90.0
MAX_DEMO_NODES = 8
"""One kubelet plugin process per node runs on this machine."""
MAX_DEMO_GPUS_PER_NODE = 8
MAX_PAUSE_S = 600.0
MAX_TIMEOUT_S = 3600.0
POD_COLUMN = 52
CLEANUP_TIMEOUT_S = 30.0
DESCRIPTION = (
    "The whole InstaSlice system on this machine, with no GPU and no cluster: a local API server, "
    "emulated kubelets and scheduler, the real controller and one real kubelet plugin per node on "
    "emulated GPUs. It applies samples/ as 'kubectl apply -k samples/' would, follows every pod "
    "(Pending -> gated -> placed -> bound -> Running) and each GPU's memory-slice bar, prints the "
    "slice map, deletes the samples, shows every slice gone and stops everything. Ctrl-C at any "
    "point stops every process and removes every socket and temporary file."
)
EPILOG = (
    "The samples ask for A100-40GB profiles: all of them run when the nodes hold at least four "
    "A100-40GB in all, as the default does; with fewer, those that do not fit stay gated until "
    "--timeout and the demo exits 1. Exit status: 0 when every sample ran and every slice was "
    "released, 1 when a step did not finish in time or --samples cannot be read, 2 for a "
    "malformed argument, 130 on Ctrl-C."
)

_RESET = "\x1b[0m"
_STAGE_COLORS = {
    podstages.PENDING: "\x1b[37m",
    podstages.GATED: "\x1b[33m",
    podstages.HELD: "\x1b[33m",
    podstages.PLACED: "\x1b[36m",
    podstages.BOUND: "\x1b[34m",
    "Running": "\x1b[32m",
    "Succeeded": "\x1b[32m",
    "Failed": "\x1b[31m",
    podstages.TERMINATING: "\x1b[35m",
    podstages.GONE: "\x1b[2m",
}


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nodes",
        type=integer_between(1, MAX_DEMO_NODES),
        default=DEFAULT_NODES,
        help=f"emulated nodes, from 1 to {MAX_DEMO_NODES} (default {DEFAULT_NODES})",
    )
    parser.add_argument(
        "--gpus",
        type=demo_gpus,
        default=DEFAULT_GPUS,
        help=f"emulated GPUs per node, e.g. 2xA100-40GB or A100-40GB,H100-80GB; at most "
        f"{MAX_DEMO_GPUS_PER_NODE} (default {DEFAULT_GPUS})",
    )
    parser.add_argument(
        "--samples",
        type=Path,
        default=DEFAULT_SAMPLES,
        help="kustomization directory to apply (default: the repository's samples/)",
    )
    parser.add_argument("--no-color", action="store_true", help="plain text (also: NO_COLOR=1)")
    parser.add_argument(
        "--fast",
        action="store_true",
        help="non-interactive: no pauses between the steps (tests, CI, recordings)",
    )
    parser.add_argument(
        "--pause",
        type=number_between(0, MAX_PAUSE_S, what="seconds"),
        default=3.0,
        metavar="SECONDS",
        help=f"pause with the samples running before deleting them (default 3, at most "
        f"{MAX_PAUSE_S:g}; 0 with --fast)",
    )
    parser.add_argument(
        "--timeout",
        type=number_between(0, MAX_TIMEOUT_S, low_included=False, what="seconds"),
        default=SETTLE_TIMEOUT_S,
        metavar="SECONDS",
        help=f"how long the samples may take to run (default {SETTLE_TIMEOUT_S:.0f}, at most "
        f"{MAX_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--keep-logs",
        action="store_true",
        help="keep the daemons' logs (printed path) instead of removing everything at the end",
    )


def demo_gpus(text: str) -> str:
    """An argparse ``type``: the emulated GPUs of one node, checked (``parse_gpu_spec``) and at
    most ``MAX_DEMO_GPUS_PER_NODE`` of them; kept as written, as the kubelet plugins take it."""
    try:
        count = len(parse_gpu_spec(text))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if count > MAX_DEMO_GPUS_PER_NODE:
        raise argparse.ArgumentTypeError(
            f"{count} GPUs per node; the demo draws every GPU, at most {MAX_DEMO_GPUS_PER_NODE}"
        )
    return text


def demo_plan(samples: Path) -> DemoPlan:
    """What the demo will apply, read before any daemon starts; ``ConfigError`` if unreadable."""
    if not samples.is_dir():
        raise ConfigError(f"--samples {samples} is not a directory (a kustomization directory)")
    check_regular_file(samples / "kustomization.yaml", what="kustomization")
    return plan_for(render_kustomization(samples))


class Printer:
    """Everything the demo says goes through here: one place decides about colour."""

    def __init__(self, out: TextIO, *, color: bool) -> None:
        self.out = out
        self.color = color
        self.style = Style(color=color, short_uuids=True)
        self._t0 = time.monotonic()

    def restart_clock(self) -> None:
        self._t0 = time.monotonic()

    def paint(self, text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if self.color else text

    def line(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def heading(self, text: str) -> None:
        self.line()
        self.line(self.paint(f"== {text}", "\x1b[1m"))

    def step(self, text: str) -> None:
        self.line(f"   {self.paint('ok', chr(27) + '[32m')}  {text}")

    def stamp(self, at: float | None = None) -> str:
        return f"+{(time.monotonic() if at is None else at) - self._t0:6.2f}s"

    def stage(self, change: StageChange, detail: str, *, at: float | None = None) -> None:
        before = self.paint(f"{change.before:>11}", _STAGE_COLORS.get(change.before, ""))
        after = self.paint(f"{change.after:<11}", _STAGE_COLORS.get(change.after, ""))
        pod = f"{change.pod:<{POD_COLUMN}}"
        self.line(f"  {self.stamp(at)}  {pod} {before} -> {after} {detail}".rstrip())

    def bars(self, view: ClusterView) -> None:
        for node in view.nodes:
            gpus = "  ".join(
                f"gpu{g.index} {memory_bar(g, style=self.style)}"
                for g in view.gpus
                if g.node == node
            )
            self.line(f"  {'':>8}  {'':<{POD_COLUMN}} {'slices':>11}    {node}  {gpus}")


@dataclass(frozen=True, slots=True)
class DemoPlan:
    objects: list[dict[str, object]]
    namespaces: tuple[str, ...]
    expected_pods: int


def expected_pods(objects: Sequence[dict[str, object]]) -> int:
    """Pods the samples make when everything runs: one per Pod, ``replicas`` per Deployment,
    ReplicaSet and StatefulSet, ``parallelism`` (capped by ``completions``) per Job."""
    total = 0
    for obj in objects:
        kind = obj.get("kind")
        spec = obj.get("spec")
        spec = spec if isinstance(spec, dict) else {}
        if kind == "Pod":
            total += 1
        elif kind in ("Deployment", "ReplicaSet", "StatefulSet"):
            total += int(spec.get("replicas", 1))
        elif kind == "Job":
            parallelism = int(spec.get("parallelism", 1))
            total += min(parallelism, int(spec.get("completions", parallelism)))
    return total


def plan_for(objects: list[dict[str, object]]) -> DemoPlan:
    namespaces: dict[str, None] = {}
    for obj in objects:
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        if obj.get("kind") == "Namespace":
            namespaces[str(meta.get("name"))] = None
        elif meta.get("namespace"):
            namespaces[str(meta["namespace"])] = None
    return DemoPlan(
        objects=objects, namespaces=tuple(namespaces), expected_pods=expected_pods(objects)
    )


def slices_of(view: ClusterView, pod: str) -> list[tuple[str, int, TakenSlice]]:
    return [
        (gpu.node, gpu.index, item)
        for gpu in view.gpus
        for item in gpu.taken
        if any(ref.key == pod for ref in item.pods)
    ]


def detail_for(change: StageChange, view: ClusterView, *, last: ClusterView | None) -> str:
    """What to say next to a stage change: the held-by gate, the placement, the MIG UUIDs."""
    pod = change.pod_object or {}
    if change.after == podstages.GATED:
        return "waiting for the controller to place its slices"
    if change.after == podstages.HELD:
        gates = ", ".join(g for g in (pod.get("spec") or {}).get("schedulingGates") or [])
        return f"held by another gate {gates}".rstrip()
    held = slices_of(view, change.pod) or (slices_of(last, change.pod) if last else [])
    where = ", ".join(
        f"{node} gpu{index} {item.profile}@{item.placement.start}" for node, index, item in held
    )
    if change.after in (podstages.PLACED, podstages.BOUND):
        node = (pod.get("spec") or {}).get("nodeName")
        prefix = f"on {node}: " if node and change.after == podstages.BOUND else ""
        return prefix + (where or "no MIG slice")
    if change.after == "Running":
        uuids = ", ".join(item.mig_uuid[:12] + "…" for _, _, item in held if item.mig_uuid)
        return f"{where}{'  ' + uuids if uuids else ''}" if where else ""
    if change.after == podstages.GONE and held:
        return f"released {where}"
    return ""


class Watcher:
    """Follows the pods of the samples' namespaces through a watch (every stage change is seen,
    however fast) and prints each change, with the slice map's view of the pod at that moment."""

    def __init__(self, stack: InstaSliceStack, plan: DemoPlan, printer: Printer) -> None:
        from driver.cluster.informer import Informer, ListWatch  # noqa: PLC0415
        from driver.cluster.port import PODS  # noqa: PLC0415

        self._stack = stack
        self._namespaces = set(plan.namespaces)
        self._expected = plan.expected_pods
        self._printer = printer
        self._events: queue.Queue[tuple[float, str, dict[str, object] | None]] = queue.Queue()
        self._informer = Informer(source=ListWatch(api=stack.api, resource=PODS), name="demo-pods")
        self._informer.add_handler(
            on_add=self._seen,
            on_update=lambda old, new: self._seen(new),
            on_delete=self._gone,
        )
        self.stages: dict[str, str] = {}
        self.pods: dict[str, dict[str, object]] = {}
        self.view: ClusterView | None = None
        self._bars: tuple[tuple[str, int, str], ...] | None = None

    def start(self) -> None:
        self._informer.start()
        if not self._informer.wait_for_sync(timeout=10.0):
            raise TimeoutError("the pod watch did not start")

    def stop(self) -> None:
        self._informer.stop()

    def _wanted(self, pod: dict[str, object]) -> bool:
        meta = pod.get("metadata")
        return isinstance(meta, dict) and meta.get("namespace") in self._namespaces

    def _seen(self, pod: dict[str, object]) -> None:
        if self._wanted(pod):
            self._events.put((time.monotonic(), podstages.pod_key(pod), pod))

    def _gone(self, pod: dict[str, object]) -> None:
        if self._wanted(pod):
            self._events.put((time.monotonic(), podstages.pod_key(pod), None))

    def tick(self, timeout: float) -> None:
        """Print what happened since the last tick (waiting up to ``timeout`` for something)."""
        batch = []
        try:
            batch.append(self._events.get(timeout=timeout))
            while True:
                batch.append(self._events.get_nowait())
        except queue.Empty:
            pass
        view = self._stack.view()
        for moment, key, pod in batch:
            before = self.stages.get(key, podstages.PENDING)
            after = podstages.GONE if pod is None else podstages.pod_stage(pod)
            if pod is None:
                self.stages.pop(key, None)
                self.pods.pop(key, None)
            else:
                self.stages[key] = after
                self.pods[key] = pod
            if after != before:
                change = StageChange(pod=key, before=before, after=after, pod_object=pod)
                self._printer.stage(change, detail_for(change, view, last=self.view), at=moment)
        bars = tuple((g.node, g.index, g.memory_map()) for g in view.gpus)
        if bars != self._bars:
            self._printer.bars(view)
            self._bars = bars
        self.view = view

    def settled(self) -> bool:
        finished = [s for s in self.stages.values() if s in ("Running", "Succeeded")]
        return len(finished) >= self._expected and all(
            s in podstages.FINAL_PHASES for s in self.stages.values()
        )

    def drained(self) -> bool:
        if self.stages or self.view is None or self.view.slices_taken():
            return False
        return not any(self._stack.mig_instances(n) for n in self._stack.node_names)


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread (tests): nothing to install
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _wait(watcher: Watcher, done: str, *, timeout: float, interval: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        watcher.tick(interval)
        if getattr(watcher, done)():
            return True
        if time.monotonic() >= deadline:
            return False


def run_demo(args: argparse.Namespace, *, out: TextIO) -> int:
    """The whole demo; 0 when every sample ran and every slice was gone at the end. The samples
    are read first: a bad ``--samples`` is one line, before any daemon starts."""
    from localcluster.stack import InstaSliceStack, StackConfig  # noqa: PLC0415

    try:
        plan = demo_plan(args.samples)
    except ConfigError as exc:
        print(f"{DEMO_COMMAND}: {exc}", file=sys.stderr)
        return 1
    color = not (args.no_color or os.environ.get("NO_COLOR")) and out.isatty()
    printer = Printer(out, color=color)
    stack = InstaSliceStack(StackConfig(nodes=args.nodes, gpus=args.gpus))
    watcher: Watcher | None = None
    with _sigterm_as_interrupt():
        try:
            _start(stack, printer, args)
            watcher = Watcher(stack, plan, printer)
            watcher.start()
            ok = _run_samples(stack, watcher, plan, printer, args)
        except KeyboardInterrupt:
            printer.line()
            printer.line("interrupted: stopping everything")
            return 130
        finally:
            _stop(stack, watcher, printer, keep_logs=args.keep_logs)
    return 0 if ok else 1


def _start(stack: InstaSliceStack, printer: Printer, args: argparse.Namespace) -> None:
    printer.heading(
        f"InstaSlice demo: {args.nodes} node(s) x {args.gpus}, emulated GPUs, all under "
        f"{stack.root}"
    )
    stack.start()
    printer.step(f"local API server {stack.url}   ({stack.kubeconfig_hint()})")
    for node in stack.node_names:
        printer.step(
            f"instaslice-kubelet-plugin on {node} (pid {stack.plugins[node].pid}): "
            "registered with the kubelet, ResourceSlices published"
        )
    assert stack.controller is not None
    printer.step(
        f"instaslice-controller (pid {stack.controller.pid}): leader, pod webhook on "
        f"https://127.0.0.1:{stack.webhook_port}"
    )
    printer.line(
        f"   watch it from another terminal:  instaslice status --kube-api-url {stack.url} --watch"
    )
    printer.heading("Every GPU is empty: each placement a pod could get is published")
    printer.line(render_view(stack.view(), style=printer.style).rstrip())


def _run_samples(
    stack: InstaSliceStack,
    watcher: Watcher,
    plan: DemoPlan,
    printer: Printer,
    args: argparse.Namespace,
) -> bool:
    """Apply the samples, follow them to Running, delete them, follow the slices away; False if
    a step did not finish in time."""
    from localcluster.manifests import apply_all, delete_all  # noqa: PLC0415

    ok = True
    interval = 0.05 if args.fast else 0.2
    printer.heading(f"kubectl apply -k {_shown(args.samples)}")
    printer.restart_clock()
    for outcome in apply_all(stack.api, plan.objects):
        printer.line(f"   {outcome}")
    printer.heading(
        f"Pods on their way ({plan.expected_pods} expected): "
        "Pending -> gated -> placed -> bound -> Running"
    )
    if not _wait(watcher, "settled", timeout=args.timeout, interval=interval):
        ok = False
        _report_stuck(watcher, printer)
    printer.heading("The slice map with the samples running (instaslice status)")
    printer.line(render_view(stack.view(), style=printer.style).rstrip())
    if not args.fast and args.pause:
        time.sleep(args.pause)
    printer.heading(f"kubectl delete -k {_shown(args.samples)}")
    printer.restart_clock()
    for outcome in delete_all(stack.api, plan.objects):
        printer.line(f"   {outcome}")
    if not _wait(watcher, "drained", timeout=CLEANUP_TIMEOUT_S, interval=interval):
        ok = False
        printer.line("   !! not every slice was released in time")
    printer.heading("After the delete: no slice left")
    printer.line(render_view(stack.view(), style=printer.style).rstrip())
    printer.line(_leftovers(stack))
    return ok


def _stop(
    stack: InstaSliceStack, watcher: Watcher | None, printer: Printer, *, keep_logs: bool
) -> None:
    if watcher is not None:
        watcher.stop()
    logs = Path(tempfile.mkdtemp(prefix="instaslice-demo-logs-")) if keep_logs else None
    stack.stop(keep_logs=logs)
    printer.heading(
        f"Stopped the controller, the kubelet plugins and the cluster; removed {stack.root}"
    )
    if logs is not None:
        printer.line(f"   daemon logs kept in {logs}")


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd())) + "/"
    except ValueError:
        return str(path)


def _report_stuck(watcher: Watcher, printer: Printer) -> None:
    printer.line("   !! not every sample pod is running; still waiting:")
    for key, stage in sorted(watcher.stages.items()):
        if stage in podstages.FINAL_PHASES:
            continue
        pod = watcher.pods.get(key) or {}
        status = pod.get("status")
        conditions = status.get("conditions") if isinstance(status, dict) else None
        messages = [
            f"{c.get('type')}: {c.get('message')}"
            for c in conditions or []
            if isinstance(c, dict) and c.get("message")
        ]
        printer.line(f"      {key}: {stage}  {'; '.join(messages)}".rstrip())


def _leftovers(stack: InstaSliceStack) -> str:
    parts = []
    for node in stack.node_names:
        paths = stack.node_paths(node)
        specs = len(list(paths.cdi_root.glob("*.json"))) if paths.cdi_root.is_dir() else 0
        instances = len(stack.mig_instances(node))
        parts.append(f"{node}: {instances} MIG instances, {specs} CDI specs")
    return "   " + "; ".join(parts)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog=DEMO_COMMAND, description=DESCRIPTION, epilog=EPILOG)
    add_demo_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m localcluster.demo`` (``make demo``), which ``instaslice demo`` becomes."""
    args = build_parser().parse_args(argv)
    try:
        return run_demo(args, out=sys.stdout)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
