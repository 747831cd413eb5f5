"""ResourceClaim and ResourceClaimTemplate: spec, allocation, consumers and device status."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from driver.cluster.port import JsonObject
from driver.cluster.views.base import LazyView, View
from driver.cluster.views.memo import lazy
from driver.cluster.views.meta import Meta
from driver.cluster.views.readers import items, mapping, path, text
from driver.cluster.views.requests import ClaimSpecView, DeviceConfigEntry
from driver.cluster.views.selectors import NodeSelector


@dataclass(frozen=True, slots=True)
class DeviceResult:
    """One ``status.allocation.devices.results`` entry."""

    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> DeviceResult:
        return cls(
            request=text(raw.get("request")),
            driver=text(raw.get("driver")),
            pool=text(raw.get("pool")),
            device=text(raw.get("device")),
            admin_access=raw.get("adminAccess") is True,
        )

    @property
    def key(self) -> tuple[str, str]:
        """(pool, device): a device's identity within one driver."""
        return (self.pool, self.device)


@dataclass(frozen=True)
class Allocation:
    results: tuple[DeviceResult, ...]
    config: tuple[DeviceConfigEntry, ...]
    raw: Mapping[str, Any]

    @classmethod
    def parse(cls, raw: Any) -> Allocation | None:
        if not isinstance(raw, Mapping) or not raw:
            return None
        devices = mapping(raw.get("devices"))
        return cls(
            results=tuple(DeviceResult.parse(r) for r in items(devices.get("results"))),
            config=tuple(DeviceConfigEntry.parse(c) for c in items(devices.get("config"))),
            raw=raw,
        )

    @lazy
    def node_selector(self) -> NodeSelector | None:
        """``nodeSelector``, parsed on first read: the allocator's hot readers (occupancy, its
        post-write check) want only the results, and an allocation is parsed per claim event."""
        return NodeSelector.parse(self.raw.get("nodeSelector"))

    def results_of(self, driver: str) -> tuple[DeviceResult, ...]:
        return tuple(r for r in self.results if r.driver == driver)

    def devices_of(self, driver: str) -> tuple[tuple[str, str], ...]:
        """(pool, device) of every result of ``driver``."""
        return tuple(r.key for r in self.results if r.driver == driver)

    def node_names(self) -> tuple[str, ...]:
        return self.node_selector.node_names() if self.node_selector else ()


@dataclass(frozen=True, slots=True)
class Consumer:
    """One ``status.reservedFor`` entry."""

    api_group: str
    resource: str
    name: str
    uid: str
    raw: Mapping[str, Any]
    """The entry as written (to write the others back when one consumer leaves)."""

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Consumer:
        return cls(
            api_group=text(raw.get("apiGroup")),
            resource=text(raw.get("resource")),
            name=text(raw.get("name")),
            uid=text(raw.get("uid")),
            raw=raw,
        )

    @property
    def is_pod(self) -> bool:
        return self.resource == "pods" and not self.api_group


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    """One ``status.devices`` entry (what a driver reports about an allocated device)."""

    driver: str
    pool: str
    device: str
    data: Mapping[str, Any]
    raw: Mapping[str, Any]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> DeviceStatus:
        return cls(
            driver=text(raw.get("driver")),
            pool=text(raw.get("pool")),
            device=text(raw.get("device")),
            data=mapping(raw.get("data")),
            raw=raw,
        )


class ClaimView(LazyView):
    """A ResourceClaim; each part is parsed on first read."""

    KIND: ClassVar[str] = "ResourceClaim"

    @lazy
    def spec(self) -> ClaimSpecView:
        return ClaimSpecView.parse(self.raw.get("spec"))

    @lazy
    def _status(self) -> Mapping[str, Any]:
        return mapping(self.raw.get("status"))

    @lazy
    def allocation(self) -> Allocation | None:
        return Allocation.parse(self._status.get("allocation"))

    @lazy
    def reserved_for(self) -> tuple[Consumer, ...]:
        return tuple(Consumer.parse(c) for c in items(self._status.get("reservedFor")))

    @lazy
    def devices(self) -> tuple[DeviceStatus, ...]:
        return tuple(DeviceStatus.parse(d) for d in items(self._status.get("devices")))

    @property
    def allocated(self) -> bool:
        return self.allocation is not None

    def results_of(self, driver: str) -> tuple[DeviceResult, ...]:
        return self.allocation.results_of(driver) if self.allocation else ()

    def devices_of(self, driver: str) -> tuple[tuple[str, str], ...]:
        return self.allocation.devices_of(driver) if self.allocation else ()

    def node_names(self) -> tuple[str, ...]:
        """Nodes the allocation pins the claim to (empty when unallocated or unpinned)."""
        return self.allocation.node_names() if self.allocation else ()

    def reserved_pod_uids(self) -> tuple[str, ...]:
        return tuple(c.uid for c in self.reserved_for if c.is_pod)

    def device_status(self, driver: str, pool: str, device: str) -> DeviceStatus | None:
        for entry in self.devices:
            if (entry.driver, entry.pool, entry.device) == (driver, pool, device):
                return entry
        return None


@dataclass(frozen=True, slots=True)
class ClaimTemplateView(View):
    KIND: ClassVar[str] = "ResourceClaimTemplate"

    raw: JsonObject = field(repr=False)
    meta: Meta
    spec: ClaimSpecView

    @classmethod
    def parse(cls, obj: JsonObject) -> ClaimTemplateView:
        return cls(
            raw=obj,
            meta=Meta.parse(obj.get("metadata")),
            spec=ClaimSpecView.parse(path(obj, "spec", "spec")),
        )
