"""What a ResourceClaim asks for: its spec's requests, configuration and constraints."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from driver.cluster.views.readers import integer, items, mapping, path, string_map, strings, text


@dataclass(frozen=True, slots=True)
class DeviceConfigEntry:
    """One device configuration (claim spec or allocation): opaque parameters for a driver."""

    source: str
    """``FromClass`` / ``FromClaim`` in an allocation; ``""`` in a claim spec."""
    requests: tuple[str, ...]
    driver: str
    parameters: Any
    raw: Mapping[str, Any]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> DeviceConfigEntry:
        opaque = mapping(raw.get("opaque"))
        return cls(
            source=text(raw.get("source")),
            requests=strings(raw.get("requests")),
            driver=text(opaque.get("driver")),
            parameters=opaque.get("parameters"),
            raw=raw,
        )

    @property
    def opaque(self) -> bool:
        return isinstance(self.raw.get("opaque"), Mapping)


@dataclass(frozen=True, slots=True)
class DeviceSubRequest:
    """``exactly`` of a request, or one ``firstAvailable`` alternative."""

    name: str
    device_class_name: str
    selectors: tuple[str, ...]
    """The CEL expressions of ``selectors[].cel``."""
    allocation_mode: str
    count: int
    admin_access: bool
    tolerations: Any
    """``tolerations`` as written: validated by its reader (``driver.taints.parse_tolerations``)."""
    capacity_requests: Mapping[str, str]
    """``capacity.requests`` (consumable capacity)."""

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, name: str = "") -> DeviceSubRequest:
        return cls(
            name=text(raw.get("name")) or name,
            device_class_name=text(raw.get("deviceClassName")),
            selectors=tuple(
                text(path(s, "cel", "expression")) for s in items(raw.get("selectors"))
            ),
            allocation_mode=text(raw.get("allocationMode")) or "ExactCount",
            count=integer(raw.get("count"), 1),
            admin_access=raw.get("adminAccess") is True,
            tolerations=raw.get("tolerations"),
            capacity_requests=string_map(path(raw, "capacity", "requests")),
        )


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """One ``spec.devices.requests`` entry: ``exactly`` or ``firstAvailable``."""

    name: str
    exactly: DeviceSubRequest | None
    first_available: tuple[DeviceSubRequest, ...]
    raw: Mapping[str, Any]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> DeviceRequest:
        name = text(raw.get("name"))
        exactly = raw.get("exactly")
        if isinstance(exactly, Mapping):
            one: DeviceSubRequest | None = DeviceSubRequest.parse(exactly, name=name)
        elif isinstance(raw.get("deviceClassName"), str):  # v1beta1's flat request
            one = DeviceSubRequest.parse(raw, name=name)
        else:
            one = None
        return cls(
            name=name,
            exactly=one,
            first_available=tuple(
                DeviceSubRequest.parse(s) for s in items(raw.get("firstAvailable"))
            ),
            raw=raw,
        )

    @property
    def alternatives(self) -> tuple[DeviceSubRequest, ...]:
        """``(exactly,)`` or the ``firstAvailable`` list, in preference order."""
        return (self.exactly,) if self.exactly is not None else self.first_available

    def device_class_names(self) -> tuple[str, ...]:
        return tuple(a.device_class_name for a in self.alternatives if a.device_class_name)


@dataclass(frozen=True, slots=True)
class DeviceConstraint:
    """One ``spec.devices.constraints`` entry of a ResourceClaim."""

    requests: tuple[str, ...]
    """Request (or ``request/subrequest``) names it covers; empty: every request."""
    match_attribute: str
    distinct_attribute: str

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> DeviceConstraint:
        return cls(
            requests=strings(raw.get("requests")),
            match_attribute=text(raw.get("matchAttribute")),
            distinct_attribute=text(raw.get("distinctAttribute")),
        )

    @property
    def attribute(self) -> str:
        return self.match_attribute or self.distinct_attribute

    @property
    def distinct(self) -> bool:
        return bool(self.distinct_attribute)


@dataclass(frozen=True, slots=True)
class ClaimSpecView:
    """A ``ResourceClaimSpec`` (of a claim, or of a template's ``spec.spec``)."""

    requests: tuple[DeviceRequest, ...]
    config: tuple[DeviceConfigEntry, ...]
    constraints: tuple[Mapping[str, Any], ...]

    @classmethod
    def parse(cls, raw: Any) -> ClaimSpecView:
        devices = mapping(mapping(raw).get("devices"))
        return cls(
            requests=tuple(DeviceRequest.parse(r) for r in items(devices.get("requests"))),
            config=tuple(DeviceConfigEntry.parse(c) for c in items(devices.get("config"))),
            constraints=tuple(items(devices.get("constraints"))),
        )

    def device_class_names(self) -> tuple[str, ...]:
        """Every DeviceClass the spec names (``exactly`` and ``firstAvailable``), in order."""
        return tuple(n for r in self.requests for n in r.device_class_names())

    def device_constraints(self) -> tuple[DeviceConstraint, ...]:
        """``constraints`` parsed (``matchAttribute`` / ``distinctAttribute`` over requests)."""
        return tuple(DeviceConstraint.parse(c) for c in self.constraints)
