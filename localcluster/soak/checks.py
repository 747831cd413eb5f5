"""The soak's invariants: checked every ``CHECK_INTERVAL_S`` while the churn and the faults run, and
once more after the churn quiesced. Each broken one is a ``Violation`` with the time it was seen.

All the time:

* no memory slice of a GPU in two allocated claims (and no device in two claims), on one consistent
  read of the claims and the published slices;
* no pod waits to be placed longer than ``STUCK_S`` while capacity for it — every slice it asks
  for, on one Ready node — has been free for ``FREE_FOR_S`` (capacity freed a moment ago is not
  yet a stuck pod);
* no daemon exits unless a fault ended it.

After the churn quiesced (every workload deleted): nothing of the churn is left (an object still
there after ``QUIESCE_S`` is a finalizer left on a deleted object); no MIG instance without an
allocated claim; no CDI spec or checkpoint entry without a claim prepared on that node; every
informer cache holds as many objects as the API server has of its kind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from api import names
from driver import cdi
from driver.checkpoint import CheckpointStore
from driver.cluster.port import (
    DEVICE_CLASSES,
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    JsonObject,
    Resource,
)
from driver.cluster.views import ClaimView
from driver.errors import DriverError
from instaslice.status import ClusterView, allocated_claims
from localcluster.soak.ledger import PodLedger
from localcluster.soak.metrics import informer_objects
from localcluster.soak.stack import SoakStack
from localcluster.soak.timeline import Timeline
from localcluster.soak.workloads import NAMESPACE

CHECK_INTERVAL_S: Final = 10.0
STUCK_S: Final = 180.0
FREE_FOR_S: Final = 60.0
QUIESCE_S: Final = 300.0
CACHE_EVERY: Final = 6
"""Informer caches are compared with the API server every this many checks (a minute)."""
INFORMER_KINDS: Final[dict[str, Resource]] = {
    "pods": PODS,
    "claims": RESOURCE_CLAIMS,
    "templates": RESOURCE_CLAIM_TEMPLATES,
    "slices": RESOURCE_SLICES,
    "classes": DEVICE_CLASSES,
    "nodes": NODES,
}


@dataclass(frozen=True, slots=True)
class Violation:
    at_s: float
    kind: str
    text: str


def overlaps(view: ClusterView, claims: list[JsonObject]) -> list[tuple[str, str]]:
    """(key, description) of every memory slice or device held by two allocated claims."""
    found = []
    for item in view.overlapping():
        found.append(
            (f"overlap {item.claim_key} {item.device}", f"{item.claim_key} {item.device} "
             f"({item.profile}@{item.placement.start}) overlaps another allocation")
        )  # fmt: skip
    holders: dict[tuple[str, str], list[str]] = {}
    for claim in claims:
        view_of = ClaimView.of(claim)
        for result in view_of.results_of(names.DRIVER_NAME):
            holders.setdefault((result.pool, result.device), []).append(
                f"{view_of.namespace}/{view_of.name}"
            )
    for (pool, device), owners in holders.items():
        if len(owners) > 1:
            found.append((f"device {pool}/{device}", f"{pool}/{device} allocated to {owners}"))
    return found


def free_capacity(view: ClusterView, ready: set[str]) -> dict[str, dict[str, int]]:
    """Node → profile → how many more slices of it fit now, on Ready nodes only."""
    free: dict[str, dict[str, int]] = {}
    for gpu in view.gpus:
        if gpu.node not in ready:
            continue
        per_node = free.setdefault(gpu.node, {})
        for profile in gpu.free:
            per_node[profile.profile] = per_node.get(profile.profile, 0) + len(profile.starts)
    return free


def fits(needs: dict[str, int], free: dict[str, dict[str, int]]) -> bool:
    """Whether one node has every slice ``needs`` asks for."""
    return any(all(node.get(p, 0) >= n for p, n in needs.items()) for node in free.values())


class Invariants:
    """The checks made all the time, from their own thread."""

    def __init__(
        self,
        *,
        stack: SoakStack,
        ledger: PodLedger,
        timeline: Timeline,
        expected_down: Callable[[], set[str]],
    ) -> None:
        self._stack = stack
        self._ledger = ledger
        self._timeline = timeline
        self._expected_down = expected_down
        self._free_since: dict[str, float] = {}
        self._seen: set[str] = set()
        self.violations: list[Violation] = []
        self.cache_excess: dict[str, float] = {}
        """``<daemon>-<replica>/<informer>`` → the most objects its cache held beyond those that
        existed at the same moment (negative: it lagged behind new ones)."""
        self.checks = 0
        self.failed_reads = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="soak-invariants", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.wait(CHECK_INTERVAL_S):
            try:
                self.check_once()
            except DriverError as exc:  # the API server restarting: check again next time
                self.failed_reads += 1
                self._timeline.note("check", f"invariants not read this time: {exc}")
            except Exception as exc:  # a bug of the harness must not end the checks
                self.failed_reads += 1
                self._timeline.note("check", f"invariant check failed: {exc!r}")

    def _violate(self, key: str, kind: str, text: str) -> None:
        if key in self._seen:
            return
        self._seen.add(key)
        violation = Violation(at_s=self._timeline.now(), kind=kind, text=text)
        self.violations.append(violation)
        self._timeline.note("violation", f"{kind}: {text}")

    def check_once(self) -> None:
        claims = allocated_claims(
            self._stack.api.list_objects(RESOURCE_CLAIMS).items, driver=names.DRIVER_NAME
        )
        view = self._stack.view()
        for key, text in overlaps(view, claims):
            self._violate(key, "overlap", text)
        ready = {n for n in self._stack.node_names if self._stack.node_ready(n)}
        self._stuck(free_capacity(view, ready))
        self._daemons()
        if self.checks % CACHE_EVERY == 0:
            self._caches()
        self.checks += 1

    def _caches(self) -> None:
        """The largest excess of each informer cache over the objects of its kind that exist, as
        seen so far (a cache that kept deleted objects would grow it run after run)."""
        exist = {k: len(self._stack.api.list_objects(r).items) for k, r in INFORMER_KINDS.items()}
        for daemon in self._stack.running_daemons():
            if not daemon.role.startswith("controller"):
                continue
            for (name, informer), count in informer_objects(
                self._stack.metrics_text(daemon)
            ).items():
                if informer in exist:
                    key = f"{daemon.role.replace('controller', name)}/{informer}"
                    excess = count - exist[informer]
                    self.cache_excess[key] = max(self.cache_excess.get(key, excess), excess)

    def _stuck(self, free: dict[str, dict[str, int]]) -> None:
        now = self._timeline.now()
        waiting = self._ledger.waiting_pods()
        for record in waiting:
            if record.shape is None or record.waiting_since_s is None:
                continue
            if fits(record.shape.needs(), free):
                since = self._free_since.setdefault(record.uid, now)
            else:
                self._free_since.pop(record.uid, None)
                continue
            if now - record.waiting_since_s > STUCK_S and now - since >= FREE_FOR_S:
                self._violate(
                    f"stuck {record.uid}",
                    "stuck pending",
                    f"pod {record.name} ({record.shape.name}) waits since "
                    f"{record.waiting_since_s:.0f}s while capacity for it is free since "
                    f"{since:.0f}s; it says {record.reasons or 'nothing'}",
                )
        current = {r.uid for r in waiting}
        for uid in list(self._free_since):
            if uid not in current:
                del self._free_since[uid]

    def _daemons(self) -> None:
        down = self._expected_down()
        stack = self._stack
        processes = {f"controller-{i}": p for i, p in enumerate(stack.controllers)}
        processes.update({f"plugin/{n}": p for n, p in stack.plugins.items()})
        for role, process in processes.items():
            if role not in down and process.starts and not process.running():
                self._violate(
                    f"exit {role} {process.starts}",
                    "daemon exit",
                    f"{role} exited by itself with status {process.returncode()}",
                )


# --- after the churn quiesced ----------------------------------------------------------------


def leftovers(stack: SoakStack) -> list[str]:
    """Objects of the churn still there (with their finalizers and deletion state)."""
    left = []
    for resource in (PODS, RESOURCE_CLAIMS):
        for obj in stack.api.list_objects(resource, namespace=NAMESPACE).items:
            meta = obj["metadata"]
            left.append(
                f"{resource.kind} {meta['name']} finalizers={meta.get('finalizers') or []} "
                f"deleting={bool(meta.get('deletionTimestamp'))}"
            )
    return left


def node_leftovers(stack: SoakStack) -> list[str]:
    """MIG instances without an allocated claim, CDI specs and checkpoint entries without a claim
    prepared on their node."""
    claims = allocated_claims(
        stack.api.list_objects(RESOURCE_CLAIMS).items, driver=names.DRIVER_NAME
    )
    allocated: dict[str, set[str]] = {}
    for claim in claims:
        view = ClaimView.of(claim)
        for result in view.results_of(names.DRIVER_NAME):
            allocated.setdefault(result.pool, set()).add(view.uid)
    taken = {
        (g.node, g.index, t.profile, t.placement.start) for g in stack.view().gpus for t in g.taken
    }
    problems = []
    for node in stack.node_names:
        for instance in stack.mig_instances(node):
            key = (node, instance.gpu_index, instance.profile, instance.placement.start)
            if key not in taken:
                problems.append(
                    f"{node}: MIG instance {instance.profile}@{instance.placement.start} on "
                    f"gpu{instance.gpu_index} without an allocated claim"
                )
        paths = stack.node_paths(node)
        entries = CheckpointStore(paths.checkpoint).load().claims
        for spec_uid in cdi.list_specs(paths.cdi_root):
            if spec_uid not in entries:
                problems.append(f"{node}: CDI spec of claim {spec_uid} without a checkpoint entry")
        for uid, entry in entries.items():
            if uid not in allocated.get(node, set()):
                problems.append(
                    f"{node}: checkpoint entry {entry.namespace}/{entry.name} ({uid}) without a "
                    "claim allocated on this node"
                )
    return problems


def informer_mismatches(stack: SoakStack) -> list[str]:
    """Informer caches that do not hold as many objects as exist (controllers and webhooks)."""
    exist = {kind: len(stack.api.list_objects(r).items) for kind, r in INFORMER_KINDS.items()}
    problems = []
    for daemon in stack.running_daemons():
        if not daemon.role.startswith("controller"):
            continue
        for (daemon_name, informer), count in informer_objects(stack.metrics_text(daemon)).items():
            expected = exist.get(informer)
            if expected is not None and count != expected:
                problems.append(
                    f"{daemon.role} {daemon_name} informer {informer} holds {count:g}, "
                    f"{expected} exist"
                )
    return problems


def wait_quiet(check: Callable[[], list[str]], *, timeout: float) -> list[str]:
    """``check`` until it finds nothing or ``timeout`` passes; what it found last."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(2.0)
