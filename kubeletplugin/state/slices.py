"""MIG instances as the checkpoint sees them: who owns which instance, and create/destroy per GPU.

Shared by prepare/unprepare (``devicestate``) and start-up recovery (``recovery``). One GPU's
operations are serialised by a lock per GPU (NVML's MIG calls on one GPU do not mix well, and "is
this placement free?" followed by "create" must not interleave); different GPUs proceed in parallel.

Ownership: an instance belongs to the checkpoint entry that records it — by GPU-instance id once
known, else (an entry still ``PrepareStarted``, written before the instance existed) by GPU, profile
and placement start. Nothing owned by another claim is ever destroyed on a claim's behalf.
"""

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from api.checkpoint import Checkpoint, PreparedDevice
from driver.errors import NotFoundError, PlacementOccupiedError
from driver.gpu.backend import GpuBackend, MigInstance

logger = logging.getLogger(__name__)


def records(device: PreparedDevice, instance: MigInstance) -> bool:
    """True if the checkpoint ``device`` describes ``instance``."""
    if device.gpu_index != instance.gpu_index:
        return False
    if device.placement_start != instance.placement.start or device.profile != instance.profile:
        return False
    return device.gi_id is None or device.gi_id == instance.gi_id


def owner_of(checkpoint: Checkpoint, instance: MigInstance) -> str | None:
    """UID of the claim whose checkpoint entry records ``instance``, if any."""
    for claim in checkpoint.claims.values():
        if any(records(device, instance) for device in claim.devices):
            return claim.uid
    return None


def describe(instance: MigInstance) -> str:
    return (
        f"{instance.profile} at placement {instance.placement.start} on GPU {instance.gpu_index} "
        f"(GI {instance.gi_id}, CI {instance.ci_id}, {instance.mig_uuid or 'no MIG UUID'})"
    )


@dataclass(frozen=True, slots=True)
class Ensured:
    instance: MigInstance
    created: bool
    """False when an existing instance was adopted."""


class SliceOperations:
    """Create, find and destroy MIG instances through the backend, one GPU at a time."""

    def __init__(self, backend: GpuBackend) -> None:
        self._backend = backend
        self._locks: dict[int, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def gpu_lock(self, gpu_index: int) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(gpu_index, threading.Lock())

    def instances(self) -> tuple[MigInstance, ...]:
        return self._backend.instances()

    def ensure(self, *, gpu_index: int, profile: str, start: int, adoptable: bool) -> Ensured:
        """Create ``profile`` at ``start``; if the placement is taken by that very slice and
        ``adoptable`` (the claim's own earlier attempt created it), take it over instead.

        A GPU instance without compute instance (a crash between the two) is destroyed and made
        again. ``PlacementOccupiedError`` if anything else is in the way.
        """
        with self.gpu_lock(gpu_index):
            try:
                return Ensured(
                    self._backend.create_slice(gpu_index=gpu_index, profile=profile, start=start),
                    created=True,
                )
            except PlacementOccupiedError:
                if not adoptable:
                    raise
                existing = [
                    i
                    for i in self._backend.instances(gpu_index=gpu_index)
                    if i.placement.start == start and i.profile == profile
                ]
                if not existing:
                    raise
                instance = existing[0]
                if instance.complete:
                    logger.info(
                        "adopting %s left by an earlier attempt",
                        describe(instance),
                        extra={"gpu": gpu_index, "profile": profile, "start": start},
                    )
                    return Ensured(instance, created=False)
                logger.info("recreating half-made %s", describe(instance))
                self._destroy(instance)
                return Ensured(
                    self._backend.create_slice(gpu_index=gpu_index, profile=profile, start=start),
                    created=True,
                )

    def destroy_instance(self, instance: MigInstance) -> None:
        with self.gpu_lock(instance.gpu_index):
            self._destroy(instance)

    def destroy_recorded(
        self, devices: Iterable[PreparedDevice], *, claim_uid: str, checkpoint: Checkpoint
    ) -> int:
        """Destroy the instances ``devices`` (of claim ``claim_uid``) record, unless another
        claim's entry in ``checkpoint`` records them too; return how many were destroyed."""
        wanted = list(devices)
        if not wanted:
            return 0
        destroyed = 0
        for gpu_index in sorted({d.gpu_index for d in wanted}):
            with self.gpu_lock(gpu_index):
                for instance in self._backend.instances(gpu_index=gpu_index):
                    if not any(records(d, instance) for d in wanted):
                        continue
                    owner = owner_of(checkpoint.without_claim(claim_uid), instance)
                    if owner is not None:
                        logger.warning(
                            "not destroying %s: claim %s owns it", describe(instance), owner
                        )
                        continue
                    self._destroy(instance)
                    destroyed += 1
        return destroyed

    def _destroy(self, instance: MigInstance) -> None:
        try:
            self._backend.destroy_slice(gpu_index=instance.gpu_index, gi_id=instance.gi_id)
        except NotFoundError:
            logger.info("%s was already gone", describe(instance))
            return
        logger.info(
            "destroyed %s",
            describe(instance),
            extra={
                "gpu": instance.gpu_index,
                "profile": instance.profile,
                "start": instance.placement.start,
                "gi_id": instance.gi_id,
            },
        )
