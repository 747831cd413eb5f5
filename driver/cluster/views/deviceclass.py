"""DeviceClass: the CEL selectors and configuration a request inherits by naming the class."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from driver.cluster.port import JsonObject
from driver.cluster.views.base import View
from driver.cluster.views.meta import Meta
from driver.cluster.views.readers import items, mapping, optional_text, path, text
from driver.cluster.views.requests import DeviceConfigEntry


@dataclass(frozen=True, slots=True)
class DeviceClassView(View):
    KIND: ClassVar[str] = "DeviceClass"

    raw: JsonObject = field(repr=False)
    meta: Meta
    selectors: tuple[str, ...]
    """The CEL expressions of ``spec.selectors[].cel``."""
    config: tuple[DeviceConfigEntry, ...]
    extended_resource_name: str | None

    @classmethod
    def parse(cls, obj: JsonObject) -> DeviceClassView:
        spec = mapping(obj.get("spec"))
        return cls(
            raw=obj,
            meta=Meta.parse(obj.get("metadata")),
            selectors=tuple(
                text(path(s, "cel", "expression")) for s in items(spec.get("selectors"))
            ),
            config=tuple(DeviceConfigEntry.parse(c) for c in items(spec.get("config"))),
            extended_resource_name=optional_text(spec.get("extendedResourceName")),
        )
