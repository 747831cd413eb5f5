"""A pod's claims → what the placement engine is asked.

Each request becomes one engine request over the profiles of its candidates (``candidates``), with
a predicate only when its selectors accept some but not all devices of a profile. ``count``, ``allocationMode: All``, ``firstAvailable`` (each combination of alternatives, in order,
the first that fits wins), ``matchAttribute``/``distinctAttribute`` (``parentUUID``/``gpuIndex`` are
"same GPU"/"distinct GPUs" for the engine; other attributes are compared by value) and opaque
configs (class configs ``FromClass`` then claim configs ``FromClaim``, as kube-scheduler copies
them, see ``results``; ours are validated here) are handled. Problems raise ``PlacementProblem`` with a reason.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

from api.config import parse_opaque_config
from api.errors import ValidationFailed
from api.names import ATTRIBUTE_GPU_INDEX, ATTRIBUTE_PARENT_UUID, DRIVER_NAME
from controller.allocation.candidates import CandidateCache, Candidates
from controller.allocation.conditions import PlacementProblem, Reason
from controller.allocation.inventory import SliceInventory
from controller.allocation.selectors import split_qualified_name
from driver.cluster.port import JsonObject
from driver.cluster.views import ClaimView, DeviceSubRequest, path
from driver.cluster.views import DeviceRequest as ClaimRequest
from driver.placement import (
    Constraint,
    DeviceRef,
    DeviceRequest,
    DistinctAttribute,
    MatchAttribute,
    PodRequest,
)
from driver.taints import MAX_TOLERATIONS_PER_REQUEST, DeviceToleration, parse_tolerations

MAX_ALTERNATIVES = 64
"""``firstAvailable`` combinations tried per pod at most (8 alternatives x 2 requests is 64)."""

_GPU_ATTRIBUTES = frozenset(
    {f"{DRIVER_NAME}/{ATTRIBUTE_PARENT_UUID}", f"{DRIVER_NAME}/{ATTRIBUTE_GPU_INDEX}"}
)

ClassLookup = Callable[[str], JsonObject | None]


@dataclass(frozen=True, slots=True)
class RequestSlot:
    """One request of one claim, with the alternative chosen for it, as one engine request."""

    engine_name: str
    claim_index: int
    request: str
    """The claim's request name."""
    result_request: str
    """What allocation results name: ``request`` or ``request/subrequest``."""
    class_name: str
    candidates: Candidates
    count: int | None
    """``None`` for ``allocationMode: All``."""


@dataclass(frozen=True, slots=True)
class ConstraintSpec:
    claim_index: int
    requests: tuple[str, ...]
    """Engine names the constraint covers in this alternative."""
    attribute: str
    distinct: bool


@dataclass(frozen=True, slots=True)
class Alternative:
    slots: tuple[RequestSlot, ...]
    constraints: tuple[ConstraintSpec, ...]

    @property
    def has_all(self) -> bool:
        return any(slot.count is None for slot in self.slots)


@dataclass(frozen=True, slots=True)
class _Choice:
    result_request: str
    class_name: str
    selectors: tuple[str, ...]
    count: int | None
    tolerations: tuple[DeviceToleration, ...] = ()


def _tolerations(body: DeviceSubRequest, where: str) -> tuple[DeviceToleration, ...]:
    try:
        tolerations = parse_tolerations(body.tolerations)
    except ValueError as exc:
        raise PlacementProblem(Reason.INVALID_REQUEST, f"{where}: {exc}") from exc
    if len(tolerations) > MAX_TOLERATIONS_PER_REQUEST:
        raise PlacementProblem(
            Reason.INVALID_REQUEST,
            f"{where}: {len(tolerations)} tolerations, at most {MAX_TOLERATIONS_PER_REQUEST}",
        )
    return tolerations


def _choices(request: ClaimRequest, where: str) -> list[_Choice]:
    if request.exactly is not None:  # ``exactly``, or a v1beta1-style flat request
        bodies = [(request.name, request.exactly)]
    elif request.first_available:
        bodies = [(f"{request.name}/{sub.name}", sub) for sub in request.first_available]
    else:
        raise PlacementProblem(
            Reason.INVALID_REQUEST, f"{where}: neither exactly nor firstAvailable"
        )
    choices = []
    for result_request, body in bodies:
        if body.admin_access:
            raise PlacementProblem(
                Reason.INVALID_REQUEST, f"{where}: adminAccess is not supported by InstaSlice"
            )
        if body.capacity_requests:
            raise PlacementProblem(
                Reason.INVALID_REQUEST,
                f"{where}: consumable capacity requests are not supported by InstaSlice",
            )
        mode = body.allocation_mode
        count = body.count or 1  # a count of 0 is the default, 1
        if mode not in ("ExactCount", "All") or (mode == "ExactCount" and count < 1):
            raise PlacementProblem(
                Reason.INVALID_REQUEST, f"{where}: allocationMode {mode} with count {count}"
            )
        choices.append(
            _Choice(
                result_request=result_request,
                class_name=body.device_class_name,
                selectors=body.selectors,
                count=None if mode == "All" else count,
                tolerations=_tolerations(body, where),
            )
        )
    return choices


def build_alternatives(
    claims: Sequence[ClaimView], *, classes: ClassLookup, cache: CandidateCache
) -> list[Alternative]:
    """Every combination of request alternatives worth trying, in ``firstAvailable`` order."""
    per_request: list[list[RequestSlot]] = []
    for index, claim in enumerate(claims):
        validate_configs(claim)
        for request in claim.spec.requests:
            where = f"claim {claim.name} request {request.name!r}"
            slots: list[RequestSlot] = []
            first_problem: PlacementProblem | None = None
            for choice in _choices(request, where):
                device_class = classes(choice.class_name)
                if device_class is None:
                    raise PlacementProblem(
                        Reason.DEVICE_CLASS_NOT_FOUND,
                        f"{where}: DeviceClass {choice.class_name!r} does not exist",
                    )
                found = cache.candidates(device_class, choice.selectors, choice.tolerations)
                if not found.profiles:
                    tainted = (
                        f" that carries no taint the request does not tolerate ({found.untolerated}"
                        f" matching devices are tainted, e.g. {found.example_taint})"
                        if found.untolerated
                        else ""
                    )
                    first_problem = first_problem or PlacementProblem(
                        Reason.UNSATISFIABLE,
                        f"{where}: no published device matches DeviceClass "
                        f"{choice.class_name} and the request's selectors{tainted}",
                    )
                    continue
                slots.append(
                    RequestSlot(
                        engine_name=f"{index}:{choice.result_request}",
                        claim_index=index,
                        request=request.name,
                        result_request=choice.result_request,
                        class_name=choice.class_name,
                        candidates=found,
                        count=choice.count,
                    )
                )
            if not slots:
                assert first_problem is not None
                raise first_problem
            per_request.append(slots)
    alternatives = []
    for combination in itertools.islice(itertools.product(*per_request), MAX_ALTERNATIVES):
        alternatives.append(
            Alternative(slots=tuple(combination), constraints=_constraints(claims, combination))
        )
    return alternatives


def _constraints(
    claims: Sequence[ClaimView], slots: Sequence[RequestSlot]
) -> tuple[ConstraintSpec, ...]:
    specs = []
    for index, claim in enumerate(claims):
        mine = [s for s in slots if s.claim_index == index]
        for constraint in claim.spec.device_constraints():
            named = constraint.requests
            covered = tuple(
                s.engine_name
                for s in mine
                if not named or s.request in named or s.result_request in named
            )
            if not constraint.attribute or len(covered) == 0:
                continue
            specs.append(
                ConstraintSpec(
                    claim_index=index,
                    requests=covered,
                    attribute=constraint.attribute,
                    distinct=constraint.distinct,
                )
            )
    return tuple(specs)


def validate_configs(claim: ClaimView) -> None:
    """Our opaque configs in the claim must parse (the kubelet plugin applies them)."""
    for entry in claim.spec.config:
        if entry.driver != DRIVER_NAME:
            continue
        try:
            parse_opaque_config(entry.parameters or {})
        except ValidationFailed as exc:
            raise PlacementProblem(
                Reason.INVALID_REQUEST, f"claim {claim.name}: bad opaque config: {exc}"
            ) from exc


_AttributeValue = Callable[[DeviceRef], tuple[str, Hashable]]


def _attribute_key(inventory: SliceInventory, attribute: str) -> _AttributeValue:
    domain, name = split_qualified_name(attribute, default_domain=DRIVER_NAME)

    def key(ref: DeviceRef) -> tuple[str, Hashable]:
        device = inventory.device_name(ref.node, ref.gpu_index, ref.profile.name, ref.start)
        view = inventory.view(ref.node, device or "")
        value = path(view.attributes, domain, name) if view is not None else None
        return ("value", value) if value is not None else ("missing", ref)

    return key


def pod_request(
    alternative: Alternative, *, inventory: SliceInventory, all_counts: Mapping[str, int]
) -> PodRequest:
    """The engine request of one alternative (``all_counts``: counts of ``All`` requests)."""
    general: dict[str, list[_AttributeValue]] = {}
    constraints: list[Constraint] = []
    for spec in alternative.constraints:
        key: _AttributeValue | None = None
        if spec.attribute not in _GPU_ATTRIBUTES:
            key = _attribute_key(inventory, spec.attribute)
            for name in spec.requests:
                general.setdefault(name, []).append(key)
        kind = DistinctAttribute if spec.distinct else MatchAttribute
        constraints.append(kind(requests=frozenset(spec.requests), key=key))
    requests = []
    for slot in alternative.slots:
        count = slot.count if slot.count is not None else all_counts[slot.engine_name]
        requests.append(
            DeviceRequest(
                name=slot.engine_name,
                profiles=slot.candidates.profiles,
                count=count,
                predicate=_predicate(inventory, slot.candidates, general.get(slot.engine_name)),
            )
        )
    return PodRequest(requests=tuple(requests), constraints=tuple(constraints))


def _predicate(
    inventory: SliceInventory,
    candidates: Candidates,
    keys: list[_AttributeValue] | None,
) -> Callable[[DeviceRef], bool] | None:
    if candidates.complete and not keys:
        return None
    matched = candidates.matched

    def accept(ref: DeviceRef) -> bool:
        if not candidates.complete:
            device = inventory.device_name(ref.node, ref.gpu_index, ref.profile.name, ref.start)
            if (ref.node, device) not in matched:
                return False
        # a device lacking a constrained attribute cannot satisfy the constraint
        return not keys or all(key(ref)[0] == "value" for key in keys)

    return accept


def beyond_every_node(alternative: Alternative, inventory: SliceInventory) -> str | None:
    """Why no node could hold the alternative even empty, by counting alone; None if one might.

    A cheap upper bound (devices and memory slices per node) that settles requests far beyond a
    node at once, before the engine searches for them.
    """
    counted = [s for s in alternative.slots if s.count is not None]
    if not counted:
        return None
    wanted = sum(s.count or 0 for s in counted)
    profiles = frozenset().union(*(s.candidates.profiles for s in counted))
    most_devices = most_slices = 0
    for gpus in inventory.node_shapes():
        devices = sum(
            max((g.profiles[p][0] for p in profiles if p in g.profiles), default=0) for g in gpus
        )
        sizes = {p: size for g in gpus for p, (_, size) in g.profiles.items() if p in profiles}
        slices = sum(
            (s.count or 0)
            * min((sizes[p] for p in s.candidates.profiles if p in sizes), default=99)
            for s in counted
        )
        capacity = sum(g.memory_slices for g in gpus)
        if wanted <= devices and slices <= capacity:
            return None
        most_devices = max(most_devices, devices)
        most_slices = max(most_slices, capacity)
    return (
        f"the pod needs {wanted} MIG devices on one node; the largest node holds at most "
        f"{most_devices} of the profiles asked for ({most_slices} memory slices)"
    )
