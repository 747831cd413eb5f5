"""Reads what the slice map is made of: from the API server through the ``ClusterApi`` port, and
MIG UUIDs from kubelet-plugin checkpoints when the caller can see them (on a node, in the demo).

The pure part is ``statusview``; this module only fetches.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from api import names
from controller.statusview import ClusterView, MigUuidKey, build_view
from driver.checkpoint import CheckpointStore
from driver.cluster.port import PODS, RESOURCE_CLAIMS, RESOURCE_SLICES, ClusterApi, JsonObject
from driver.cluster.views import ClaimView
from driver.errors import CheckpointError

logger = logging.getLogger(__name__)


def allocated_claims(claims: Iterable[JsonObject], *, driver: str) -> list[JsonObject]:
    """Claims with at least one allocation result of ``driver``."""
    return [claim for claim in claims if ClaimView.of(claim).results_of(driver)]


@dataclass(frozen=True, slots=True)
class StatusObjects:
    """What the slice map is built from: our ResourceSlices, our allocated claims, and the pods of
    the namespaces those claims live in."""

    resource_slices: list[JsonObject]
    claims: list[JsonObject]
    pods: list[JsonObject]


def read_objects(api: ClusterApi, *, driver: str = names.DRIVER_NAME) -> StatusObjects:
    """Our ResourceSlices, our allocated claims, and the pods of the namespaces those claims live
    in (one list per namespace, not every pod of a large cluster)."""
    slices = api.list_objects(RESOURCE_SLICES, field_selector=f"spec.driver={driver}").items
    claims = allocated_claims(api.list_objects(RESOURCE_CLAIMS).items, driver=driver)
    namespaces = sorted({ClaimView.of(c).namespace for c in claims})
    pods: list[JsonObject] = []
    for namespace in namespaces:
        pods += api.list_objects(PODS, namespace=namespace).items
    return StatusObjects(resource_slices=slices, claims=claims, pods=pods)


def read_view(
    api: ClusterApi,
    *,
    mig_uuids: Mapping[MigUuidKey, str] | None = None,
    driver: str = names.DRIVER_NAME,
) -> ClusterView:
    """The cluster's slice map now (see ``read_objects``)."""
    objects = read_objects(api, driver=driver)
    return build_view(
        resource_slices=objects.resource_slices,
        claims=objects.claims,
        pods=objects.pods,
        mig_uuids=mig_uuids,
        driver=driver,
    )


def mig_uuids_from_checkpoints(paths: Iterable[Path]) -> dict[MigUuidKey, str]:
    """(claim UID, device) → MIG UUID from kubelet-plugin checkpoint files. A file that is missing
    or unreadable is skipped with a warning: the map then shows ``-`` for its slices."""
    found: dict[MigUuidKey, str] = {}
    for path in paths:
        try:
            checkpoint = CheckpointStore(path).load()
        except CheckpointError as exc:
            logger.warning("skipping checkpoint: %s", exc)
            continue
        for uid, claim in checkpoint.claims.items():
            for device in claim.devices:
                if device.mig_uuid:
                    found[(uid, device.device)] = device.mig_uuid
    return found
