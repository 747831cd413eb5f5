"""``admission.AdmissionContext`` answered from informer caches and a slice inventory.

The webhook process (``webhook_process``) builds it on informers of its own; every replica serves
the webhook from its own caches, so pod creation never waits for the leader (and works while a new
one rebuilds its state).
"""

from __future__ import annotations

from collections.abc import Sequence
from threading import RLock
from typing import Protocol

from api.names import DEVICE_CLASS_ANY, profile_device_class
from controller.allocation.inventory import SliceInventory
from controller.allocation.podclaims import is_our_class
from driver.cluster.informer import Informer
from driver.cluster.views import ClaimTemplateView, ClaimView, DeviceClassView
from driver.mig.catalog import CATALOG

_CATALOG_PROFILES = frozenset(p for model in CATALOG.values() for p in model.profile_names)


class AdmissionCaches(Protocol):
    """The informers the webhook reads (``ClusterInformers`` and ``WebhookInformers`` have them)."""

    @property
    def claims(self) -> Informer: ...

    @property
    def templates(self) -> Informer: ...

    @property
    def classes(self) -> Informer: ...


class SliceSource(Protocol):
    """The slice inventory admission reads (``AllocationState`` or the webhook's ``SliceState``)."""

    @property
    def lock(self) -> RLock: ...

    @property
    def inventory(self) -> SliceInventory: ...

    def refresh(self) -> set[str]: ...


class CacheAdmissionContext:
    def __init__(self, *, informers: AdmissionCaches, state: SliceSource) -> None:
        self._informers = informers
        self._state = state
        self._max: tuple[tuple[int, int], dict[str, int]] = ((0, -1), {})
        self._profiles: tuple[tuple[int, int], frozenset[str]] = ((0, -1), frozenset())
        self._ours: tuple[tuple[object, ...], frozenset[str]] = ((), frozenset())

    def claim_device_classes(self, *, namespace: str, name: str) -> Sequence[str] | None:
        claim = self._informers.claims.get(name, namespace=namespace)
        if claim is None:
            return None
        return list(ClaimView.of(claim).spec.device_class_names())

    def template_device_classes(self, *, namespace: str, name: str) -> Sequence[str] | None:
        template = self._informers.templates.get(name, namespace=namespace)
        if template is None:
            return None
        return list(ClaimTemplateView.of(template).spec.device_class_names())

    def our_device_classes(self) -> frozenset[str]:
        # asked on every admission: remembered until the profiles or the DeviceClasses change (the
        # classes informer's resource version moves with every event it applies, after the cache)
        profiles = self.known_profiles()
        classes = self._informers.classes
        key = (profiles, classes.last_resource_version, classes.relists)
        cached_key, cached = self._ours
        if cached_key == key:
            return cached
        names = {DEVICE_CLASS_ANY}
        names.update(profile_device_class(p) for p in profiles)
        for device_class in classes.list():
            name = DeviceClassView.of(device_class).name
            if is_our_class(name, device_class):
                names.add(name)
        ours = frozenset(names)
        self._ours = (key, ours)
        return ours

    def known_profiles(self) -> frozenset[str]:
        # asked on every admission; the inventory's profile names are a walk over every device
        with self._state.lock:
            self._state.refresh()
            inventory = self._state.inventory
            key = (id(inventory), inventory.version)
            if self._profiles[0] != key:
                self._profiles = (key, _CATALOG_PROFILES | inventory.profile_names())
            return self._profiles[1]

    def max_slices_per_gpu(self, profile: str) -> int:
        with self._state.lock:
            self._state.refresh()
            inventory = self._state.inventory
            key = (id(inventory), inventory.version)
            if self._max[0] != key:
                self._max = (key, {})
            cached = self._max[1]
            if profile not in cached:
                cached[profile] = inventory.max_per_gpu(profile)
            return cached[profile]
