"""Prepare and unprepare claims on this node: create the allocated MIG slices, idempotently.

For one claim, prepare is (docs/design.md D3, the node agent executes idempotently):

1. GET the claim and plan it (``claims.plan_claim``: right UID, allocated to this node, devices
   this node publishes, opaque config valid) — per-claim error otherwise;
2. a claim already ``PrepareCompleted`` with the same devices is answered from the checkpoint,
   without touching the GPU;
3. checkpoint ``PrepareStarted`` with the intended placements (refused if another prepared claim
   on this node holds an overlapping placement — unless the installed ``StaleSliceJudge`` calls
   that claim stale, which is then released first: ``overlaps``);
4. create each slice (GI + default CI) at exactly the allocated placement — an instance the
   claim's own earlier, unfinished attempt left there is adopted;
5. write the claim's CDI spec, then checkpoint ``PrepareCompleted`` with the GI/CI ids, MIG UUIDs
   and CDI ids, and only then answer.

A failure in 3 to 5 rolls back what exists for the claim (instances, CDI spec, entry); if the rollback
itself fails the ``PrepareStarted`` entry stays, so the next attempt or start-up recovery finishes
it. A crash anywhere leaves the checkpoint saying enough for ``recovery`` to do the same.

The checkpoint records and CDI spec of a claim are built in ``claim_devices``.

Claims of one call are prepared concurrently on a thread pool; per-GPU locks (``slices``) serialise
one GPU's operations; the checkpoint store serialises its read-modify-write updates.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

from api.checkpoint import Checkpoint, PodRef, PreparedClaim, PrepareState, ShimBinding
from api.checkpoint import PreparedDevice as CheckpointDevice
from driver import cdi
from driver.cluster.port import RESOURCE_CLAIMS, ClusterApi, JsonObject
from driver.cluster.views import ClaimView
from driver.errors import ApiNotFoundError, DriverError
from driver.gpu.backend import GpuBackend, MigInstance
from driver.ids import ClaimUid
from kubeletplugin.metrics import PluginMetrics
from kubeletplugin.model import ClaimRef, PrepareResult
from kubeletplugin.node.inventory import NodeInventory
from kubeletplugin.state.claim_devices import (
    answer,
    intended_device,
    same_devices,
    slices_in_use,
    start_entry,
    write_cdi,
)
from kubeletplugin.state.claims import (
    ClaimRejectedError,
    PlannedDevice,
    plan_claim,
    reserved_pods,
)
from kubeletplugin.state.journal import CheckpointJournal
from kubeletplugin.state.overlaps import (
    StaleSliceJudge,
    StaleSliceUnknownError,
    clashes,
    release_stale,
)
from kubeletplugin.state.slices import SliceOperations

__all__ = ["CLAIM_LOCK_WAIT_SECONDS", "STEPS", "DeviceState", "StepHook", "answer", "slices_in_use"]

logger = logging.getLogger(__name__)

StepHook = Callable[[str], None]
STEPS: Final = ("after-started", "after-cdi", "after-checkpoint")
"""Points of ``prepare_claim`` where an injected ``step_hook`` is called (crash tests)."""
CLAIM_LOCK_WAIT_SECONDS: Final = 30.0
"""How long a prepare waits for another claim's lock to release that claim's stale slices."""


class DeviceState:
    """The node's prepared claims; the ``ClaimPreparer`` behind the DRA service."""

    def __init__(
        self,
        *,
        node_name: str,
        backend: GpuBackend,
        api: ClusterApi,
        store: CheckpointJournal,
        cdi_root: Path,
        inventory: Callable[[], NodeInventory],
        emulated: bool,
        majors: cdi.DeviceMajors | None = None,
        metrics: PluginMetrics | None = None,
        step_hook: StepHook | None = None,
        max_workers: int = 8,
        common_cdi_device_ids: tuple[str, ...] = (),
    ) -> None:
        self._node = node_name
        self._api = api
        self._store = store
        self._cdi_root = cdi_root
        self._inventory = inventory
        self._emulated = emulated
        self._majors = majors or cdi.DeviceMajors()
        self._common_cdi_device_ids = common_cdi_device_ids
        self._metrics = metrics or PluginMetrics()
        self._step_hook = step_hook
        self.slices = SliceOperations(backend)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="prepare")
        self._claim_locks: dict[str, threading.Lock] = {}
        self._claim_locks_guard = threading.Lock()
        self._stale_judge: StaleSliceJudge | None = None

    def set_stale_judge(self, judge: StaleSliceJudge | None) -> None:
        """Who may call a prepared claim in a new prepare's way stale (``overlaps``); None: no one,
        every overlap is refused."""
        self._stale_judge = judge

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # -- ClaimPreparer ---------------------------------------------------------------------

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[ClaimUid, PrepareResult]:
        unique = list({ref.uid: ref for ref in claims}.values())
        if len(unique) <= 1:
            return {ref.uid: self._prepare_result(ref) for ref in unique}
        futures = {ref.uid: self._pool.submit(self._prepare_result, ref) for ref in unique}
        return {uid: future.result() for uid, future in futures.items()}

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[ClaimUid, str]:
        unique = list({ref.uid: ref for ref in claims}.values())
        if len(unique) <= 1:
            return {ref.uid: self._unprepare_result(ref) for ref in unique}
        futures = {ref.uid: self._pool.submit(self._unprepare_result, ref) for ref in unique}
        return {uid: future.result() for uid, future in futures.items()}

    # -- per claim, raising ----------------------------------------------------------------

    def prepare_claim(
        self,
        ref: ClaimRef,
        *,
        visible_devices_env: bool = True,
        shim: ShimBinding | None = None,
    ) -> PreparedClaim:
        """Prepare one claim (steps in the module docstring); the completed checkpoint entry
        carries the CDI ids and MIG UUIDs. Raises ``DriverError`` subclasses.

        ``visible_devices_env=False`` and ``shim`` are for the device-plugin shim, which sets
        ``NVIDIA_VISIBLE_DEVICES`` per container itself and records which pod holds the slices.
        """
        with self._claim_lock(ref.uid):
            claim = self._get_claim(ref)
            planned = plan_claim(claim, ref=ref, node_name=self._node, inventory=self._inventory())
            if not planned:
                # Only other drivers' devices: nothing for us to create or record.
                return PreparedClaim(
                    uid=ref.uid,
                    namespace=ref.namespace,
                    name=ref.name,
                    state=PrepareState.PREPARE_COMPLETED,
                )
            previous = self._store.load().claim(ref.uid)
            if previous is not None and previous.state is PrepareState.PREPARE_COMPLETED:
                if same_devices(previous, planned):
                    logger.debug("claim %s already prepared", ref, extra=_ids(ref))
                    return previous
                logger.warning(
                    "claim %s was prepared with other devices; releasing them first",
                    ref,
                    extra=_ids(ref),
                )
                self._release(ref.uid)
                previous = None
            pods = reserved_pods(ClaimView.of(claim))
            return self._prepare_planned(
                ref,
                planned,
                previous=previous,
                visible_devices_env=visible_devices_env,
                shim=shim,
                pods=pods,
                log_ids={**_ids(ref), **_pod_ids(pods)},
            )

    def unprepare_claim(self, ref: ClaimRef) -> None:
        """Destroy the claim's slices, CDI spec and checkpoint entry; nothing to do is fine."""
        with self._claim_lock(ref.uid):
            self._release(ref.uid)

    def prepared(self) -> Mapping[str, PreparedClaim]:
        """The checkpoint's claims, by UID."""
        return dict(self._store.load().claims)

    # -- internals --------------------------------------------------------------------------

    def _prepare_result(self, ref: ClaimRef) -> PrepareResult:
        started = time.monotonic()
        try:
            entry = self.prepare_claim(ref)
        except DriverError as exc:
            logger.warning("prepare of claim %s failed: %s", ref, exc, extra=_ids(ref))
            self._metrics.claim_done(
                operation="prepare", seconds=time.monotonic() - started, ok=False
            )
            return PrepareResult(error=str(exc))
        except Exception as exc:
            logger.exception("prepare of claim %s failed unexpectedly", ref, extra=_ids(ref))
            self._metrics.claim_done(
                operation="prepare", seconds=time.monotonic() - started, ok=False
            )
            return PrepareResult(error=f"internal error: {exc}")
        self._metrics.claim_done(operation="prepare", seconds=time.monotonic() - started, ok=True)
        return PrepareResult(devices=answer(entry))

    def _unprepare_result(self, ref: ClaimRef) -> str:
        started = time.monotonic()
        try:
            self.unprepare_claim(ref)
        except DriverError as exc:
            logger.warning("unprepare of claim %s failed: %s", ref, exc, extra=_ids(ref))
            error = str(exc)
        except Exception as exc:
            logger.exception("unprepare of claim %s failed unexpectedly", ref, extra=_ids(ref))
            error = f"internal error: {exc}"
        else:
            error = ""
        self._metrics.claim_done(
            operation="unprepare", seconds=time.monotonic() - started, ok=not error
        )
        return error

    def _get_claim(self, ref: ClaimRef) -> JsonObject:
        try:
            return self._api.get(RESOURCE_CLAIMS, name=ref.name, namespace=ref.namespace)
        except ApiNotFoundError as exc:
            raise ClaimRejectedError(f"claim {ref}: not found in the API server") from exc

    def _prepare_planned(
        self,
        ref: ClaimRef,
        planned: Sequence[PlannedDevice],
        *,
        previous: PreparedClaim | None,
        visible_devices_env: bool,
        shim: ShimBinding | None,
        pods: tuple[PodRef, ...],
        log_ids: dict[str, str],
    ) -> PreparedClaim:
        intended = tuple(intended_device(p, pool=self._node) for p in planned)
        leftovers = () if previous is None else previous.devices
        adoptable = {(d.gpu_index, d.profile, d.placement_start) for d in leftovers}
        started = self._record_started(ref, intended, leftovers=leftovers, shim=shim)
        made: list[MigInstance] = []
        try:
            self._ensure_slices(intended, adoptable=adoptable, made=made)
            devices = write_cdi(
                ref,
                planned,
                intended,
                made,
                cdi_root=self._cdi_root,
                emulated=self._emulated,
                majors=self._majors,
                visible_devices_env=visible_devices_env,
                common_cdi_device_ids=self._common_cdi_device_ids,
            )
            self._step("after-cdi")
            completed = PreparedClaim(
                uid=ref.uid,
                namespace=ref.namespace,
                name=ref.name,
                state=PrepareState.PREPARE_COMPLETED,
                devices=devices,
                shim=shim,
                pods=pods,
                prepared_at=time.time(),
            )
            self._update(lambda checkpoint: checkpoint.with_claim(completed))
        except Exception:
            self._roll_back(ref, made, started)
            raise
        self._step("after-checkpoint")
        logger.info(
            "prepared claim %s: %s",
            ref,
            ", ".join(d.device for d in devices),
            extra=log_ids,
        )
        return completed

    def _ensure_slices(
        self,
        intended: Sequence[CheckpointDevice],
        *,
        adoptable: set[tuple[int, str, int]],
        made: list[MigInstance],
    ) -> None:
        """Step 4: each slice at its placement; ``made`` grows as they exist (for a rollback)."""
        for record in intended:
            key = (record.gpu_index, record.profile, record.placement_start)
            ensured = self.slices.ensure(
                gpu_index=record.gpu_index,
                profile=record.profile,
                start=record.placement_start,
                adoptable=key in adoptable,
            )
            made.append(ensured.instance)

    def _record_started(
        self,
        ref: ClaimRef,
        intended: tuple[CheckpointDevice, ...],
        *,
        leftovers: Sequence[CheckpointDevice],
        shim: ShimBinding | None,
    ) -> PreparedClaim:
        """Step 3: destroy what an earlier attempt left that is no longer intended, release the
        slices of stale claims in the way, and checkpoint ``PrepareStarted`` with the intended
        devices before any slice is made."""
        started = PreparedClaim(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            state=PrepareState.PREPARE_STARTED,
            devices=intended,
            shim=shim,
        )
        stale = [d for d in leftovers if d.device not in {i.device for i in intended}]
        if stale:
            self.slices.destroy_recorded(stale, claim_uid=ref.uid, checkpoint=self._store.load())
        kept = self._release_stale(ref, intended)
        self._update(lambda checkpoint: start_entry(checkpoint, started, ref=ref, kept=kept))
        self._step("after-started")
        return started

    def _roll_back(
        self, ref: ClaimRef, made: Iterable[MigInstance], started: PreparedClaim
    ) -> None:
        try:
            for instance in made:
                self.slices.destroy_instance(instance)
            cdi.remove_spec(self._cdi_root, ref.uid)
            self._update(lambda checkpoint: checkpoint.without_claim(ref.uid))
        except Exception:
            logger.exception(
                "rolling back claim %s failed; its PrepareStarted entry stays for the next attempt",
                ref,
                extra=_ids(ref),
            )
        else:
            logger.info("rolled back claim %s", ref, extra=_ids(ref))

    def _release_stale(self, ref: ClaimRef, intended: Sequence[CheckpointDevice]) -> dict[str, str]:
        """Release the prepared claims in ``intended``'s way that the judge calls stale; returns
        the judge's reasons for those it keeps (claim UID → reason)."""
        if self._stale_judge is None:
            return {}
        return release_stale(
            clashes(self._store.load(), intended, uid=ref.uid),
            judge=self._stale_judge,
            preparing=str(ref),
            release=self._release_other,
        )

    def _release_other(self, entry: PreparedClaim) -> None:
        """Release another claim than the one being prepared (its lock, bounded wait)."""
        lock = self._claim_lock(entry.uid)
        if not lock.acquire(timeout=CLAIM_LOCK_WAIT_SECONDS):
            raise StaleSliceUnknownError(f"claim {entry.namespace}/{entry.name} is busy; retry")
        try:
            self._release(entry.uid)
        finally:
            lock.release()

    def _release(self, uid: str) -> None:
        checkpoint = self._store.load()
        entry = checkpoint.claim(uid)
        if entry is not None:
            self.slices.destroy_recorded(entry.devices, claim_uid=uid, checkpoint=checkpoint)
        cdi.remove_spec(self._cdi_root, uid)
        if entry is not None:
            released_at = time.time()
            self._update(lambda current: current.released(uid, at=released_at))
            self._metrics.slices_released(entry, at=released_at)
            logger.info(
                "unprepared claim %s/%s (%s)",
                entry.namespace,
                entry.name,
                uid,
                extra={"claim_uid": uid, "claim": f"{entry.namespace}/{entry.name}"},
            )

    def _update(self, change: Callable[[Checkpoint], Checkpoint]) -> Checkpoint:
        checkpoint = self._store.update(change)
        self._metrics.set_slices_in_use(slices_in_use(checkpoint))
        return checkpoint

    def _step(self, step: str) -> None:
        if self._step_hook is not None:
            self._step_hook(step)

    def _claim_lock(self, uid: str) -> threading.Lock:
        with self._claim_locks_guard:
            return self._claim_locks.setdefault(uid, threading.Lock())


def _ids(ref: ClaimRef) -> dict[str, str]:
    return {"claim_uid": ref.uid, "claim": f"{ref.namespace}/{ref.name}"}


def _pod_ids(pods: Sequence[PodRef]) -> dict[str, str]:
    """The pods the claim is reserved for, for the logs."""
    if not pods:
        return {}
    return {
        "pod": ",".join(p.name for p in pods),
        "pod_uid": ",".join(p.uid for p in pods),
    }
