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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from api.config import MigDeviceConfig, merge_configs, parse_opaque_config
from api.errors import ValidationFailed
from api.names import DRIVER_NAME
from driver.errors import ConfigError, DriverError
from kubeletplugin.inventory import InventoryDevice, NodeInventory
from kubeletplugin.model import ClaimRef

JsonObject = dict[str, Any]

_HOSTNAME_LABEL = "kubernetes.io/hostname"
_NAME_FIELD = "metadata.name"
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


def check_claim(claim: JsonObject, *, ref: ClaimRef, node_name: str) -> JsonObject:
    """The claim's ``status.allocation`` if it may be prepared here; ``ClaimRejectedError`` if not."""
    uid = claim.get("metadata", {}).get("uid")
    if uid != ref.uid:
        raise ClaimRejectedError(
            f"claim {ref.namespace}/{ref.name}: UID is {uid}, not {ref.uid}; the claim was replaced"
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimRejectedError(f"claim {ref}: not allocated")
    nodes = pinned_nodes(allocation.get("nodeSelector"))
    if nodes is not None and node_name not in nodes:
        raise ClaimRejectedError(
            f"claim {ref}: allocated to node {', '.join(sorted(nodes))}, this is node {node_name}"
        )
    return dict(allocation)


def pinned_nodes(node_selector: Mapping[str, Any] | None) -> set[str] | None:
    """Node names an allocation's ``nodeSelector`` restricts it to; None if it does not say.

    Understood: ``matchFields`` on ``metadata.name`` and ``matchExpressions`` on
    ``kubernetes.io/hostname`` with operator ``In`` (what allocators write). A term that selects by
    anything else leaves the answer open.
    """
    if not node_selector:
        return None
    names: set[str] = set()
    for term in node_selector.get("nodeSelectorTerms") or []:
        term_names: set[str] | None = None
        for key_list, key in (("matchFields", _NAME_FIELD), ("matchExpressions", _HOSTNAME_LABEL)):
            for requirement in term.get(key_list) or []:
                if requirement.get("key") == key and requirement.get("operator") == "In":
                    values = set(requirement.get("values") or [])
                    term_names = values if term_names is None else term_names & values
        if term_names is None:
            return None
        names |= term_names
    return names


def plan_claim(
    claim: JsonObject, *, ref: ClaimRef, node_name: str, inventory: NodeInventory
) -> list[PlannedDevice]:
    """The slices to create for ``claim`` on this node, in allocation order.

    Raises ``ClaimRejectedError`` (see ``check_claim``; also a result for another node's pool, an
    admin-access result, or a device this node does not publish) and ``ConfigError`` for opaque
    configuration of our driver that does not validate (the message names the bad fields).
    """
    allocation = check_claim(claim, ref=ref, node_name=node_name)
    devices_part = allocation.get("devices") or {}
    results = [r for r in devices_part.get("results") or [] if r.get("driver") == DRIVER_NAME]
    entries = devices_part.get("config") or []
    if not entries:
        spec_config = (claim.get("spec") or {}).get("devices", {}).get("config") or []
        entries = [{"source": "FromClaim", **entry} for entry in spec_config]
    configs = _our_configs(entries, ref=ref)
    planned: list[PlannedDevice] = []
    for result in results:
        pool = result.get("pool")
        if pool != node_name:
            raise ClaimRejectedError(
                f"claim {ref}: device {result.get('device')} is allocated from pool {pool}, "
                f"this is node {node_name}"
            )
        if result.get("adminAccess"):
            raise ClaimRejectedError(
                f"claim {ref}: admin access to MIG slices is not supported "
                f"(request {result.get('request')})"
            )
        request = str(result.get("request", ""))
        try:
            device = inventory.device(str(result.get("device", "")))
        except DriverError as exc:
            raise ClaimRejectedError(f"claim {ref}: {exc}") from exc
        merged = merge_configs([c for reqs, c in configs if _applies(reqs, request)])
        planned.append(
            PlannedDevice(request=request, device=device, env=tuple(sorted(merged.env.items())))
        )
    return planned


def _our_configs(
    entries: Iterable[Mapping[str, Any]], *, ref: ClaimRef
) -> list[tuple[Sequence[str], MigDeviceConfig]]:
    ordered = sorted(
        enumerate(entries),
        key=lambda pair: (_SOURCE_ORDER.get(pair[1].get("source", ""), 1), pair[0]),
    )
    configs: list[tuple[Sequence[str], MigDeviceConfig]] = []
    for _, entry in ordered:
        opaque = entry.get("opaque")
        if not opaque:
            raise ConfigError(f"claim {ref}: a device config entry has no opaque configuration")
        if opaque.get("driver") != DRIVER_NAME:
            continue
        requests = list(entry.get("requests") or [])
        try:
            config = parse_opaque_config(opaque.get("parameters") or {})
        except ValidationFailed as exc:
            scope = f" for requests {requests}" if requests else ""
            raise ConfigError(f"claim {ref}: opaque config{scope}: {exc}") from exc
        configs.append((requests, config))
    return configs


def _applies(requests: Sequence[str], request: str) -> bool:
    return not requests or request in requests or base_request(request) in requests
