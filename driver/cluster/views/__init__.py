"""Typed, read-only views of the Kubernetes objects the product reads.

Objects cross the cluster port as their wire JSON (``JsonObject``) and are written back as such;
every *read* of a field goes through a view: ``PodView.of(pod)``, ``ClaimView.of(claim)``,
``SliceView.of(slice)``, ``DeviceClassView.of(cls)``, ``NodeView.of(node)``,
``LeaseView.of(lease)``.
A view keeps the raw object (``.raw``) for writes, so mypy sees every field the product reads and
every reader agrees on one parse (one parser of allocation results, one walker of container
resources, one reading of node selectors).

One module per kind (``claims``, ``pods``, ``slices``, ``deviceclass``, ``nodes``, ``leases``), over
what they share: ``base`` (the identity every view answers from its ``meta``), ``memo`` (parse once
per cached object version; parts parsed on first read), ``meta`` (``metadata``), ``readers``
(lenient JSON readers), ``requests``, ``selectors`` and ``common`` (parts several kinds carry).
Import from here.
"""

from driver.cluster.views.base import LazyView, View
from driver.cluster.views.claims import (
    Allocation,
    ClaimTemplateView,
    ClaimView,
    Consumer,
    DeviceResult,
    DeviceStatus,
)
from driver.cluster.views.common import Condition, Taint, Toleration, find_condition
from driver.cluster.views.deviceclass import DeviceClassView
from driver.cluster.views.leases import LeaseView
from driver.cluster.views.memo import adopt, lazy, memo_size, release
from driver.cluster.views.meta import Meta, OwnerRef
from driver.cluster.views.nodes import NodeView
from driver.cluster.views.pods import ContainerView, PodClaimRef, PodView
from driver.cluster.views.readers import (
    integer,
    items,
    mapping,
    optional_text,
    path,
    quantities,
    string_map,
    strings,
    text,
)
from driver.cluster.views.requests import (
    ClaimSpecView,
    DeviceConfigEntry,
    DeviceConstraint,
    DeviceRequest,
    DeviceSubRequest,
)
from driver.cluster.views.selectors import (
    HOSTNAME_LABEL,
    NAME_FIELD,
    NodeSelector,
    Requirement,
    SelectorTerm,
)
from driver.cluster.views.slices import (
    AttributeValue,
    CounterConsumption,
    CounterSet,
    SliceDevice,
    SliceView,
)

__all__ = [
    "HOSTNAME_LABEL",
    "NAME_FIELD",
    "Allocation",
    "AttributeValue",
    "ClaimSpecView",
    "ClaimTemplateView",
    "ClaimView",
    "Condition",
    "Consumer",
    "ContainerView",
    "CounterConsumption",
    "CounterSet",
    "DeviceClassView",
    "DeviceConfigEntry",
    "DeviceConstraint",
    "DeviceRequest",
    "DeviceResult",
    "DeviceStatus",
    "DeviceSubRequest",
    "LazyView",
    "LeaseView",
    "Meta",
    "NodeSelector",
    "NodeView",
    "OwnerRef",
    "PodClaimRef",
    "PodView",
    "Requirement",
    "SelectorTerm",
    "SliceDevice",
    "SliceView",
    "Taint",
    "Toleration",
    "View",
    "adopt",
    "find_condition",
    "integer",
    "items",
    "lazy",
    "mapping",
    "memo_size",
    "optional_text",
    "path",
    "quantities",
    "release",
    "string_map",
    "strings",
    "text",
]
