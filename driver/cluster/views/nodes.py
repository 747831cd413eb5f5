"""Node: schedulability, taints, capacity and conditions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from driver.cluster.port import JsonObject
from driver.cluster.views.base import View
from driver.cluster.views.common import Condition, Taint, find_condition
from driver.cluster.views.meta import Meta
from driver.cluster.views.readers import items, mapping, string_map


@dataclass(frozen=True, slots=True)
class NodeView(View):
    KIND: ClassVar[str] = "Node"

    raw: JsonObject = field(repr=False)
    meta: Meta
    unschedulable: bool
    taints: tuple[Taint, ...]
    capacity: Mapping[str, str]
    allocatable: Mapping[str, str]
    conditions: tuple[Condition, ...]

    @classmethod
    def parse(cls, obj: JsonObject) -> NodeView:
        spec = mapping(obj.get("spec"))
        status = mapping(obj.get("status"))
        return cls(
            raw=obj,
            meta=Meta.parse(obj.get("metadata")),
            unschedulable=spec.get("unschedulable") is True,
            taints=tuple(Taint.parse(t) for t in items(spec.get("taints"))),
            capacity=string_map(status.get("capacity")),
            allocatable=string_map(status.get("allocatable")),
            conditions=tuple(Condition.parse(c) for c in items(status.get("conditions"))),
        )

    def condition(self, kind: str) -> Condition | None:
        return find_condition(self.conditions, kind)

    @property
    def ready(self) -> bool:
        ready = self.condition("Ready")
        return ready is not None and ready.true
