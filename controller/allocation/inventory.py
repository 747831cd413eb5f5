"""What the nodes publish, as the allocator needs it: engine nodes, device lookups, CEL views.

Fed by the ResourceSlice informer. A slice event only marks its pool dirty; ``refresh`` (called
under the allocator's lock right before a decision) rebuilds each dirty pool once, however many of
its slices changed, and only from a *complete* pool (every ``resourceSliceCount`` slice of its
newest generation present — a half-published pool is not trusted). A rebuilt pool becomes one
``NodeSpec`` for the placement engine: one ``GpuSpec`` per GPU, whose model is taken from the
devices the node really publishes (profiles, placements in published order, memory slices from the
GPU's counter set), so nothing about real hardware is assumed here.

Lookups the allocator makes for every pod: a published device by (node, device name) — to turn an
allocated claim into occupied memory slices — and the device name of an engine assignment
(node, GPU, profile, start) — to write an allocation result. Not thread-safe: the allocator holds
its lock around every call.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from api import names
from controller.allocation.selectors import DeviceView, device_view_from_slice
from driver.cluster.port import JsonObject
from driver.cluster.views import SliceView, integer, path
from driver.errors import ConfigError
from driver.mig.model import GpuModel, MigProfile, Placement
from driver.placement import Engine, GpuSpec, NodeSpec
from driver.resourceslices import PublishedDevice, complete_pools, parse_devices

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GpuShape:
    """What one GPU can hold at most: its memory slices, and per profile (instances, size)."""

    memory_slices: int
    profiles: dict[str, tuple[int, int]]


@dataclass(frozen=True, slots=True)
class Pool:
    """One complete pool of our driver: a node's devices, by name and by placement."""

    node: str
    generation: int
    devices: dict[str, PublishedDevice]
    by_placement: dict[tuple[int, str, int], str]
    """(GPU index, profile, start) → device name."""
    views: tuple[DeviceView, ...]
    views_by_name: dict[str, DeviceView]
    gpus: tuple[GpuShape, ...]


def _max_count(placements: Iterable[Placement], *, media: bool) -> int:
    """How many instances can coexist on one GPU: the most non-overlapping placements."""
    if media:
        return 1
    count, end = 0, -1
    for placement in sorted(placements, key=lambda p: p.end):
        if placement.start >= end:
            count += 1
            end = placement.end
    return count


def gpu_model_of(devices: list[PublishedDevice]) -> GpuModel:
    """The model of one GPU as its published devices describe it (profiles in published order)."""
    first = devices[0]
    by_profile: dict[str, list[PublishedDevice]] = {}
    for device in devices:
        by_profile.setdefault(device.profile, []).append(device)
    profiles = []
    for name, group in by_profile.items():
        sample = group[0]
        placements = tuple(d.placement for d in group)
        compute = integer(path(sample.attributes, names.ATTRIBUTE_COMPUTE_SLICES, "int"))
        profiles.append(
            MigProfile(
                name=name,
                gi_profile_id=-1,
                ci_profile_id=-1,
                memory_slices=sample.placement.size,
                compute_slices=compute,
                memory_bytes=sample.memory_bytes,
                multiprocessors=sample.multiprocessors,
                media_extensions=sample.media_extensions,
                max_count=_max_count(placements, media=sample.media_extensions),
                placements=placements,
            )
        )
    slices = first.memory_slices_total or max(d.placement.end for d in devices)
    return GpuModel(
        name=first.product_name,
        product_name=first.product_name,
        memory_bytes=max(d.memory_bytes for d in devices),
        memory_slices=slices,
        compute_slices=max(p.compute_slices for p in profiles),
        multiprocessors=max(d.multiprocessors for d in devices),
        profiles=tuple(profiles),
    )


def _build_pool(node: str, pool_slices: list[JsonObject], *, selectors: bool = True) -> Pool:
    devices = {d.name: d for d in parse_devices(pool_slices)}
    views: list[DeviceView] = []
    for slice_obj in pool_slices:
        for published in SliceView.of(slice_obj).devices:
            if published.name not in devices:
                continue
            try:
                view = device_view_from_slice(slice_obj, published.raw)
            except ConfigError as exc:
                logger.warning("skipping a device of node %s: %s", node, exc)
                devices.pop(published.name, None)
                continue
            if selectors:
                views.append(view)
    generation = SliceView.of(pool_slices[0]).pool_generation if pool_slices else 0
    by_gpu: dict[int, list[PublishedDevice]] = {}
    for device in devices.values():
        by_gpu.setdefault(device.gpu_index, []).append(device)
    shapes = []
    for gpu_devices in by_gpu.values():
        model = gpu_model_of(gpu_devices)
        shapes.append(
            GpuShape(
                memory_slices=model.memory_slices,
                profiles={p.name: (p.max_count, p.memory_slices) for p in model.profiles},
            )
        )
    return Pool(
        node=node,
        generation=generation,
        devices=devices,
        by_placement={
            (d.gpu_index, d.profile, d.placement.start): d.name for d in devices.values()
        },
        views=tuple(views),
        views_by_name={v.name: v for v in views},
        gpus=tuple(shapes),
    )


def node_spec_of(pool: Pool) -> NodeSpec:
    by_gpu: dict[int, list[PublishedDevice]] = {}
    for device in pool.devices.values():
        by_gpu.setdefault(device.gpu_index, []).append(device)
    gpus = tuple(
        GpuSpec(
            index=index,
            model=gpu_model_of(devices),
            uuid=devices[0].parent_uuid,
            published=frozenset((d.profile, d.placement.start) for d in devices),
        )
        for index, devices in sorted(by_gpu.items())
    )
    return NodeSpec(name=pool.node, gpus=gpus)


class SliceInventory:
    """Our driver's complete pools, node by node, fed by slice events and applied by ``refresh``.

    ``engine`` (None: none) gets every node's GPUs for placement; ``selectors`` keeps each device's
    ``DeviceView`` for CEL selectors. The webhook process needs neither — only which profiles are
    published and how many fit one GPU — and builds its inventory without them: about a third of
    the memory per node (docs/design.md, "Memory")."""

    def __init__(self, engine: Engine | None, *, selectors: bool = True) -> None:
        self._engine = engine
        self._selectors = selectors
        self._slices: dict[str, JsonObject] = {}
        self._slices_by_pool: dict[str, set[str]] = {}
        self._dirty: set[str] = set()
        self._pools: dict[str, Pool] = {}
        self.version = 0
        """Bumped whenever a pool's devices change (keys candidate caches)."""

    # -- informer side -------------------------------------------------------------------------

    def slice_changed(self, slice_obj: JsonObject) -> None:
        view = SliceView.of(slice_obj)
        if view.driver != names.DRIVER_NAME:
            return
        name = view.name
        pool = view.pool
        old = self._slices.get(name)
        if old is not None:
            old_pool = SliceView.of(old).pool
            if old_pool != pool:
                self._slices_by_pool.get(old_pool, set()).discard(name)
                self._dirty.add(old_pool)
        self._slices[name] = slice_obj
        self._slices_by_pool.setdefault(pool, set()).add(name)
        self._dirty.add(pool)

    def slice_deleted(self, slice_obj: JsonObject) -> None:
        name = SliceView.of(slice_obj).name
        old = self._slices.pop(name, None)
        if old is None:
            return
        pool = SliceView.of(old).pool
        self._slices_by_pool.get(pool, set()).discard(name)
        self._dirty.add(pool)

    @property
    def dirty(self) -> bool:
        return bool(self._dirty)

    def refresh(self) -> set[str]:
        """Rebuild dirty pools into the engine; the nodes whose devices changed."""
        changed: set[str] = set()
        for pool_name in sorted(self._dirty):
            objs = [self._slices[n] for n in self._slices_by_pool.get(pool_name, ())]
            complete = complete_pools(objs).get(pool_name)
            old = self._pools.get(pool_name)
            if complete is None:
                if objs and old is not None:
                    continue  # a new generation is being published: keep the last complete one
                if old is not None:
                    del self._pools[pool_name]
                    if self._engine is not None:
                        self._engine.remove_node(old.node)
                    changed.add(old.node)
                continue
            node = SliceView.of(complete[0]).node_name or pool_name
            pool = _build_pool(node, complete, selectors=self._selectors)
            if old is not None and old.devices == pool.devices:
                self._pools[pool_name] = pool  # same devices; keep the newer views
                continue
            self._pools[pool_name] = pool
            if self._engine is not None and pool.devices:
                self._engine.set_node(node_spec_of(pool))
            elif self._engine is not None:
                self._engine.remove_node(node)
            changed.add(node)
        self._dirty.clear()
        if changed:
            self.version += 1
            logger.debug("inventory: %d node(s) changed: %s", len(changed), sorted(changed))
        return changed

    # -- lookups -------------------------------------------------------------------------------

    def device(self, node: str, name: str) -> PublishedDevice | None:
        pool = self._pools.get(node)
        return pool.devices.get(name) if pool is not None else None

    def device_name(self, node: str, gpu_index: int, profile: str, start: int) -> str | None:
        pool = self._pools.get(node)
        return pool.by_placement.get((gpu_index, profile, start)) if pool is not None else None

    def view(self, node: str, name: str) -> DeviceView | None:
        pool = self._pools.get(node)
        return pool.views_by_name.get(name) if pool is not None else None

    def has_node(self, node: str) -> bool:
        return node in self._pools

    def nodes(self) -> list[str]:
        return sorted(self._pools)

    def views(self) -> Iterator[DeviceView]:
        """Every published device of ours as CEL selectors see it, node by node in name order."""
        for node in sorted(self._pools):
            yield from self._pools[node].views

    def profile_names(self) -> set[str]:
        return {d.profile for pool in self._pools.values() for d in pool.devices.values()}

    def node_shapes(self) -> Iterator[tuple[GpuShape, ...]]:
        """Each node's GPUs, for upper bounds on what one node can hold."""
        for pool in self._pools.values():
            yield pool.gpus

    def max_per_gpu(self, profile: str) -> int:
        """The most instances of ``profile`` one published GPU can hold (0: nobody offers it)."""
        best = 0
        for pool in self._pools.values():
            by_gpu: dict[int, list[Placement]] = {}
            media = False
            for device in pool.devices.values():
                if device.profile == profile:
                    by_gpu.setdefault(device.gpu_index, []).append(device.placement)
                    media = device.media_extensions
            for placements in by_gpu.values():
                best = max(best, _max_count(placements, media=media))
        return best
