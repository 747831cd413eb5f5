"""Parts more than one kind carries: conditions (Pod, Node), taints (Node, ResourceSlice devices)
and the tolerations of a Pod."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from driver.cluster.views.readers import text


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str
    last_transition_time: str
    raw: Mapping[str, Any]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Condition:
        return cls(
            type=text(raw.get("type")),
            status=text(raw.get("status")),
            reason=text(raw.get("reason")),
            message=text(raw.get("message")),
            last_transition_time=text(raw.get("lastTransitionTime")),
            raw=raw,
        )

    @property
    def true(self) -> bool:
        return self.status == "True"


def find_condition(conditions: tuple[Condition, ...], kind: str) -> Condition | None:
    for condition in conditions:
        if condition.type == kind:
            return condition
    return None


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str
    time_added: str

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Taint:
        return cls(
            key=text(raw.get("key")),
            value=text(raw.get("value")),
            effect=text(raw.get("effect")),
            time_added=text(raw.get("timeAdded")),
        )


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Toleration:
        return cls(
            key=text(raw.get("key")),
            operator=text(raw.get("operator")) or "Equal",
            value=text(raw.get("value")),
            effect=text(raw.get("effect")),
        )

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes' rule: empty effect matches every effect; empty key with ``Exists``
        matches every taint; otherwise keys match and ``Exists`` or equal values."""
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value
