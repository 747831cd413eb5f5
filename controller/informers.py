"""The controller's shared informers (one list + watch per kind) and the indexes it looks up by.

Every replica runs them: the webhook answers from their caches, and a standby that becomes leader
starts allocating from warm caches.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields

from api.names import SHADOW_CLAIM_LABEL, SHIM_LEASE_LABEL, SYSTEM_NAMESPACE
from driver.cluster.indexes import (
    BY_CLAIM,
    BY_POD_UID,
    claim_pod_uids,
    claim_pod_uids_inputs,
    pod_claim_keys,
    pod_claim_keys_inputs,
)
from driver.cluster.informer import (
    Informer,
    JsonInterner,
    ListWatch,
    Transform,
    chain,
    strip_managed_fields,
)
from driver.cluster.port import (
    DEVICE_CLASSES,
    LEASES,
    NODES,
    POD_DISRUPTION_BUDGETS,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    ClusterApi,
    JsonObject,
    Resource,
)
from driver.cluster.views import ClaimView, PodView

BY_UID = "uid"
"""Pods by their UID (owner references and shadow-claim labels name pods by UID)."""
BY_SHADOW_POD = "shadow-pod"
"""Shadow claims by the UID of the classic pod they stand for."""

WATCH_TIMEOUT_S = 300


def _uid(pod: JsonObject) -> Iterable[str]:
    uid = PodView.of(pod).uid
    return (uid,) if uid else ()


def _shadow_pod(claim: JsonObject) -> Iterable[str]:
    value = ClaimView.of(claim).meta.labels.get(SHADOW_CLAIM_LABEL)
    return (value,) if value else ()


def _informer(
    api: ClusterApi,
    resource: Resource,
    name: str,
    *,
    namespace: str | None = None,
    label: str | None = None,
    transform: Transform = strip_managed_fields,
    page_size: int | None = None,
) -> Informer:
    return Informer(
        source=ListWatch(
            api, resource, namespace=namespace, label_selector=label, page_size=page_size
        ),
        name=f"{name}-{resource.plural}",
        watch_timeout_seconds=WATCH_TIMEOUT_S,
        transform=transform,
    )


SLICE_PAGE_SIZE = 100
"""ResourceSlices per list request: a page of our slices is ~1.4 MB as sent and ~9 MiB parsed,
held only until it is interned (a page of the client's default 500 would be ~45 MiB parsed, most
of it left to the process as fragmented heap)."""


def _slices_informer(api: ClusterApi, name: str) -> Informer:
    """ResourceSlices with their many equal small parts shared (``JsonInterner``), interned page by
    page as the list arrives, so a node of 8 A100s takes about a sixth of its parsed size
    (docs/design.md, "Memory"). Slices change rarely, so the CPU interning costs is spent at start
    and on a republish, not per pod."""
    return _informer(
        api,
        RESOURCE_SLICES,
        name,
        transform=chain(strip_managed_fields, JsonInterner()),
        page_size=SLICE_PAGE_SIZE,
    )


def admission_claim(claim: JsonObject) -> JsonObject:
    """What the webhook process keeps of a claim: the device classes its requests name are all
    admission reads (``CacheAdmissionContext.claim_device_classes``), so the status — the
    allocation and its users, about half of an allocated claim — and managedFields are dropped."""
    return strip_managed_fields({k: v for k, v in claim.items() if k != "status"})


class _InformerSet:
    """Start, stop and sync-wait for a group of informers (``__iter__`` names them)."""

    __slots__ = ()

    def __iter__(self) -> Iterator[Informer]:
        raise NotImplementedError

    def named(self) -> dict[str, Informer]:
        """Each informer by its field name (``pods``, ``claims``…): the label of its metrics."""
        return {field.name: getattr(self, field.name) for field in fields(self)}  # type: ignore[arg-type]

    def start(self) -> None:
        for informer in self:
            informer.start()

    def stop(self) -> None:
        for informer in self:
            informer.stop()

    def has_synced(self) -> bool:
        return all(informer.has_synced() for informer in self)

    def wait_for_sync(self, *, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(
            informer.wait_for_sync(timeout=max(0.0, deadline - time.monotonic()))
            for informer in self
        )


@dataclass(frozen=True, slots=True)
class ClusterInformers(_InformerSet):
    pods: Informer
    claims: Informer
    templates: Informer
    slices: Informer
    classes: Informer
    nodes: Informer
    shim_leases: Informer
    """The nodes' device-plugin shim leases (``kubeletplugin/deviceplugin/lease.py``)."""
    pdbs: Informer
    """PodDisruptionBudgets: preemption evicts no victim a budget protects (``disruption``)."""

    @classmethod
    def create(
        cls, api: ClusterApi, *, name: str = "controller", namespace: str = SYSTEM_NAMESPACE
    ) -> ClusterInformers:
        informers = cls(
            pods=_informer(api, PODS, name),
            claims=_informer(api, RESOURCE_CLAIMS, name),
            templates=_informer(api, RESOURCE_CLAIM_TEMPLATES, name),
            slices=_slices_informer(api, name),
            classes=_informer(api, DEVICE_CLASSES, name),
            nodes=_informer(api, NODES, name),
            shim_leases=_informer(api, LEASES, name, namespace=namespace, label=SHIM_LEASE_LABEL),
            pdbs=_informer(api, POD_DISRUPTION_BUDGETS, name),
        )
        informers.pods.add_index(BY_CLAIM, pod_claim_keys, inputs=pod_claim_keys_inputs)
        informers.pods.add_index(BY_UID, _uid)
        informers.claims.add_index(BY_POD_UID, claim_pod_uids, inputs=claim_pod_uids_inputs)
        informers.claims.add_index(BY_SHADOW_POD, _shadow_pod)
        return informers

    def __iter__(self) -> Iterator[Informer]:
        return iter(
            (
                self.pods,
                self.claims,
                self.templates,
                self.slices,
                self.classes,
                self.nodes,
                self.shim_leases,
                self.pdbs,
            )
        )


@dataclass(frozen=True, slots=True)
class WebhookInformers(_InformerSet):
    """What the webhook process watches: admission reads claims, templates, classes and the slice
    inventory, never pods or nodes (the busiest kinds in a burst)."""

    claims: Informer
    templates: Informer
    slices: Informer
    classes: Informer

    @classmethod
    def create(cls, api: ClusterApi, *, name: str = "webhook") -> WebhookInformers:
        return cls(
            claims=_informer(api, RESOURCE_CLAIMS, name, transform=admission_claim),
            templates=_informer(api, RESOURCE_CLAIM_TEMPLATES, name),
            slices=_slices_informer(api, name),
            classes=_informer(api, DEVICE_CLASSES, name),
        )

    def __iter__(self) -> Iterator[Informer]:
        return iter((self.claims, self.templates, self.slices, self.classes))
