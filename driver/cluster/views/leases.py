"""Lease (``coordination.k8s.io/v1``): leader election and the device-plugin shim's node lease."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from driver.cluster.port import JsonObject
from driver.cluster.views.base import View
from driver.cluster.views.meta import Meta
from driver.cluster.views.readers import integer, mapping, text


@dataclass(frozen=True, slots=True)
class LeaseView(View):
    """A ``coordination.k8s.io/v1`` Lease (leader election, the device-plugin shim's lease)."""

    KIND: ClassVar[str] = "Lease"

    raw: JsonObject = field(repr=False)
    meta: Meta
    spec: Mapping[str, Any]
    """``spec`` as sent (``{}`` when absent), for writers that keep the fields they do not set."""
    holder_identity: str
    lease_duration_seconds: int
    """0 when absent (the reader supplies its own default)."""
    acquire_time: str
    renew_time: str
    lease_transitions: int

    @classmethod
    def parse(cls, obj: JsonObject) -> LeaseView:
        spec = mapping(obj.get("spec"))
        return cls(
            raw=obj,
            meta=Meta.parse(obj.get("metadata")),
            spec=spec,
            holder_identity=text(spec.get("holderIdentity")),
            lease_duration_seconds=integer(spec.get("leaseDurationSeconds")),
            acquire_time=text(spec.get("acquireTime")),
            renew_time=text(spec.get("renewTime")),
            lease_transitions=integer(spec.get("leaseTransitions")),
        )
