"""Device taints and tolerations (KEP-5055, ``resource.k8s.io/v1``), and how one tolerates the other.

The kubelet plugin puts a taint on every device of an unhealthy GPU instead of withdrawing it, so the
devices stay visible with the reason; allocators skip a tainted device unless the request tolerates
the taint. The rules are kube-scheduler's (``k8s.io/dynamic-resource-allocation``:
``resourceclaim.ToleratesTaint`` and the structured allocator's taint check):

- only the effects ``NoSchedule`` and ``NoExecute`` keep a device from being allocated; ``None``
  (informational) and any effect this code does not know are ignored;
- a toleration with an ``effect`` matches only that effect, with a ``key`` only that key;
- operator ``Exists`` matches any value, ``Equal`` (the default, also when empty) the exact value.

Field names and limits are the API's: ``key`` is a label key, ``value`` a label value (≤ 63
characters), ``effect`` one of ``NoSchedule``/``NoExecute``/``None``, ``timeAdded`` RFC 3339; at most
16 taints per device and 16 tolerations per request.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from api import wire
from api.names import DRIVER_NAME
from driver.cluster.port import format_time, parse_time
from driver.cluster.views import Taint, Toleration

EFFECT_NO_SCHEDULE: Final = "NoSchedule"
EFFECT_NO_EXECUTE: Final = "NoExecute"
EFFECT_NONE: Final = "None"
TAINT_EFFECTS: Final = (EFFECT_NO_SCHEDULE, EFFECT_NO_EXECUTE, EFFECT_NONE)
BLOCKING_EFFECTS: Final = frozenset({EFFECT_NO_SCHEDULE, EFFECT_NO_EXECUTE})
"""Effects that keep a device from being allocated (others are informational)."""
OPERATOR_EQUAL: Final = "Equal"
OPERATOR_EXISTS: Final = "Exists"
MAX_TOLERATIONS_PER_REQUEST: Final = 16

UNHEALTHY_TAINT_KEY: Final = f"{DRIVER_NAME}/unhealthy"
"""The taint the kubelet plugin puts on the devices of an unhealthy GPU; the value says why."""


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    key: str
    value: str
    effect: str
    time_added: datetime | None = None

    def to_json(self) -> wire.DeviceTaint:
        body: wire.DeviceTaint = (
            {"key": self.key, "value": self.value, "effect": self.effect}
            if self.value
            else {"key": self.key, "effect": self.effect}
        )
        if self.time_added is not None:
            body["timeAdded"] = format_time(self.time_added)
        return body

    def __str__(self) -> str:
        return (
            f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"
        )


@dataclass(frozen=True, slots=True)
class DeviceToleration:
    key: str = ""
    operator: str = OPERATOR_EQUAL
    value: str = ""
    effect: str = ""


def device_taints(taints: Iterable[Taint]) -> tuple[DeviceTaint, ...]:
    """A device's published taints (``SliceDevice.taints``); ``ValueError`` if one is malformed
    (no key, no effect, or a ``timeAdded`` that is not RFC 3339)."""
    parsed = []
    for taint in taints:
        if not taint.key or not taint.effect:
            raise ValueError(f"taint {taint} needs a key and an effect")
        parsed.append(
            DeviceTaint(
                key=taint.key,
                value=taint.value,
                effect=taint.effect,
                time_added=parse_time(taint.time_added) if taint.time_added else None,
            )
        )
    return tuple(parsed)


def parse_tolerations(raw: Any) -> tuple[DeviceToleration, ...]:
    """A request's ``tolerations`` list; an empty operator is ``Equal`` (the API's default)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError(f"tolerations must be a list, got {type(raw).__name__}")
    tolerations = []
    for entry in raw:
        if not isinstance(entry, Mapping):
            raise ValueError(f"toleration {entry!r} is not an object")
        toleration = Toleration.parse(entry)
        tolerations.append(
            DeviceToleration(
                key=toleration.key,
                operator=toleration.operator,
                value=toleration.value,
                effect=toleration.effect,
            )
        )
    return tuple(tolerations)


def tolerates(toleration: DeviceToleration, taint: DeviceTaint) -> bool:
    """kube-scheduler's ``ToleratesTaint``."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator in ("", OPERATOR_EQUAL):
        return toleration.value == taint.value
    return toleration.operator == OPERATOR_EXISTS


def untolerated(
    taints: Iterable[DeviceTaint], tolerations: Sequence[DeviceToleration]
) -> DeviceTaint | None:
    """The first taint that keeps the device from a request with ``tolerations``; ``None`` if the
    device may be allocated to it."""
    for taint in taints:
        if taint.effect in BLOCKING_EFFECTS and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None
