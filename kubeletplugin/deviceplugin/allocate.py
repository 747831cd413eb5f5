"""``Allocate``: give a container the slices of a shadow claim the controller placed on this node.

The kubelet names only the resource and the device ids it picked; the slices come from the shadow
claims of that profile allocated to this node and not bound yet (``bindings``). A container asking
N devices is given one *reservation* — the unbound claims of one (pod, container) holding N slices
together (one ``count: N`` claim or N claims of one) — never slices of two reservations, and never a
slice no claim accounts for: with no such reservation ``Allocate`` fails with a message saying so.

Which reservation (the kubelet does not say which pod asks): the kubelet admits pods one at a time
and adds each to its pod manager — what its pod-resources API lists — right before admitting it,
while it records the pod's devices only after ``Allocate`` answers. So during the ``Allocate`` of
pod X, pod-resources lists X with the asking container still lacking devices of this resource, and
no pod admitted after X. That decides: if the fitting reservations of listed containers lacking
devices of this resource all belong to one pod, one of that pod's reservations is taken (in its own
namespace; containers in listed order). Otherwise — none (kubelet unreachable, a pod admitted
without its reservation) or several (a kubelet that lists pods earlier) — the fallback is logged and
ranks: listed-without-devices first, then the oldest reservation. A wrong guess there is corrected
afterwards by ``reconcile``, which makes each claim stand for the container that really holds its
ids (within a namespace; a crossing between namespaces is only reported).

The slices are made by the plugin's own prepare path (``DeviceState.prepare_claim``: checkpoint
first, slice at the allocated placement, CDI spec, rollback on failure; a stale shim claim still
prepared at that placement — its shadow claim released, no container holding its ids — is released
first, ``staleness``; if the kubelet cannot be asked, the ``Allocate`` fails as retryable), with the CDI specs'
``NVIDIA_VISIBLE_DEVICES`` left out: the answer's ``envs`` carries the complete list for the
container, which CDI edits would otherwise override (``driver.cdi`` docstring).

Retries: the same ids again, while their holder is not known yet, are answered again from the
checkpoint. Ids the kubelet recycled from a pod that has gone are first dropped from the claim that
had them (which stays prepared until the claim is released).
"""

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from api.checkpoint import PreparedClaim, ShimBinding
from driver import cdi
from driver.cluster.port import ClusterApi
from driver.errors import ClusterError, DriverError
from driver.ids import ClaimUid
from kubeletplugin.deviceplugin import bindings
from kubeletplugin.deviceplugin.podresources import (
    ContainerKey,
    Holdings,
    PodResourcesError,
    PodResourcesSource,
)
from kubeletplugin.deviceplugin.resources import ResourceSpec
from kubeletplugin.deviceplugin.shadow import ShadowClaim, Slot, list_shadow_claims
from kubeletplugin.model import ClaimRef
from kubeletplugin.node.inventory import NodeInventory
from kubeletplugin.state.overlaps import StaleSliceJudge

logger = logging.getLogger(__name__)


class AllocateError(DriverError):
    """``Allocate`` cannot be served; the message is what the kubelet reports on the pod."""


class AllocateLaterError(AllocateError):
    """``Allocate`` cannot be served now but may be later (the kubelet could not be asked)."""

    retryable = True


class NoReservationError(AllocateError):
    """No shadow claim on this node reserves what the container asks for."""


class SlicePreparer(Protocol):
    """The plugin's prepare path (``kubeletplugin.state.devicestate.DeviceState``)."""

    def prepare_claim(
        self, ref: ClaimRef, *, visible_devices_env: bool = True, shim: ShimBinding | None = None
    ) -> PreparedClaim: ...

    def unprepare_claim(self, ref: ClaimRef) -> None: ...

    def set_stale_judge(self, judge: StaleSliceJudge | None) -> None:
        """Who may release a prepared claim in a new prepare's way (``kubeletplugin.state.overlaps``)."""
        ...


@dataclass(frozen=True, slots=True)
class Reservation:
    """The unbound shadow claims of one container for one profile."""

    slot: Slot
    claims: tuple[ShadowClaim, ...]

    @property
    def size(self) -> int:
        return sum(len(c.devices) for c in self.claims)

    @property
    def created(self) -> str:
        return min(c.created for c in self.claims)

    def __str__(self) -> str:
        return f"{self.slot}: {self.size} slice(s) in {', '.join(c.name for c in self.claims)}"


@dataclass(frozen=True, slots=True)
class ContainerAnswer:
    """What one container is told: CDI devices and its visibility variable."""

    cdi_devices: tuple[str, ...]
    envs: Mapping[str, str]
    claims: tuple[str, ...]
    """UIDs of the claims whose slices the container got (for logs and tests)."""


def claim_ref(claim: ShadowClaim | PreparedClaim) -> ClaimRef:
    if isinstance(claim, ShadowClaim):
        return ClaimRef(uid=claim.uid, namespace=claim.namespace, name=claim.name)
    return ClaimRef(uid=ClaimUid(claim.uid), namespace=claim.namespace, name=claim.name)


def reservations(
    claims: Sequence[ShadowClaim],
    *,
    profile: str,
    bindable: Callable[[ShadowClaim], bool],
) -> list[Reservation]:
    """Unbound reservations of ``profile``, grouped by the container they stand for."""
    groups: dict[Slot, list[ShadowClaim]] = defaultdict(list)
    for claim in claims:
        usable = claim.profile == profile and claim.slot is not None and not claim.deleting
        if usable and claim.slot is not None and bindable(claim):
            groups[claim.slot].append(claim)
    return [
        Reservation(slot=slot, claims=tuple(sorted(group, key=lambda c: (c.created, c.name))))
        for slot, group in groups.items()
    ]


def choose(
    candidates: Sequence[Reservation],
    *,
    count: int,
    resource: str,
    node_name: str,
    holdings: Holdings | None,
) -> Reservation:
    """The reservation to serve a container asking ``count`` devices of ``resource``."""
    fitting = [r for r in candidates if r.size == count]
    if not fitting:
        others = "; ".join(str(r) for r in candidates) or "none"
        raise NoReservationError(
            f"no reservation for {count} x {resource} on node {node_name}: a classic MIG request "
            "is served only for pods the InstaSlice controller placed on this node (a shadow "
            "claim per request, created while the pod was gated by the InstaSlice webhook); "
            f"unbound reservations of this resource here: {others}"
        )
    pod_created: dict[tuple[str, str], str] = {}
    for reservation in fitting:
        key = (reservation.slot.namespace, reservation.slot.pod_uid)
        pod_created[key] = min(pod_created.get(key, reservation.created), reservation.created)

    def rank(reservation: Reservation) -> tuple[int, str, int, Slot]:
        slot = reservation.slot
        listed = -1
        order = 1
        if holdings is not None:
            position = holdings.position(_key(slot))
            if position is not None:
                listed = position
                order = 2 if holdings.holds(_key(slot), resource) else 0
        return (order, pod_created[(slot.namespace, slot.pod_uid)], listed, slot)

    asking = [] if holdings is None else asking_reservations(fitting, resource, holdings)
    pods = sorted({(r.slot.namespace, r.slot.pod_name, r.slot.pod_uid) for r in asking})
    if len(pods) == 1:
        return min(asking, key=rank)
    chosen = min(fitting, key=rank)
    if holdings is None:
        why = "the kubelet's pod list is unavailable"
    elif pods:
        why = "pod-resources lists several pods waiting for it: " + ", ".join(
            f"{namespace}/{name}" for namespace, name, _ in pods
        )
    else:
        why = "pod-resources lists no container with a reservation of it still lacking devices"
    logger.info(
        "Allocate of %d x %s: cannot tell which pod asks (%s); taking %s",
        count,
        resource,
        why,
        chosen,
    )
    return chosen


def asking_reservations(
    fitting: Sequence[Reservation], resource: str, holdings: Holdings
) -> list[Reservation]:
    """Reservations of containers the kubelet lists without devices of ``resource`` yet."""
    return [
        r
        for r in fitting
        if holdings.position(_key(r.slot)) is not None
        and not holdings.holds(_key(r.slot), resource)
    ]


def _key(slot: Slot) -> ContainerKey:
    return ContainerKey(namespace=slot.namespace, pod=slot.pod_name, container=slot.container)


def answer(entries: Sequence[PreparedClaim]) -> ContainerAnswer:
    devices = [d for entry in entries for d in entry.devices]
    return ContainerAnswer(
        cdi_devices=tuple(i for d in devices for i in d.cdi_device_ids),
        envs=cdi.visibility_env([d.mig_uuid for d in devices if d.mig_uuid]),
        claims=tuple(entry.uid for entry in entries),
    )


class Allocator:
    """Serves ``Allocate`` and ``GetPreferredAllocation`` for every resource of the shim."""

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
        on_bound: Callable[[], None] = lambda: None,
    ) -> None:
        self._node = node_name
        self._state = state
        self._checkpoint = checkpoint
        self._api = api
        self._inventory = inventory
        self._pod_resources = pod_resources
        self._lock = lock
        self._on_bound = on_bound

    def allocate(self, spec: ResourceSpec, device_ids: Sequence[str]) -> ContainerAnswer:
        """Slices for one container asking ``device_ids`` of ``spec``'s resource; raises
        ``AllocateError`` (``NoReservationError`` when nothing on this node reserves them)."""
        ids = tuple(sorted(set(device_ids)))
        if not ids:
            raise AllocateError(f"Allocate of {spec.resource_name} names no device ids")
        resource = spec.resource_name
        with self._lock:
            holdings = self._holdings(resource)
            retried = self._answered_before(resource, ids, holdings)
            if retried is not None:
                logger.info("Allocate of %s %s answered again", resource, ", ".join(ids))
                return retried
            try:
                claims = list_shadow_claims(
                    self._api, node_name=self._node, inventory=self._inventory()
                )
            except ClusterError as exc:
                raise AllocateError(
                    f"cannot read the shadow claims reserving {resource} on node {self._node}: {exc}"
                ) from exc
            checkpoint = self._checkpoint.load()
            chosen = choose(
                reservations(
                    claims,
                    profile=spec.profile,
                    bindable=lambda c: bindings.is_bindable(checkpoint.claim(c.uid)),
                ),
                count=len(ids),
                resource=resource,
                node_name=self._node,
                holdings=holdings,
            )
            entries = self._bind(chosen, resource, ids)
        logger.info(
            "Allocate of %s %s: %s",
            resource,
            ", ".join(ids),
            chosen,
            extra={"pod_uid": chosen.slot.pod_uid, "resource": resource},
        )
        self._on_bound()
        return answer(entries)

    def preferred(
        self,
        spec: ResourceSpec,
        *,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
    ) -> list[str]:
        """Ids to suggest: the required ones, then ids no claim is bound to, then the rest — so
        recycled ids of a pod whose claim is not released yet are used last."""
        taken = bindings.bound_ids(self._checkpoint.load(), spec.resource_name)
        chosen = list(dict.fromkeys(must_include))
        rest = sorted(set(available) - set(chosen), key=lambda i: (i in taken, _slot_key(i)))
        return (chosen + rest)[: max(size, len(chosen))]

    # -- internals --------------------------------------------------------------------------

    def _answered_before(
        self, resource: str, ids: tuple[str, ...], holdings: Holdings | None
    ) -> ContainerAnswer | None:
        """The earlier answer when the kubelet asks again for exactly the ids bound before: while
        no holder has been seen, or while the recorded holder still holds them (the kubelet never
        hands out ids a running container holds, so it is that container asking again). Ids bound
        otherwise — recycled from a pod that has gone, or overlapping partly — are dropped from
        their claims first."""
        taken = bindings.bound_ids(self._checkpoint.load(), resource)
        entries = list({taken[i].uid: taken[i] for i in ids if i in taken}.values())
        if not entries:
            return None
        union = {i for e in entries if e.shim is not None for i in e.shim.device_plugin_ids}
        if union == set(ids) and all(_still_theirs(e, holdings) for e in entries):
            return answer(
                sorted(entries, key=lambda e: min(e.shim.device_plugin_ids if e.shim else ()))
            )
        for entry in entries:
            logger.info(
                "device ids %s of claim %s/%s were given out again by the kubelet; the claim "
                "keeps its slices until it is released",
                ", ".join(entry.shim.device_plugin_ids if entry.shim else ()),
                entry.namespace,
                entry.name,
                extra={"claim_uid": entry.uid},
            )
        bindings.set_bindings(
            self._checkpoint, [(e.uid, bindings.unbound(resource)) for e in entries]
        )
        return None

    def _holdings(self, resource: str) -> Holdings | None:
        if self._pod_resources is None:
            return None
        try:
            return self._pod_resources.list_holdings([resource])
        except PodResourcesError as exc:
            logger.warning("choosing a reservation without the kubelet's pod list: %s", exc)
            return None

    def _bind(
        self, chosen: Reservation, resource: str, ids: tuple[str, ...]
    ) -> list[PreparedClaim]:
        done: list[tuple[ShadowClaim, PreparedClaim | None]] = []
        entries: list[PreparedClaim] = []
        offset = 0
        try:
            for claim in chosen.claims:
                part = ids[offset : offset + len(claim.devices)]
                offset += len(claim.devices)
                before = self._checkpoint.load().claim(claim.uid)
                binding = ShimBinding(resource_name=resource, device_plugin_ids=part)
                entry = self._state.prepare_claim(
                    claim_ref(claim), visible_devices_env=False, shim=binding
                )
                done.append((claim, before))
                if entry.shim != binding:
                    updated = bindings.set_bindings(
                        self._checkpoint, [(claim.uid, bindings.bound(resource, part))]
                    )
                    entry = updated.claims[claim.uid]
                entries.append(entry)
        except Exception as exc:
            self._undo(done, resource)
            error = AllocateLaterError if getattr(exc, "retryable", False) else AllocateError
            raise error(f"cannot prepare the slices of {chosen} for {resource}: {exc}") from exc
        return entries

    def _undo(
        self, done: Sequence[tuple[ShadowClaim, PreparedClaim | None]], resource: str
    ) -> None:
        for claim, before in reversed(done):
            try:
                if before is None:
                    self._state.unprepare_claim(claim_ref(claim))
                else:
                    bindings.set_bindings(
                        self._checkpoint, [(claim.uid, bindings.unbound(resource))]
                    )
            except DriverError:
                logger.exception("undoing the Allocate binding of claim %s failed", claim)


def _still_theirs(entry: PreparedClaim, holdings: Holdings | None) -> bool:
    """True if the entry's ids are still the ones its Allocate answered for."""
    binding = entry.shim
    if binding is None:
        return False
    if binding.pod_uid is None:
        return True
    if holdings is None:
        return False
    holders = holdings.holders_of(binding.resource_name, binding.device_plugin_ids)
    return len(holders) == 1 and next(iter(holders)).container == binding.container_name


def _slot_key(device_id: str) -> tuple[int, str]:
    tail = device_id.rpartition("-")[2]
    return (int(tail), device_id) if tail.isdigit() else (1 << 30, device_id)
