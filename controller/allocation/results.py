"""The engine's answer as ``status.allocation``: results, opaque configs, the node selector.

Configs are copied as kube-scheduler copies them: the configs of each request's DeviceClass
(``FromClass``, for that request), then the claim's own (``FromClaim``) that apply to the requests
allocated — drivers apply them in that order, later entries overriding earlier ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from api import wire
from api.names import DRIVER_NAME
from controller.allocation.conditions import PlacementProblem, Reason
from controller.allocation.inventory import SliceInventory
from controller.allocation.requests import Alternative, ClassLookup, RequestSlot
from driver.cluster.views import ClaimView, DeviceClassView, DeviceConfigEntry
from driver.placement import Placed


def node_selector(node: str) -> wire.NodeSelector:
    """An allocation's ``nodeSelector``: the node by ``metadata.name``, as kube-scheduler writes."""
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }


def allocations(
    placed: Placed,
    alternative: Alternative,
    claims: Sequence[ClaimView],
    *,
    inventory: SliceInventory,
    classes: ClassLookup,
) -> list[wire.AllocationResult]:
    """``status.allocation`` (without the timestamp) of each claim, in ``claims`` order."""
    by_engine = {slot.engine_name: slot for slot in alternative.slots}
    results: list[list[wire.DeviceRequestAllocationResult]] = [[] for _ in claims]
    for assignment in placed.assignments:
        slot = by_engine[assignment.request]
        device = inventory.device_name(
            assignment.node, assignment.gpu_index, assignment.profile, assignment.start
        )
        if device is None:
            raise PlacementProblem(
                Reason.NO_CAPACITY,
                f"{assignment.profile} at {assignment.start} on GPU {assignment.gpu_index} of "
                f"{assignment.node} is no longer published",
            )
        results[slot.claim_index].append(
            {
                "request": slot.result_request,
                "driver": DRIVER_NAME,
                "pool": assignment.node,
                "device": device,
            }
        )
    out: list[wire.AllocationResult] = []
    for index, claim in enumerate(claims):
        mine = [s for s in alternative.slots if s.claim_index == index]
        config = _config(claim, mine, classes=classes)
        devices: wire.DeviceAllocationResult = {"results": results[index]}
        if config:
            devices["config"] = config
        out.append({"devices": devices, "nodeSelector": node_selector(placed.node)})
    return out


def _config(
    claim: ClaimView, mine: Sequence[RequestSlot], *, classes: ClassLookup
) -> list[wire.DeviceAllocationConfiguration]:
    """The allocation's ``config`` for one claim: the opaque config of the DeviceClasses its
    slots were allocated from, then the claim's own entries that name one of its selected
    requests or name none."""
    config: list[wire.DeviceAllocationConfiguration] = []
    for slot in mine:
        device_class = classes(slot.class_name)
        class_config = DeviceClassView.of(device_class).config if device_class else ()
        for entry in class_config:
            opaque = _opaque(entry)
            if opaque:
                config.append(
                    {"source": "FromClass", "requests": [slot.result_request], "opaque": opaque}
                )
    selected = {s.request for s in mine} | {s.result_request for s in mine}
    for entry in claim.spec.config:
        named = entry.requests
        opaque = _opaque(entry)
        if opaque and (not named or selected.intersection(named)):
            from_claim: wire.DeviceAllocationConfiguration = {"source": "FromClaim"}
            if named:
                from_claim["requests"] = list(named)
            from_claim["opaque"] = opaque
            config.append(from_claim)
    return config


def _opaque(entry: DeviceConfigEntry) -> wire.OpaqueDeviceConfiguration | None:
    """The entry's ``opaque`` object as written (copied into the allocation); None if absent or
    empty."""
    if not entry.opaque:
        return None
    opaque: Mapping[str, Any] = entry.raw["opaque"]
    # copied as the API server validated it in the claim or class: an OpaqueDeviceConfiguration
    return cast(wire.OpaqueDeviceConfiguration, opaque) if opaque else None
