"""ResourceSlice: a pool's devices, their attributes, capacity, counters and taints."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from driver.cluster.port import JsonObject
from driver.cluster.views.base import View
from driver.cluster.views.common import Taint
from driver.cluster.views.meta import Meta
from driver.cluster.views.readers import integer, items, mapping, quantities, text

AttributeValue = str | int | bool


def _attribute(raw: Any) -> AttributeValue | None:
    value = mapping(raw)
    for key in ("string", "version"):
        if isinstance(value.get(key), str):
            return str(value[key])
    if isinstance(value.get("bool"), bool):
        return bool(value["bool"])
    if isinstance(value.get("int"), int):
        return int(value["int"])
    return None


@dataclass(frozen=True, slots=True)
class CounterConsumption:
    counter_set: str
    counters: Mapping[str, str]
    """counter name → quantity string (``value`` of each counter)."""

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> CounterConsumption:
        return cls(
            counter_set=text(raw.get("counterSet")),
            counters=quantities(raw.get("counters")),
        )


@dataclass(frozen=True, slots=True)
class SliceDevice:
    name: str
    attributes: Mapping[str, AttributeValue]
    capacity: Mapping[str, str]
    """capacity name → quantity string (``value``)."""
    consumes: tuple[CounterConsumption, ...]
    taints: tuple[Taint, ...]
    raw: Mapping[str, Any]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> SliceDevice:
        attributes: dict[str, AttributeValue] = {}
        for key, value in mapping(raw.get("attributes")).items():
            parsed = _attribute(value)
            if parsed is not None:
                attributes[str(key)] = parsed
        return cls(
            name=text(raw.get("name")),
            attributes=attributes,
            capacity=quantities(raw.get("capacity")),
            consumes=tuple(CounterConsumption.parse(c) for c in items(raw.get("consumesCounters"))),
            taints=tuple(Taint.parse(t) for t in items(raw.get("taints"))),
            raw=raw,
        )


@dataclass(frozen=True, slots=True)
class CounterSet:
    name: str
    counters: Mapping[str, str]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> CounterSet:
        return cls(
            name=text(raw.get("name")),
            counters=quantities(raw.get("counters")),
        )


@dataclass(frozen=True, slots=True)
class SliceView(View):
    KIND: ClassVar[str] = "ResourceSlice"

    raw: JsonObject = field(repr=False)
    meta: Meta
    driver: str
    pool: str
    pool_generation: int
    pool_slice_count: int
    node_name: str
    all_nodes: bool
    devices: tuple[SliceDevice, ...]
    shared_counters: tuple[CounterSet, ...]

    @classmethod
    def parse(cls, obj: JsonObject) -> SliceView:
        spec = mapping(obj.get("spec"))
        pool = mapping(spec.get("pool"))
        return cls(
            raw=obj,
            meta=Meta.parse(obj.get("metadata")),
            driver=text(spec.get("driver")),
            pool=text(pool.get("name")),
            pool_generation=integer(pool.get("generation")),
            pool_slice_count=integer(pool.get("resourceSliceCount"), 1),
            node_name=text(spec.get("nodeName")),
            all_nodes=spec.get("allNodes") is True,
            devices=tuple(SliceDevice.parse(d) for d in items(spec.get("devices"))),
            shared_counters=tuple(CounterSet.parse(c) for c in items(spec.get("sharedCounters"))),
        )

    @property
    def node(self) -> str:
        """The node the slice's devices are on: ``nodeName``, else the pool name."""
        return self.node_name or self.pool
