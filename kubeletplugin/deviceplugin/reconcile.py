"""After ``Allocate``: make shadow claims match who really holds the slices, and release finished ones.

One pass reads three things — the kubelet's pod-resources ``List`` (which container holds which
device ids), this node's shadow claims (API server) and the checkpoint — and then, under the shim's
lock (no ``Allocate`` interleaves):

1. **Holders.** For each claim the shim bound to device ids, the container the kubelet lists with
   those ids is recorded in the checkpoint binding, and the claim is moved to stand for it if it
   stood for another one (``moves``: with a spare claim given back to the container that lost it).
   So deleting pod A frees the slices pod A uses, never those pod B got from A's reservation.
   A claim held by a pod of another namespace cannot be moved (owner references do not cross
   namespaces): it is logged and reported with a Warning event on both pods, and step 2 keeps its
   slices while that container holds them.
2. **Release.** A bound claim whose ids no container holds and whose shadow claim is gone from
   this node (deleted, being deleted, deallocated, or allocated elsewhere — the pod was deleted and
   garbage-collected, or the controller released a finished pod's claim) is unprepared through
   ``DeviceState``: slices destroyed, CDI spec and checkpoint entry removed. Both conditions are
   needed: a slice the kubelet still lists is in use, whatever the API server says.
3. **Never seen.** Ids answered to ``Allocate`` that no container ever held (the kubelet never got
   the answer: admission failed, or the plugin died first) are dropped from the claim after a grace
   period; the claim stays prepared and can be bound by the next ``Allocate``, or is released with
   its claim.

Nothing is decided on an unknown answer: if the kubelet cannot be asked (restarting) nothing is
released or unbound; if the API server cannot be read, the pass does nothing. Release is idempotent
(``unprepare_claim`` of a gone entry is a no-op), so repeated passes and plugin restarts never free
twice. Claims prepared without a binding (a checkpoint rebuilt from the API after corruption) are
adopted as used by their owner, so they are released with their claim instead of leaking.
"""

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from api import wire
from api.checkpoint import PreparedClaim, PrepareState, ShimBinding
from driver.cluster.events import WARNING, EventRecorder
from driver.cluster.port import PODS, ClusterApi
from driver.daemon.wakeable import WakeableThread
from driver.errors import ClusterError, DriverError
from driver.ids import ClaimUid, PodUid
from kubeletplugin.deviceplugin import bindings
from kubeletplugin.deviceplugin.allocate import SlicePreparer, claim_ref
from kubeletplugin.deviceplugin.moves import Move, plan_moves
from kubeletplugin.deviceplugin.podresources import (
    ContainerKey,
    Holdings,
    PodResourcesError,
    PodResourcesSource,
)
from kubeletplugin.deviceplugin.pods import PodCache
from kubeletplugin.deviceplugin.shadow import (
    ShadowClaim,
    Slot,
    by_uid,
    list_shadow_claims,
    move_claim,
)
from kubeletplugin.deviceplugin.staleness import claim_gone
from kubeletplugin.node.inventory import NodeInventory

logger = logging.getLogger(__name__)

CROSSED_NAMESPACES_REASON = "ClassicSliceCrossedNamespaces"
"""Event reason on both pods when a container holds the slices of another namespace's claim."""


@dataclass(slots=True)
class ReconcileReport:
    """What one pass did (logged; asserted on by tests)."""

    skipped: str = ""
    holders: dict[str, str] = field(default_factory=dict)
    """Claim UID → the container recorded as holding it."""
    moved: list[tuple[str, str]] = field(default_factory=list)
    """(claim UID, slot it now stands for)."""
    released: list[str] = field(default_factory=list)
    unbound: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    """Bound claims whose holder has not shown up yet (the pass should be retried soon)."""
    adopted: list[str] = field(default_factory=list)
    cross_namespace: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


class Reconciler:
    """One pass at a time, under the lock ``Allocate`` holds too."""

    def __init__(
        self,
        *,
        node_name: str,
        state: SlicePreparer,
        checkpoint: bindings.CheckpointAccess,
        api: ClusterApi,
        inventory: Callable[[], NodeInventory],
        pod_resources: PodResourcesSource | None,
        lock: threading.RLock,
        resource_for: Callable[[str], str],
        unheld_grace_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        events: EventRecorder | None = None,
    ) -> None:
        self._node = node_name
        self._events = events
        self._state = state
        self._checkpoint = checkpoint
        self._api = api
        self._inventory = inventory
        self._pod_resources = pod_resources
        self._lock = lock
        self._resource_for = resource_for
        self._grace = unheld_grace_seconds
        self._clock = clock
        self._unheld_since: dict[str, float] = {}
        self._warned: set[str] = set()

    def run_pass(self) -> ReconcileReport:
        report = ReconcileReport()
        # Asked before taking the lock: the kubelet may be waiting on an Allocate that waits
        # for the lock. Ids bound meanwhile merely look unheld for one pass (not yet released:
        # their claims are valid, and release re-reads a claim before destroying anything).
        holdings = self._holdings()
        with self._lock:
            try:
                claims = list_shadow_claims(
                    self._api, node_name=self._node, inventory=self._inventory()
                )
            except ClusterError as exc:
                report.skipped = f"cannot list shadow claims: {exc}"
                logger.warning("shim reconcile skipped: %s", report.skipped)
                return report
            self._adopt(claims, report)
            pods = PodCache(self._api)
            held = self._holders(claims, holdings, pods, report)
            self._move(claims, held, pods, report)
            if holdings is not None:
                self._release_or_unbind(claims, holdings, report)
        if report.moved or report.released or report.unbound or report.adopted:
            logger.info(
                "shim reconcile: %d moved, %d released, %d unbound, %d adopted, %d waiting",
                len(report.moved),
                len(report.released),
                len(report.unbound),
                len(report.adopted),
                len(report.waiting),
            )
        return report

    # -- steps ------------------------------------------------------------------------------

    def _adopt(self, claims: list[ShadowClaim], report: ReconcileReport) -> None:
        """Prepared shadow claims without a binding: used by their owner, ids unknown."""
        checkpoint = self._checkpoint.load()
        changes = []
        for claim in claims:
            entry = checkpoint.claim(claim.uid)
            if entry is None or entry.shim is not None or claim.slot is None:
                continue
            if entry.state is not PrepareState.PREPARE_COMPLETED:
                continue
            binding = ShimBinding(
                resource_name=self._resource_for(claim.profile),
                pod_uid=claim.slot.pod_uid,
                container_name=claim.slot.container,
                pod_name=claim.slot.pod_name,
                pod_namespace=claim.slot.namespace,
            )
            changes.append((claim.uid, _constant(binding)))
            report.adopted.append(claim.uid)
        bindings.set_bindings(self._checkpoint, changes)

    def _holdings(self) -> Holdings | None:
        if self._pod_resources is None:
            return None
        try:
            return self._pod_resources.list_holdings(None)
        except PodResourcesError as exc:
            logger.warning(
                "shim reconcile without the kubelet's pod list (nothing released): %s", exc
            )
            return None

    def _holders(
        self,
        claims: list[ShadowClaim],
        holdings: Holdings | None,
        pods: PodCache,
        report: ReconcileReport,
    ) -> dict[ClaimUid, Slot]:
        """Claim → the container holding its ids; bindings updated to say so."""
        if holdings is None:
            return {}
        held: dict[ClaimUid, Slot] = {}
        changes = []
        for entry in bindings.shim_entries(self._checkpoint.load()):
            binding = entry.shim
            if binding is None or not binding.device_plugin_ids:
                continue
            holders = holdings.holders_of(binding.resource_name, binding.device_plugin_ids)
            if not holders:
                continue
            holder = min(holders)
            if len(holders) > 1:
                logger.warning(
                    "device ids of claim %s/%s are held by several containers: %s; using %s",
                    entry.namespace,
                    entry.name,
                    ", ".join(sorted(map(str, holders))),
                    holder,
                )
            slot = self._slot(holder, pods)
            if slot is None:
                continue
            self._unheld_since.pop(entry.uid, None)
            held[ClaimUid(entry.uid)] = slot
            report.holders[entry.uid] = str(slot)
            recorded = (binding.pod_uid, binding.container_name, binding.pod_name)
            if recorded != (slot.pod_uid, slot.container, slot.pod_name):
                changes.append((entry.uid, _held_by(slot)))
        bindings.set_bindings(self._checkpoint, changes)
        return held

    def _slot(self, holder: ContainerKey, pods: PodCache) -> Slot | None:
        try:
            pod = pods.get(holder.namespace, holder.pod)
        except ClusterError as exc:
            logger.warning("cannot read pod %s/%s: %s", holder.namespace, holder.pod, exc)
            return None
        if pod is None or pod.node_name not in ("", self._node):
            return None
        return Slot(
            namespace=holder.namespace,
            pod_uid=PodUid(pod.uid),
            pod_name=holder.pod,
            container=holder.container,
        )

    def _move(
        self,
        claims: list[ShadowClaim],
        held: dict[ClaimUid, Slot],
        pods: PodCache,
        report: ReconcileReport,
    ) -> None:
        checkpoint = self._checkpoint.load()

        def need(slot: Slot, profile: str) -> int | None:
            try:
                pod = pods.get(slot.namespace, slot.pod_name)
            except ClusterError:
                return None
            if pod is None or pod.uid != slot.pod_uid:
                return 0
            return pod.needs.get((slot.container, self._resource_for(profile)), 0)

        plan = plan_moves(
            claims=claims,
            held=held,
            spare=lambda c: bindings.is_bindable(checkpoint.claim(c.uid)),
            need=need,
        )
        for claim, holder in plan.cross_namespace:
            report.cross_namespace.append(claim.uid)
            if self._warn_once(
                claim.uid,
                "shadow claim %s is held by %s in another namespace; it cannot be moved there, "
                "its slices stay until that container is gone",
                claim,
                holder,
            ):
                self._report_crossing(claim, holder)
        for move in plan.unrepaid:
            logger.warning(
                "%s got the slices reserved for %s, and had no reservation of its own to give "
                "back (admitted without the InstaSlice webhook?); %s is left without one",
                move.to,
                move.claim.slot,
                move.claim.slot,
            )
        for swap in plan.swaps:
            if swap.spare is not None and not self._write(swap.spare, report):
                continue
            self._write(swap.holder, report)

    def _write(self, move: Move, report: ReconcileReport) -> bool:
        try:
            move_claim(self._api, move.claim, move.to)
        except ClusterError as exc:
            logger.warning(
                "moving shadow claim %s to %s failed (next pass retries): %s",
                move.claim,
                move.to,
                exc,
            )
            report.failed.append(move.claim.uid)
            return False
        report.moved.append((move.claim.uid, str(move.to)))
        return True

    def _release_or_unbind(
        self, claims: list[ShadowClaim], holdings: Holdings, report: ReconcileReport
    ) -> None:
        here = by_uid(claims)
        now = self._clock()
        changes = []
        for entry in bindings.shim_entries(self._checkpoint.load()):
            binding = entry.shim
            if binding is None or holdings.holders_of(
                binding.resource_name, binding.device_plugin_ids
            ):
                continue
            claim = here.get(ClaimUid(entry.uid))
            if claim is None or claim.deleting:
                gone = self._why_gone(entry)
                if gone is None:
                    continue
                logger.info(
                    "releasing shadow claim %s/%s: %s, and no container holds its slices",
                    entry.namespace,
                    entry.name,
                    gone,
                    extra={"claim_uid": entry.uid},
                )
                try:
                    self._state.unprepare_claim(claim_ref(entry))
                except DriverError as exc:
                    logger.warning(
                        "releasing claim %s/%s failed (next pass retries): %s",
                        entry.namespace,
                        entry.name,
                        exc,
                    )
                    report.failed.append(entry.uid)
                    continue
                self._unheld_since.pop(entry.uid, None)
                report.released.append(entry.uid)
                continue
            if not binding.device_plugin_ids or binding.pod_uid is not None:
                continue
            since = self._unheld_since.setdefault(entry.uid, now)
            if now - since < self._grace:
                report.waiting.append(entry.uid)
                continue
            logger.info(
                "no container ever held the ids of claim %s/%s (%s); freeing them for the next Allocate",
                entry.namespace,
                entry.name,
                ", ".join(binding.device_plugin_ids),
            )
            changes.append((entry.uid, bindings.unbound(binding.resource_name)))
            self._unheld_since.pop(entry.uid, None)
            report.unbound.append(entry.uid)
        bindings.set_bindings(self._checkpoint, changes)

    def _why_gone(self, entry: PreparedClaim) -> str | None:
        """Why the claim no longer holds its slices here, confirmed by reading it (the list may
        have skipped it for another reason, e.g. an inventory being re-read); None if it does."""
        try:
            gone = claim_gone(self._api, entry, node_name=self._node, deleting_is_gone=True)
        except ClusterError as exc:
            logger.warning("cannot read claim %s/%s: %s", entry.namespace, entry.name, exc)
            return None
        if gone is None:
            logger.warning(
                "shadow claim %s/%s is allocated here but was not listed as a shadow claim of "
                "this node; keeping its slices",
                entry.namespace,
                entry.name,
            )
        return gone

    def _report_crossing(self, claim: ShadowClaim, holder: Slot) -> None:
        """A Warning event on both pods: the one whose reservation went across, and the holder."""
        if self._events is None:
            return
        owner = claim.slot
        owner_text = f"pod {owner.namespace}/{owner.pod_name}" if owner else "no pod"
        self._events.record(
            _pod_ref(holder),
            event_type=WARNING,
            reason=CROSSED_NAMESPACES_REASON,
            message=(
                f"container {holder.container} was given the MIG slices of shadow claim "
                f"{claim.namespace}/{claim.name}, reserved for {owner_text} of another namespace "
                "(the device-plugin Allocate does not say which pod asks). A claim cannot move "
                "between namespaces: the slices stay in use here until this container is gone."
            ),
        )
        if owner is not None:
            self._events.record(
                _pod_ref(owner),
                event_type=WARNING,
                reason=CROSSED_NAMESPACES_REASON,
                message=(
                    f"the MIG slices of this pod's shadow claim {claim.namespace}/{claim.name} "
                    f"were given to container {holder} of another namespace; they stay in use "
                    "there until that container is gone, and are not destroyed with this pod."
                ),
            )

    def _warn_once(self, key: str, message: str, *args: object) -> bool:
        """Log once per key; True the first time."""
        if key in self._warned:
            return False
        self._warned.add(key)
        logger.warning(message, *args)
        return True


def _pod_ref(slot: Slot) -> wire.ObjectStub:
    """Enough of a pod for an event's ``involvedObject``."""
    return {
        "apiVersion": PODS.api_version,
        "kind": PODS.kind,
        "metadata": {"name": slot.pod_name, "namespace": slot.namespace, "uid": slot.pod_uid},
    }


def _held_by(slot: Slot) -> Callable[[ShimBinding | None], ShimBinding]:
    return bindings.held_by(
        pod_uid=slot.pod_uid,
        container=slot.container,
        pod_name=slot.pod_name,
        namespace=slot.namespace,
    )


def _constant(binding: ShimBinding) -> Callable[[ShimBinding | None], ShimBinding]:
    return lambda _: binding


class ReconcileLoop:
    """Runs passes on a thread: at once when triggered (after ``Allocate``, before a container
    starts); while a pass leaves work undone (a holder not seen yet, a failed write) again after
    ``retry_seconds``, doubling up to ``resync_seconds``; otherwise every ``resync_seconds``."""

    def __init__(
        self, reconciler: Reconciler, *, resync_seconds: float, retry_seconds: float = 0.25
    ) -> None:
        self._reconciler = reconciler
        self._resync = resync_seconds
        self._retry = retry_seconds
        self._thread = WakeableThread(self._run, name="shim-reconcile")

    def start(self) -> None:
        self._thread.start()

    def trigger(self) -> None:
        self._thread.wake()

    def stop(self) -> None:
        self._thread.stop()

    def _run(self) -> None:
        timeout = self._resync
        unfinished = 0
        while not self._thread.stopping():
            if self._thread.sleep(timeout):
                unfinished = 0
            if self._thread.stopping():
                return
            try:
                report = self._reconciler.run_pass()
            except Exception:
                logger.exception("shim reconcile pass failed")
                report = ReconcileReport(skipped="failed")
            if report.waiting or report.failed or report.skipped:
                timeout = min(self._resync, self._retry * 2**unfinished)
                unfinished = min(unfinished + 1, 16)
            else:
                timeout = self._resync
                unfinished = 0
