"""What the controller asks the placement engine, and what it gets back.

A pod's request is the set of device requests of all its claims, already narrowed by the caller to
MIG profiles (from the DeviceClass and the CEL selectors it can evaluate up front) and, where a
selector depends on the GPU or the placement, a predicate over candidate devices. Constraints mirror
the claim's ``matchAttribute`` / ``distinctAttribute``; "all on one node" needs no constraint — the
engine places a pod on one node or not at all.
"""

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from driver.errors import PlacementError
from driver.mig.model import GpuModel, MigProfile


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """A candidate device as predicates and attribute keys see it: one (GPU, profile, start)."""

    node: str
    gpu_index: int
    gpu_uuid: str
    model: GpuModel
    profile: MigProfile
    start: int


DevicePredicate = Callable[[DeviceRef], bool]
"""The caller's verdict on one candidate device (e.g. a CEL selector on ``productName``)."""

AttributeKey = Callable[[DeviceRef], Hashable]
"""The value of one device attribute, for ``matchAttribute`` / ``distinctAttribute`` constraints."""

NodeFilter = Callable[[str], bool]
"""The caller's verdict on a node by name: CPU/memory fit, node selectors, taints."""


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """``count`` devices, each of one of ``profiles`` (and accepted by ``predicate`` if given)."""

    name: str
    profiles: frozenset[str]
    count: int = 1
    predicate: DevicePredicate | None = None


@dataclass(frozen=True, slots=True)
class MatchAttribute:
    """All devices of ``requests`` (empty: of every request) share one value of ``key``.

    ``key=None`` means the parent GPU (``parentUUID`` / ``gpuIndex``): all on one GPU.
    """

    requests: frozenset[str] = frozenset()
    key: AttributeKey | None = None


@dataclass(frozen=True, slots=True)
class DistinctAttribute:
    """All devices of ``requests`` (empty: of every request) have pairwise different ``key`` values.

    ``key=None`` means the parent GPU: every device on a different GPU.
    """

    requests: frozenset[str] = frozenset()
    key: AttributeKey | None = None


Constraint = MatchAttribute | DistinctAttribute


def same_gpu(*requests: str) -> MatchAttribute:
    """``matchAttribute: parentUUID`` over ``requests`` (none named: over every request)."""
    return MatchAttribute(requests=frozenset(requests))


def distinct_gpu(*requests: str) -> DistinctAttribute:
    """``distinctAttribute: parentUUID`` over ``requests`` (none named: over every request)."""
    return DistinctAttribute(requests=frozenset(requests))


@dataclass(frozen=True, slots=True)
class PodRequest:
    """Every device one pod needs, placed together on one node or not at all."""

    requests: tuple[DeviceRequest, ...]
    constraints: tuple[Constraint, ...] = ()

    def __post_init__(self) -> None:
        names = [r.name for r in self.requests]
        if len(set(names)) != len(names):
            raise PlacementError(f"request names must be unique within a pod, got {names}")
        for request in self.requests:
            if request.count < 1:
                raise PlacementError(
                    f"request {request.name!r} asks {request.count} devices; at least 1 is needed"
                )
        known = set(names)
        for constraint in self.constraints:
            unknown = sorted(constraint.requests - known)
            if unknown:
                raise PlacementError(f"constraint names unknown requests {unknown}")

    @classmethod
    def single(
        cls, profile: str, *, count: int = 1, name: str = "mig", one_gpu: bool = False
    ) -> "PodRequest":
        """``count`` devices of one profile, optionally all on one GPU — the common classic pod."""
        constraints: tuple[Constraint, ...] = (same_gpu(name),) if one_gpu else ()
        return cls(
            requests=(DeviceRequest(name=name, profiles=frozenset({profile}), count=count),),
            constraints=constraints,
        )

    @property
    def device_count(self) -> int:
        return sum(r.count for r in self.requests)


@dataclass(frozen=True, slots=True)
class DeviceAssignment:
    """One device chosen for a request: the slice to create and where."""

    request: str
    node: str
    gpu_index: int
    profile: str
    start: int
    size: int
    media: bool


@dataclass(frozen=True, slots=True)
class Placed:
    """Every device of the pod, all on ``node``, in the order the requests listed them."""

    node: str
    assignments: tuple[DeviceAssignment, ...]


@dataclass(frozen=True, slots=True)
class NoFit:
    """Why the pod cannot be placed now, in words a person can act on.

    ``permanent`` is true when the pod could not be placed even if every GPU of the current
    inventory were free (an unpublished profile, more memory slices than the largest GPU has, a
    count no GPU model allows); such a pod waits for the inventory to change, not for releases.
    """

    reason: str
    permanent: bool


PlacementResult = Placed | NoFit
