"""Prepared slices in the way of a new prepare, and who may say that one of them is stale.

Two claims prepared on one node must never hold overlapping placements of one GPU: ``DeviceState``
refuses the second prepare (``overlapping`` finds the clash). One clash is legitimate and short-lived:
the controller frees a placement as soon as the API server shows its claim released, while the node
destroys the old slice only when it notices — for a classic pod's shadow claim, on the shim's next
reconcile pass. A prepare (device-plugin ``Allocate`` or DRA ``NodePrepareResources``) that lands in
that window asks a ``StaleSliceJudge`` about each prepared claim in its way: a claim the judge calls
stale is released first, through the same path as any unprepare (slices, CDI spec, checkpoint
entry); any other clash is refused, with the judge's reason in the message.

The judge for shim-prepared claims lives with the shim (``deviceplugin.staleness``); claims the
kubelet prepared through DRA are the kubelet's to unprepare, so no judge releases them.
"""

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from api.checkpoint import Checkpoint, PreparedClaim, PreparedDevice, PrepareState
from driver.errors import DriverError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Verdict:
    release: bool
    """True: the claim's slices may be destroyed now; False: something still owns them."""
    reason: str
    """Why, in words for the log and the refusal message."""


class StaleSliceJudge(Protocol):
    def judge(self, entry: PreparedClaim) -> Verdict | None:
        """Whether ``entry``'s slices are stale; None when the entry is not this judge's to
        release (kept, as any prepared claim). Raises ``DriverError`` when it cannot tell now."""
        ...


class StaleSliceUnknownError(DriverError):
    """A prepared slice is in the way and whether it is stale cannot be told now; retry later."""

    retryable = True


@dataclass(frozen=True, slots=True)
class Clash:
    """A device to prepare (``mine``) overlapping device ``theirs`` of the prepared ``other``."""

    other: PreparedClaim
    mine: PreparedDevice
    theirs: PreparedDevice


def overlap(a: PreparedDevice, b: PreparedDevice) -> bool:
    """True if the two slices share a memory slice of one GPU."""
    return (
        a.gpu_index == b.gpu_index
        and a.placement_start < b.placement_start + b.placement_size
        and b.placement_start < a.placement_start + a.placement_size
    )


def clashes(
    checkpoint: Checkpoint, devices: Iterable[PreparedDevice], *, uid: str
) -> Iterator[Clash]:
    """Every overlap between ``devices`` (of claim ``uid``) and other claims' prepared devices."""
    mine = list(devices)
    for other in checkpoint.claims.values():
        if other.uid == uid:
            continue
        for theirs in other.devices:
            for device in mine:
                if overlap(device, theirs):
                    yield Clash(other=other, mine=device, theirs=theirs)


def release_stale(
    found: Iterable[Clash],
    *,
    judge: StaleSliceJudge,
    preparing: str,
    release: Callable[[PreparedClaim], None],
) -> dict[str, str]:
    """Ask ``judge`` about each completed claim in ``found`` and ``release`` the stale ones, for
    the prepare of claim ``preparing``; returns the judge's reasons for the claims it keeps (claim
    UID → reason). Raises ``StaleSliceUnknownError`` when the judge cannot tell."""
    kept: dict[str, str] = {}
    done: set[str] = set()
    for clash in list(found):
        other = clash.other
        if other.uid in kept or other.uid in done:
            continue
        if other.state is not PrepareState.PREPARE_COMPLETED:
            continue  # being prepared right now, or left for recovery
        try:
            verdict = judge.judge(other)
        except DriverError as exc:
            raise StaleSliceUnknownError(
                f"claim {preparing}: device {clash.mine.device} overlaps {clash.theirs.device} of "
                f"claim {other.namespace}/{other.name} ({other.uid}), prepared on this node, and "
                f"whether that slice is still in use cannot be told now (retryable): {exc}"
            ) from exc
        if verdict is None:
            continue
        if not verdict.release:
            kept[other.uid] = verdict.reason
            continue
        logger.info(
            "releasing claim %s/%s before preparing %s: its slice %s overlaps %s; %s",
            other.namespace,
            other.name,
            preparing,
            clash.theirs.device,
            clash.mine.device,
            verdict.reason,
            extra={"claim_uid": other.uid, "claim": f"{other.namespace}/{other.name}"},
        )
        release(other)
        done.add(other.uid)
    return kept
