"""From a ResourceClaim as the API server holds it to the slices this node must create for it (pure).

The kubelet sends only a claim's namespace, name and UID. Like the Go helper (``draplugin.go``) we
GET the claim and refuse it when it is not the claim the kubelet meant (UID differs: it was deleted
and re-created), when it is not allocated, or when its allocation is for another node — the plugin
executes allocations, it never makes them. Then each allocation result of our driver is mapped to
the (GPU, profile, placement start) this node published under that device name, with the opaque
configuration that applies to its request.

Configuration precedence (as Kubernetes copies it into ``status.allocation.devices.config`` and
NVIDIA's and the example driver apply it): class entries first, then claim entries; later entries
override earlier ones; entries of other drivers are skipped; an entry with no ``requests`` applies to
every request. When an allocation carries no configuration at all (an allocator that does not copy
it), the claim's own ``spec.devices.config`` is used.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from api.checkpoint import PodRef
from api.config import MigDeviceConfig, merge_configs, parse_opaque_config
from api.errors import ValidationFailed
from api.names import DRIVER_NAME
from driver.cluster.port import JsonObject
from driver.cluster.views import Allocation, ClaimView, DeviceConfigEntry, mapping, path
from driver.errors import ConfigError, DriverError
from kubeletplugin.model import ClaimRef
from kubeletplugin.node.inventory import InventoryDevice, NodeInventory

_SOURCE_ORDER = {"FromClass": 0, "FromClaim": 1}


class ClaimRejectedError(DriverError):
    """The claim cannot be prepared on this node as it stands in the API (missing, replaced,
    unallocated, allocated elsewhere, or naming a device this node does not have)."""


@dataclass(frozen=True, slots=True)
class PlannedDevice:
    """One slice to create for a claim: the allocation result and where it lives on this node."""

    request: str
    """The allocation result's request, ``request`` or ``request/subrequest``."""
    device: InventoryDevice
    env: tuple[tuple[str, str], ...]
    """Extra container environment from the opaque config for this request, sorted by name."""

    @property
    def request_names(self) -> tuple[str, ...]:
        """What the kubelet is told: the parent request of a subrequest (``BaseRequestRef``)."""
        return (base_request(self.request),)


def base_request(request: str) -> str:
    return request.split("/", 1)[0]


def check_claim(claim: ClaimView, *, ref: ClaimRef, node_name: str) -> Allocation:
    """The claim's ``status.allocation`` if it may be prepared here; ``ClaimRejectedError`` if not."""
    uid = claim.uid or None
    if uid != ref.uid:
        raise ClaimRejectedError(
            f"claim {ref.namespace}/{ref.name}: UID is {uid}, not {ref.uid}; the claim was replaced"
        )
    allocation = claim.allocation
    if allocation is None:
        raise ClaimRejectedError(f"claim {ref}: not allocated")
    nodes = allocated_nodes(allocation)
    if nodes is not None and node_name not in nodes:
        raise ClaimRejectedError(
            f"claim {ref}: allocated to node {', '.join(sorted(nodes))}, this is node {node_name}"
        )
    return allocation


def reserved_pods(claim: ClaimView) -> tuple[PodRef, ...]:
    """The pods the claim is reserved for (``status.reservedFor``), in the claim's namespace."""
    return tuple(PodRef(name=c.name, uid=c.uid) for c in claim.reserved_for if c.resource == "pods")


def allocated_nodes(allocation: Allocation) -> frozenset[str] | None:
    """Node names an allocation's ``nodeSelector`` restricts it to; None if it does not say.

    Understood: ``matchFields`` on ``metadata.name`` and ``matchExpressions`` on
    ``kubernetes.io/hostname`` with operator ``In`` (what allocators write). A term that selects by
    anything else leaves the answer open, and so does an absent or empty selector.
    """
    if allocation.node_selector is None or not mapping(path(allocation.raw, "nodeSelector")):
        return None
    return allocation.node_selector.pinned_names()


def plan_claim(
    claim: JsonObject, *, ref: ClaimRef, node_name: str, inventory: NodeInventory
) -> list[PlannedDevice]:
    """The slices to create for ``claim`` on this node, in allocation order.

    Raises ``ClaimRejectedError`` (see ``check_claim``; also a result for another node's pool, an
    admin-access result, or a device this node does not publish) and ``ConfigError`` for opaque
    configuration of our driver that does not validate (the message names the bad fields).
    """
    view = ClaimView.of(claim)
    allocation = check_claim(view, ref=ref, node_name=node_name)
    entries = allocation.config or view.spec.config
    configs = _our_configs(entries, ref=ref)
    planned: list[PlannedDevice] = []
    for result in allocation.results_of(DRIVER_NAME):
        if result.pool != node_name:
            raise ClaimRejectedError(
                f"claim {ref}: device {result.device} is allocated from pool {result.pool}, "
                f"this is node {node_name}"
            )
        if result.admin_access:
            raise ClaimRejectedError(
                f"claim {ref}: admin access to MIG slices is not supported "
                f"(request {result.request})"
            )
        try:
            device = inventory.device(result.device)
        except DriverError as exc:
            raise ClaimRejectedError(f"claim {ref}: {exc}") from exc
        merged = merge_configs([c for reqs, c in configs if _applies(reqs, result.request)])
        planned.append(
            PlannedDevice(
                request=result.request, device=device, env=tuple(sorted(merged.env.items()))
            )
        )
    return planned


def _our_configs(
    entries: Iterable[DeviceConfigEntry], *, ref: ClaimRef
) -> list[tuple[Sequence[str], MigDeviceConfig]]:
    """Our driver's opaque configs in precedence order (class entries, then claim entries; a
    claim spec's entries, which carry no source, count as claim entries)."""
    ordered = sorted(
        enumerate(entries), key=lambda pair: (_SOURCE_ORDER.get(pair[1].source, 1), pair[0])
    )
    configs: list[tuple[Sequence[str], MigDeviceConfig]] = []
    for _, entry in ordered:
        if not mapping(path(entry.raw, "opaque")):
            raise ConfigError(f"claim {ref}: a device config entry has no opaque configuration")
        if entry.driver != DRIVER_NAME:
            continue
        try:
            config = parse_opaque_config(entry.parameters or {})
        except ValidationFailed as exc:
            scope = f" for requests {list(entry.requests)}" if entry.requests else ""
            raise ConfigError(f"claim {ref}: opaque config{scope}: {exc}") from exc
        configs.append((entry.requests, config))
    return configs


def _applies(requests: Sequence[str], request: str) -> bool:
    return not requests or request in requests or base_request(request) in requests
