"""Record each prepared device's MIG UUID in its claim's ``status.devices`` (best effort).

Kubernetes lets the driver of an allocated device describe it in the claim's status
(``AllocatedDeviceStatus``: ``{driver, pool, device, data}``, feature DRAResourceClaimDeviceStatus,
on by default in 1.36). After a successful ``NodePrepareResources`` we put
``data.migUUID`` there for each of our devices, so ``instaslice status`` (``instaslice.status``)
shows MIG UUIDs on any cluster, not only with the node's checkpoint.

The write never matters for correctness: it happens after the checkpoint says ``PrepareCompleted``
and after the kubelet has its answer (a one-thread background executor), a failure is logged and
dropped, a conflict (409) is recomputed from a fresh GET a few times, a claim that is gone (404) or
was replaced (other UID) is left alone. Only entries of our driver in this node's pool are written;
other drivers' entries and fields we do not own (conditions, other ``data`` keys) are kept. When
the entries are already there nothing is written, so repeated prepares cost one GET each.

Only DRA prepares go through here (``RecordingPreparer`` wraps the DRA service's preparer); the
classic-resource shim's shadow claims are left alone, so the shim's own status writes (moving a
reservation) never race this one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Final, Protocol

from api import wire
from api.checkpoint import PreparedClaim, PrepareState
from driver.cluster.port import RESOURCE_CLAIMS, ClusterApi, JsonObject
from driver.cluster.views import ClaimView, DeviceStatus, mapping, path
from driver.errors import ApiNotFoundError, ConflictError
from driver.ids import ClaimUid
from kubeletplugin.model import ClaimPreparer, ClaimRef, PrepareResult

logger = logging.getLogger(__name__)

MIG_UUID_KEY: Final = "migUUID"
"""The key under ``status.devices[].data`` (the first one ``instaslice.status`` reads)."""
CONFLICT_ATTEMPTS: Final = 3


class PreparedClaims(Protocol):
    """Where the completed checkpoint entries are read (``DeviceState``)."""

    def prepared(self) -> Mapping[str, PreparedClaim]: ...


def desired_device_statuses(
    claim: JsonObject, entry: PreparedClaim, *, driver: str, pool: str
) -> list[Any] | None:
    """The claim's ``status.devices`` with a ``data.migUUID`` for each of ``entry``'s devices
    that the claim's allocation holds (pure); None when that is what the claim already has.

    Entries of other drivers or pools, and fields of ours other than ``data.migUUID``, are kept;
    our entries for devices no longer allocated (which the API server would refuse) are dropped.
    """
    allocated = {r.device for r in ClaimView.of(claim).results_of(driver) if r.pool == pool}
    uuids = {d.device: d.mig_uuid for d in entry.devices if d.mig_uuid and d.device in allocated}
    current: list[Any] = list(path(claim, "status", "devices") or [])
    wanted: list[Any] = []
    seen: set[str] = set()
    for item in current:
        status = DeviceStatus.parse(item) if isinstance(item, Mapping) else None
        if status is None or (status.driver, status.pool) != (driver, pool):
            wanted.append(item)
            continue
        if status.device not in allocated or status.device in seen:
            continue
        seen.add(status.device)
        wanted.append(_with_uuid(status, uuids.get(status.device)))
    for device, uuid in uuids.items():
        if device not in seen:
            added: wire.AllocatedDeviceStatus = {
                "driver": driver,
                "pool": pool,
                "device": device,
                "data": {MIG_UUID_KEY: uuid},
            }
            wanted.append(added)
    return None if wanted == current else wanted


def _with_uuid(status: DeviceStatus, uuid: str | None) -> Mapping[str, Any]:
    if uuid is None:
        return status.raw
    return {**status.raw, "data": {**status.data, MIG_UUID_KEY: uuid}}


class DeviceStatusWriter:
    """Writes ``status.devices`` of prepared claims in the background, one claim at a time."""

    def __init__(self, *, api: ClusterApi, driver: str, pool: str) -> None:
        self._api = api
        self._driver = driver
        self._pool = pool
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="claim-status")
        self._pending: set[Future[None]] = set()
        self._guard = threading.Lock()
        self._closed = False

    def submit(self, entry: PreparedClaim) -> None:
        """Queue the write for a ``PrepareCompleted`` entry; ignored after ``close``."""
        with self._guard:
            if self._closed:
                return
            future = self._executor.submit(self.record, entry)
            self._pending.add(future)
        future.add_done_callback(self._forget)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is done; False if ``timeout`` passed first."""
        with self._guard:
            pending = set(self._pending)
        _, not_done = wait(pending, timeout=timeout)
        return not not_done

    def close(self) -> None:
        """Drop queued writes, wait for the one in flight (bounded by the client's timeout)."""
        with self._guard:
            self._closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)

    def record(self, entry: PreparedClaim) -> None:
        """Write the entry's MIG UUIDs into its claim now; never raises."""
        ref = f"{entry.namespace}/{entry.name} ({entry.uid})"
        try:
            for _ in range(CONFLICT_ATTEMPTS):
                try:
                    self._write_once(entry)
                except ConflictError:
                    logger.debug("status of claim %s changed meanwhile; re-reading", ref)
                    continue
                return
            logger.warning(
                "MIG UUIDs not recorded in claim %s: it kept changing (%d conflicts)",
                ref,
                CONFLICT_ATTEMPTS,
            )
        except ApiNotFoundError:
            logger.debug("claim %s is gone; no MIG UUIDs to record", ref)
        except Exception as exc:  # best effort: the prepare already succeeded
            logger.warning("MIG UUIDs not recorded in claim %s: %s", ref, exc)

    def _write_once(self, entry: PreparedClaim) -> None:
        claim = self._api.get(RESOURCE_CLAIMS, name=entry.name, namespace=entry.namespace)
        if ClaimView.of(claim).uid != entry.uid:
            logger.debug("claim %s/%s was replaced; not recording", entry.namespace, entry.name)
            return
        wanted = desired_device_statuses(claim, entry, driver=self._driver, pool=self._pool)
        if wanted is None:
            return
        claim["status"] = {**mapping(path(claim, "status")), "devices": wanted}
        self._api.update_status(RESOURCE_CLAIMS, claim)
        logger.info(
            "recorded MIG UUIDs in claim %s/%s (%s)",
            entry.namespace,
            entry.name,
            entry.uid,
            extra={"claim_uid": entry.uid, "claim": f"{entry.namespace}/{entry.name}"},
        )

    def _forget(self, future: Future[None]) -> None:
        with self._guard:
            self._pending.discard(future)


class RecordingPreparer:
    """A ``ClaimPreparer`` that answers exactly as ``inner`` does, then queues the status write
    of each claim it prepared (read back from the checkpoint: ``PrepareCompleted`` only)."""

    def __init__(
        self, inner: ClaimPreparer, *, prepared: PreparedClaims, writer: DeviceStatusWriter
    ) -> None:
        self._inner = inner
        self._prepared = prepared
        self._writer = writer

    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[ClaimUid, PrepareResult]:
        results = self._inner.prepare(claims)
        done = [uid for uid, result in results.items() if not result.error and result.devices]
        if done:
            try:
                checkpoint = self._prepared.prepared()
                for uid in done:
                    entry = checkpoint.get(uid)
                    if entry is not None and entry.state is PrepareState.PREPARE_COMPLETED:
                        self._writer.submit(entry)
            except Exception:  # the answer stands whatever happens here
                logger.exception("could not queue the MIG UUID status writes")
        return results

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[ClaimUid, str]:
        return self._inner.unprepare(claims)
