"""Start-up reconciliation of checkpoint ⇄ GPU ⇄ API server, before the plugin serves anything.

The plugin may have been killed at any point of a prepare or unprepare, the node may have rebooted,
and claims may have been deleted while the plugin was down. In order:

1. **Unreadable checkpoint**: kept aside as ``<file>.corrupt`` and rebuilt from what is certain:
   a claim the API server still allocates here, whose every slice exists complete at its allocated
   placement and whose CDI spec is on disk, is recorded ``PrepareCompleted`` again.
2. **Changed boot id** (``/proc/sys/kernel/random/boot_id``): MIG instances do not survive a
   reboot, so every recorded claim is dropped; the kubelet prepares running pods' claims again.
   Their slices' seconds are counted up to now (``Checkpoint.released``): the counter of
   slice-seconds never goes back, at the cost of counting the time the node was down.
3. **``PrepareStarted`` entries** (a prepare cut short) are **rolled back**: the instances at the
   recorded placements are destroyed and the entry removed. Completing them instead would save a
   GPU-instance creation, but the kubelet retries the prepare anyway and its answer is the same
   (CDI ids depend only on the claim UID and device name), so rolling back keeps one path.
4. **``PrepareCompleted`` entries** are kept — and answered again from the checkpoint — unless the
   API server says the claim is gone, was replaced (other UID) or is no longer allocated to this
   node, or a recorded slice no longer exists: then its slices, spec and entry are removed. If the
   API server cannot be reached, entries are kept (never destroy what may be live). A kept entry
   that lacks its pods or the time its slices were made (an older checkpoint version, or a
   rebuilt one) gets them: the claim's ``status.reservedFor`` pods, and the time of this start.
5. **Orphan instances** (no entry records them) are destroyed, each logged with its placement.
6. **CDI specs** without an entry, and temp files of interrupted atomic writes, are removed.
"""

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from api.checkpoint import Checkpoint, PreparedClaim, PrepareState
from api.checkpoint import PreparedDevice as CheckpointDevice
from driver import cdi
from driver.cluster.port import RESOURCE_CLAIMS, ClusterApi
from driver.cluster.views import ClaimView
from driver.errors import ApiNotFoundError, CheckpointError, ClusterError, DriverError
from driver.gpu.backend import MigInstance
from driver.ids import ClaimUid
from kubeletplugin.metrics import PluginMetrics
from kubeletplugin.model import ClaimRef
from kubeletplugin.node.inventory import NodeInventory
from kubeletplugin.state.claims import (
    ClaimRejectedError,
    PlannedDevice,
    check_claim,
    plan_claim,
    reserved_pods,
)
from kubeletplugin.state.journal import CheckpointJournal
from kubeletplugin.state.slices import SliceOperations, describe, owner_of, records

logger = logging.getLogger(__name__)

BOOT_ID_PATH: Final = Path("/proc/sys/kernel/random/boot_id")


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    """This boot's id; empty if the file cannot be read (then reboots cannot be detected)."""
    try:
        return path.read_text(encoding="ascii").strip()
    except OSError as exc:
        logger.warning("cannot read boot id from %s: %s", path, exc)
        return ""


@dataclass(slots=True)
class RecoveryReport:
    """What recovery found and did (logged, and asserted on by tests)."""

    corrupt_checkpoint: bool = False
    rebooted: bool = False
    rebuilt: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    orphans_destroyed: list[str] = field(default_factory=list)
    specs_removed: list[str] = field(default_factory=list)


class Recovery:
    def __init__(
        self,
        *,
        node_name: str,
        store: CheckpointJournal,
        slices: SliceOperations,
        api: ClusterApi,
        cdi_root: Path,
        inventory: Callable[[], NodeInventory],
        boot_id: str,
        metrics: PluginMetrics | None = None,
        common_cdi_device_ids: tuple[str, ...] = (),
    ) -> None:
        self._node = node_name
        self._store = store
        self._slices = slices
        self._api = api
        self._cdi_root = cdi_root
        self._inventory = inventory
        self._boot_id = boot_id
        self._metrics = metrics or PluginMetrics()
        self._common_cdi_device_ids = common_cdi_device_ids

    def run(self) -> RecoveryReport:
        report = RecoveryReport()
        now = time.time()
        checkpoint = self._load(report)
        if checkpoint.boot_id and self._boot_id and checkpoint.boot_id != self._boot_id:
            logger.warning(
                "node rebooted (boot id %s, checkpoint from %s): dropping %d prepared claims",
                self._boot_id,
                checkpoint.boot_id,
                len(checkpoint.claims),
            )
            report.rebooted = True
            for entry in list(checkpoint.claims.values()):
                checkpoint = self._released(checkpoint, entry, at=now)
        for entry in list(checkpoint.claims.values()):
            if entry.state is PrepareState.PREPARE_STARTED:
                self._remove(checkpoint, entry)
                checkpoint = checkpoint.without_claim(entry.uid)
                report.rolled_back.append(entry.uid)
        checkpoint = self._check_completed(checkpoint, report, now=now)
        for instance in self._slices.instances():
            if owner_of(checkpoint, instance) is None:
                logger.warning("destroying orphan MIG instance: %s", describe(instance))
                self._slices.destroy_instance(instance)
                report.orphans_destroyed.append(describe(instance))
        for uid in cdi.list_specs(self._cdi_root):
            if checkpoint.claim(uid) is None:
                cdi.remove_spec(self._cdi_root, uid)
                report.specs_removed.append(uid)
        cdi.remove_stale_temp_specs(self._cdi_root)
        self._store.remove_stale_temp_files()
        self._store.save(checkpoint.with_identity(node_name=self._node, boot_id=self._boot_id))
        self._count(report)
        _log(report)
        return report

    def _check_completed(
        self, checkpoint: Checkpoint, report: RecoveryReport, *, now: float
    ) -> Checkpoint:
        """Step 4: release completed claims that are gone (their slice-seconds counted up to
        ``now``); keep the others, with what an older checkpoint version did not record filled in
        (the pods from the claim, ``now`` as the time their slices were made)."""
        instances = self._slices.instances()
        for entry in list(checkpoint.claims.values()):
            reason, claim = self._why_release(entry, instances)
            if reason is None:
                report.kept.append(entry.uid)
                checkpoint = checkpoint.with_claim(_filled_in(entry, claim, now=now))
                continue
            logger.info("releasing claim %s: %s", _label(entry), reason, extra=_ids(entry))
            self._remove(checkpoint, entry)
            checkpoint = self._released(checkpoint, entry, at=now)
            report.released.append(entry.uid)
        return checkpoint

    def _released(self, checkpoint: Checkpoint, entry: PreparedClaim, *, at: float) -> Checkpoint:
        self._metrics.slices_released(entry, at=at)
        return checkpoint.released(entry.uid, at=at)

    def _load(self, report: RecoveryReport) -> Checkpoint:
        try:
            return self._store.load()
        except CheckpointError as exc:
            aside = self._store.path.with_name(self._store.path.name + ".corrupt")
            logger.error("%s; keeping it as %s and rebuilding from the API and GPUs", exc, aside)
            with contextlib.suppress(OSError):
                self._store.path.replace(aside)
            report.corrupt_checkpoint = True
            return self._rebuild(report)

    def _rebuild(self, report: RecoveryReport) -> Checkpoint:
        checkpoint = Checkpoint()
        try:
            claims = self._api.list_objects(RESOURCE_CLAIMS).items
        except ClusterError as exc:
            logger.error("cannot list claims to rebuild the checkpoint: %s", exc)
            return checkpoint
        instances = self._slices.instances()
        specs = set(cdi.list_specs(self._cdi_root))
        inventory = self._inventory()
        for claim in claims:
            view = ClaimView.of(claim)
            ref = ClaimRef(uid=ClaimUid(view.uid), namespace=view.namespace, name=view.name)
            if ref.uid not in specs:
                continue
            try:
                planned = plan_claim(claim, ref=ref, node_name=self._node, inventory=inventory)
            except DriverError:
                continue
            devices = self._devices_found(ref, planned, instances)
            if planned and len(devices) == len(planned):
                checkpoint = checkpoint.with_claim(
                    PreparedClaim(
                        uid=ref.uid,
                        namespace=ref.namespace,
                        name=ref.name,
                        state=PrepareState.PREPARE_COMPLETED,
                        devices=tuple(devices),
                    )
                )
                report.rebuilt.append(ref.uid)
        return checkpoint

    def _devices_found(
        self, ref: ClaimRef, planned: Sequence[PlannedDevice], instances: Sequence[MigInstance]
    ) -> list[CheckpointDevice]:
        """The checkpoint records of the planned devices, in order, as long as a complete
        instance exists at each one's placement (stops at the first missing)."""
        devices: list[CheckpointDevice] = []
        for plan in planned:
            found = [
                i
                for i in instances
                if i.complete
                and i.gpu_index == plan.device.gpu_index
                and i.profile == plan.device.profile.name
                and i.placement == plan.device.placement
            ]
            if not found:
                break
            devices.append(
                CheckpointDevice(
                    request_names=plan.request_names,
                    pool=self._node,
                    device=plan.device.name,
                    gpu_index=plan.device.gpu_index,
                    gpu_uuid=plan.device.gpu_uuid,
                    profile=plan.device.profile.name,
                    placement_start=plan.device.placement.start,
                    placement_size=plan.device.placement.size,
                    gi_id=found[0].gi_id,
                    ci_id=found[0].ci_id,
                    mig_uuid=found[0].mig_uuid,
                    cdi_device_ids=(
                        cdi.claim_cdi_device_id(ref.uid, plan.device.name),
                        *self._common_cdi_device_ids,
                    ),
                )
            )
        return devices

    def _why_release(
        self, entry: PreparedClaim, instances: tuple[MigInstance, ...]
    ) -> tuple[str | None, ClaimView | None]:
        """Why the completed ``entry`` must be released (None: keep it), and its claim as the
        API server has it (None when it could not be read)."""
        for device in entry.devices:
            if not any(records(device, i) and i.mig_uuid == device.mig_uuid for i in instances):
                return f"its slice {device.device} (GI {device.gi_id}) no longer exists", None
        ref = ClaimRef(uid=ClaimUid(entry.uid), namespace=entry.namespace, name=entry.name)
        try:
            claim = ClaimView.of(
                self._api.get(RESOURCE_CLAIMS, name=entry.name, namespace=entry.namespace)
            )
        except ApiNotFoundError:
            return "the claim no longer exists", None
        except ClusterError as exc:
            logger.warning("cannot check claim %s (%s); keeping it", _label(entry), exc)
            return None, None
        try:
            check_claim(claim, ref=ref, node_name=self._node)
        except ClaimRejectedError as exc:
            return str(exc), claim
        return None, claim

    def _remove(self, checkpoint: Checkpoint, entry: PreparedClaim) -> None:
        self._slices.destroy_recorded(entry.devices, claim_uid=entry.uid, checkpoint=checkpoint)
        cdi.remove_spec(self._cdi_root, entry.uid)

    def _count(self, report: RecoveryReport) -> None:
        self._metrics.recovery_action("rolled_back", len(report.rolled_back))
        self._metrics.recovery_action("released", len(report.released))
        self._metrics.recovery_action("rebuilt", len(report.rebuilt))
        self._metrics.recovery_action("orphan_destroyed", len(report.orphans_destroyed))
        self._metrics.recovery_action("spec_removed", len(report.specs_removed))


def _filled_in(entry: PreparedClaim, claim: ClaimView | None, *, now: float) -> PreparedClaim:
    """``entry`` with the pods and the time its slices were made, where it does not record them
    (written by an older checkpoint version, or rebuilt): the claim's pods, and ``now``."""
    update: dict[str, object] = {}
    if entry.prepared_at is None:
        update["prepared_at"] = now
    if not entry.pods and claim is not None:
        update["pods"] = reserved_pods(claim)
    return entry.model_copy(update=update) if update else entry


def _log(report: RecoveryReport) -> None:
    logger.info(
        "recovery: %d kept, %d rolled back, %d released, %d rebuilt, %d orphan instances "
        "destroyed, %d CDI specs removed%s",
        len(report.kept),
        len(report.rolled_back),
        len(report.released),
        len(report.rebuilt),
        len(report.orphans_destroyed),
        len(report.specs_removed),
        " (after reboot)" if report.rebooted else "",
    )


def _label(entry: PreparedClaim) -> str:
    return f"{entry.namespace}/{entry.name} ({entry.uid})"


def _ids(entry: PreparedClaim) -> dict[str, str]:
    return {"claim_uid": entry.uid, "claim": f"{entry.namespace}/{entry.name}"}
