"""A claim's devices through prepare, as records: planned → intended → CDI-written → answered.

Apart from ``devicestate`` (which sequences prepare/unprepare, locks and rollback) because these are
the values that go into the checkpoint and the CDI spec, built from the plan and the created slices:
the ``PrepareStarted`` records and the overlap check that guards them, the completed records with
GI/CI ids, MIG UUIDs and CDI ids (written to the claim's CDI spec), and what the kubelet is told.
"""

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from api.checkpoint import Checkpoint, PreparedClaim, PrepareState
from api.checkpoint import PreparedDevice as CheckpointDevice
from driver import cdi
from driver.errors import BackendError
from driver.gpu.backend import MigInstance
from kubeletplugin.model import ClaimRef, PreparedDevice
from kubeletplugin.state.claims import ClaimRejectedError, PlannedDevice
from kubeletplugin.state.overlaps import clashes


def answer(entry: PreparedClaim) -> tuple[PreparedDevice, ...]:
    """What the kubelet is told about a completed claim."""
    return tuple(
        PreparedDevice(
            request_names=d.request_names,
            pool_name=d.pool,
            device_name=d.device,
            cdi_device_ids=d.cdi_device_ids,
        )
        for d in entry.devices
    )


def slices_in_use(checkpoint: Checkpoint) -> Counter[tuple[int, str]]:
    return Counter(
        (d.gpu_index, d.profile)
        for claim in checkpoint.claims.values()
        if claim.state is PrepareState.PREPARE_COMPLETED
        for d in claim.devices
    )


def intended_device(planned: PlannedDevice, *, pool: str) -> CheckpointDevice:
    device = planned.device
    return CheckpointDevice(
        request_names=planned.request_names,
        pool=pool,
        device=device.name,
        gpu_index=device.gpu_index,
        gpu_uuid=device.gpu_uuid,
        profile=device.profile.name,
        placement_start=device.placement.start,
        placement_size=device.placement.size,
    )


def same_devices(entry: PreparedClaim, planned: Sequence[PlannedDevice]) -> bool:
    return sorted(d.device for d in entry.devices) == sorted(p.device.name for p in planned)


def write_cdi(
    ref: ClaimRef,
    planned: Sequence[PlannedDevice],
    intended: Sequence[CheckpointDevice],
    made: Sequence[MigInstance],
    *,
    cdi_root: Path,
    emulated: bool,
    majors: cdi.DeviceMajors,
    visible_devices_env: bool,
    common_cdi_device_ids: tuple[str, ...] = (),
) -> tuple[CheckpointDevice, ...]:
    """Write the claim's CDI spec for the slices ``made`` and return ``intended`` completed
    with their GI/CI ids, MIG UUIDs and CDI ids (each slice's own, then ``common_cdi_device_ids``:
    the common spec's device, ``driver.cdi_common``)."""
    cdi_slices = []
    for plan, instance in zip(planned, made, strict=True):
        if instance.mig_uuid is None or instance.ci_id is None:
            raise BackendError(f"claim {ref}: slice {plan.device.name} has no compute instance")
        cdi_slices.append(
            cdi.CdiSlice(
                device=plan.device.name,
                mig_uuid=instance.mig_uuid,
                gpu_minor=_minor(plan.device.gpu_minor, "GPU", plan, emulated=emulated),
                gi_cap_minor=_minor(
                    instance.gi_cap_minor, "GPU-instance capability", plan, emulated=emulated
                ),
                ci_cap_minor=_minor(
                    instance.ci_cap_minor, "compute-instance capability", plan, emulated=emulated
                ),
                env=plan.env,
            )
        )
    spec = cdi.build_claim_spec(
        claim_uid=ref.uid,
        slices=cdi_slices,
        emulated=emulated,
        majors=majors,
        visible_devices_env=visible_devices_env,
    )
    cdi.write_spec(cdi_root, spec, claim_uid=ref.uid)
    return tuple(
        CheckpointDevice(
            **{
                **record.model_dump(),
                "gi_id": instance.gi_id,
                "ci_id": instance.ci_id,
                "mig_uuid": instance.mig_uuid,
                "cdi_device_ids": (
                    cdi.claim_cdi_device_id(ref.uid, record.device),
                    *common_cdi_device_ids,
                ),
            }
        )
        for record, instance in zip(intended, made, strict=True)
    )


def _minor(value: int | None, what: str, plan: PlannedDevice, *, emulated: bool) -> int:
    if value is not None:
        return value
    if emulated:
        return 0
    raise BackendError(f"the {what} device minor of {plan.device.name} is unknown")


def start_entry(
    checkpoint: Checkpoint,
    started: PreparedClaim,
    *,
    ref: ClaimRef,
    kept: Mapping[str, str],
) -> Checkpoint:
    """``started`` added, unless another claim prepared here holds an overlapping placement
    (``kept``: why the stale-slice judge keeps a claim, for the message)."""
    for clash in clashes(checkpoint, started.devices, uid=started.uid):
        other = clash.other
        why = f" ({kept[other.uid]})" if other.uid in kept else ""
        raise ClaimRejectedError(
            f"claim {ref}: device {clash.mine.device} overlaps {clash.theirs.device} of claim "
            f"{other.namespace}/{other.name} ({other.uid}), prepared on this node{why}"
        )
    return checkpoint.with_claim(started)
