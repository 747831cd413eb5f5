"""The ResourceSlice model: a node's MIG inventory → ``resource.k8s.io/v1`` ResourceSlice objects, and back.

One device per (GPU, profile, placement start) — every slice that *could* be created — with the
attributes and capacity of docs/design.md "Device model". Each GPU gets one counter set
(``memory-slice-0..N-1`` = 1 each, ``media-extensions`` = 1); a device consumes the memory slices it
covers (and the media-extensions counter if it is a ``+me`` profile), so no allocator that honours
counters can ever hand out two overlapping slices.

Kubernetes ≥ 1.35 requires counter sets and devices in separate slices, at most 8 counter sets per
slice and at most 64 devices per slice that consumes counters; ``pool.resourceSliceCount`` counts all
slices of the pool. The kubelet plugin publishes what :func:`build_pool` returns; the controller reads
slices back with :func:`parse_devices`.

The devices of an unhealthy GPU are published with taints (``driver.taints``; the ``taints`` argument
of :func:`build_pool`), which allocators honour; a device with taints also counts against the
64-device limit.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from api import names, wire
from driver.cluster.port import Body, as_json
from driver.cluster.views import AttributeValue, SliceDevice, SliceView, mapping, path
from driver.mig.model import MigProfile, Placement
from driver.mig.naming import device_name
from driver.taints import DeviceTaint, device_taints

JsonObject = dict[str, Any]
_Item = TypeVar("_Item")

MAX_COUNTER_SETS_PER_SLICE = 8
MAX_DEVICES_PER_SLICE = 64


@dataclass(frozen=True, slots=True)
class GpuInventory:
    """One GPU to publish: its identity and the profiles it offers."""

    index: int
    uuid: str
    product_name: str
    memory_slices: int
    profiles: tuple[MigProfile, ...]


@dataclass(frozen=True, slots=True)
class PublishedDevice:
    """A device read back from a ResourceSlice: one possible MIG slice on one GPU of one node."""

    node: str
    name: str
    gpu_index: int
    parent_uuid: str
    product_name: str
    profile: str
    placement: Placement
    media_extensions: bool
    memory_bytes: int
    multiprocessors: int
    memory_slices_total: int
    """Memory slices of the whole GPU (from its counter set), 0 if the counter slice is missing."""
    attributes: Mapping[str, Any]
    capacity: Mapping[str, Any]
    taints: tuple[DeviceTaint, ...] = ()


def counter_set_name(gpu_index: int) -> str:
    return f"gpu-{gpu_index}"


def slice_name(node: str, suffix: str) -> str:
    """Deterministic slice names, so a restarted plugin updates its own slices in place."""
    return f"{names.RESOURCE_SLICE_NAME_PREFIX}-{node}-{suffix}"


def _device(
    gpu: GpuInventory,
    profile: MigProfile,
    placement: Placement,
    taints: Sequence[DeviceTaint] = (),
) -> wire.Device:
    counters: dict[str, wire.Counter] = {
        f"{names.COUNTER_MEMORY_SLICE_PREFIX}{i}": {"value": "1"}
        for i in range(placement.start, placement.end)
    }
    if profile.media_extensions:
        counters[names.COUNTER_MEDIA_EXTENSIONS] = {"value": "1"}
    device: wire.Device = {
        "name": device_name(gpu_index=gpu.index, profile=profile.name, start=placement.start),
        "attributes": {
            names.ATTRIBUTE_PROFILE: {"string": profile.name},
            names.ATTRIBUTE_GPU_INDEX: {"int": gpu.index},
            names.ATTRIBUTE_PARENT_UUID: {"string": gpu.uuid},
            names.ATTRIBUTE_PRODUCT_NAME: {"string": gpu.product_name},
            names.ATTRIBUTE_PLACEMENT_START: {"int": placement.start},
            names.ATTRIBUTE_PLACEMENT_SIZE: {"int": placement.size},
            names.ATTRIBUTE_MEMORY_SLICES: {"int": profile.memory_slices},
            names.ATTRIBUTE_COMPUTE_SLICES: {"int": profile.compute_slices},
            names.ATTRIBUTE_MEDIA_EXTENSIONS: {"bool": profile.media_extensions},
        },
        "capacity": {
            names.CAPACITY_MEMORY: {"value": str(profile.memory_bytes)},
            names.CAPACITY_MULTIPROCESSORS: {"value": str(profile.multiprocessors)},
        },
        "consumesCounters": [{"counterSet": counter_set_name(gpu.index), "counters": counters}],
    }
    if taints:
        device["taints"] = [taint.to_json() for taint in taints]
    return device


def _counter_set(gpu: GpuInventory) -> wire.CounterSet:
    counters: dict[str, wire.Counter] = {
        f"{names.COUNTER_MEMORY_SLICE_PREFIX}{i}": {"value": "1"} for i in range(gpu.memory_slices)
    }
    counters[names.COUNTER_MEDIA_EXTENSIONS] = {"value": "1"}
    return {"name": counter_set_name(gpu.index), "counters": counters}


def _chunks(items: Sequence[_Item], size: int) -> list[Sequence[_Item]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def build_pool(
    *,
    node: str,
    gpus: Iterable[GpuInventory],
    generation: int,
    owner: wire.OwnerReference | None = None,
    taints: Mapping[int, Sequence[DeviceTaint]] | None = None,
) -> list[wire.ResourceSlice]:
    """Every ResourceSlice of ``node``'s pool at ``generation``.

    ``owner`` is the Node's ownerReference (``apiVersion``, ``kind``, ``name``, ``uid``) so the slices
    go away with the Node. ``taints`` (GPU index → taints) go on every device of that GPU. Returns an
    empty list when there is nothing to publish (no MIG GPU).
    """
    ordered = sorted(gpus, key=lambda g: g.index)
    device_groups = _device_groups(ordered, taints or {})
    if not device_groups:
        return []
    counter_groups = _chunks([_counter_set(g) for g in ordered], MAX_COUNTER_SETS_PER_SLICE)
    pool: wire.ResourcePool = {
        "name": node,
        "generation": generation,
        "resourceSliceCount": len(counter_groups) + len(device_groups),
    }
    return [
        *(
            _slice(node, f"counters-{i}", pool=pool, owner=owner, shared_counters=list(group))
            for i, group in enumerate(counter_groups)
        ),
        *(
            _slice(node, suffix, pool=pool, owner=owner, devices=list(group))
            for suffix, group in device_groups
        ),
    ]


def _device_groups(
    ordered: Sequence[GpuInventory], taints: Mapping[int, Sequence[DeviceTaint]]
) -> list[tuple[str, Sequence[wire.Device]]]:
    """Each GPU's devices (with its taints), in chunks of at most ``MAX_DEVICES_PER_SLICE``,
    named ``gpu-<index>-<part>``."""
    device_groups: list[tuple[str, Sequence[wire.Device]]] = []
    for gpu in ordered:
        gpu_taints = taints.get(gpu.index, ())
        devices = [_device(gpu, p, pl, gpu_taints) for p in gpu.profiles for pl in p.placements]
        for part, chunk in enumerate(_chunks(devices, MAX_DEVICES_PER_SLICE)):
            device_groups.append((f"gpu-{gpu.index}-{part}", chunk))
    return device_groups


def _slice(
    node: str,
    suffix: str,
    *,
    pool: wire.ResourcePool,
    owner: wire.OwnerReference | None,
    shared_counters: list[wire.CounterSet] | None = None,
    devices: list[wire.Device] | None = None,
) -> wire.ResourceSlice:
    """One ResourceSlice of ``node``'s pool with ``shared_counters`` or ``devices``; the Node owns
    it when ``owner`` is given."""
    meta: wire.ObjectMeta = {
        "name": slice_name(node, suffix),
        "labels": {"app.kubernetes.io/managed-by": "instaslice"},
    }
    if owner is not None:
        meta["ownerReferences"] = [{**owner, "controller": True}]
    spec: wire.ResourceSliceSpec = {
        "driver": names.DRIVER_NAME,
        "pool": pool.copy(),
        "nodeName": node,
    }
    if shared_counters is not None:
        spec["sharedCounters"] = shared_counters
    if devices is not None:
        spec["devices"] = devices
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": spec,
    }


def _attr(device: SliceDevice, name: str) -> AttributeValue:
    value = device.attributes.get(name)
    if value is None:
        value = device.attributes.get(f"{names.DRIVER_NAME}/{name}")
    if value is None:
        raise ValueError(f"attribute {name!r} missing or malformed")
    return value


def _quantity_int(device: SliceDevice, name: str) -> int:
    capacity = device.capacity
    value = capacity.get(name) or capacity.get(f"{names.DRIVER_NAME}/{name}") or "0"
    suffixes = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    for suffix, factor in suffixes.items():
        if value.endswith(suffix):
            return int(value[: -len(suffix)]) * factor
    return int(value)


def complete_pools(slices: Iterable[Body]) -> dict[str, list[JsonObject]]:
    """Our slices (as read, or as ``build_pool`` made them) grouped by pool, keeping only each
    pool's newest generation, and only when all ``resourceSliceCount`` slices of it are present (a
    half-published pool is not trusted yet)."""
    by_pool: dict[str, list[SliceView]] = {}
    for obj in slices:
        view = SliceView.of(as_json(obj))
        if view.driver != names.DRIVER_NAME:
            continue
        by_pool.setdefault(view.pool, []).append(view)
    complete: dict[str, list[JsonObject]] = {}
    for pool, views in by_pool.items():
        newest = max(v.pool_generation for v in views)
        current = [v for v in views if v.pool_generation == newest]
        if len(current) >= current[0].pool_slice_count:
            complete[pool] = [v.raw for v in current]
    return complete


def parse_devices(pool_slices: Iterable[JsonObject]) -> list[PublishedDevice]:
    """The devices of one pool's slices (as returned by :func:`complete_pools`).

    Devices whose attributes are malformed are skipped: a slice we did not write must not break
    allocation for everyone else.
    """
    views = [SliceView.of(obj) for obj in pool_slices]
    prefix = names.COUNTER_MEMORY_SLICE_PREFIX
    sizes = {
        counter_set.name: sum(1 for k in counter_set.counters if k.startswith(prefix))
        for view in views
        for counter_set in view.shared_counters
    }
    devices: list[PublishedDevice] = []
    for view in views:
        for dev in view.devices:
            try:
                if not dev.name:
                    raise ValueError("device without a name")
                gpu_index = int(_attr(dev, names.ATTRIBUTE_GPU_INDEX))
                devices.append(
                    PublishedDevice(
                        node=view.node,
                        name=dev.name,
                        gpu_index=gpu_index,
                        parent_uuid=str(_attr(dev, names.ATTRIBUTE_PARENT_UUID)),
                        product_name=str(_attr(dev, names.ATTRIBUTE_PRODUCT_NAME)),
                        profile=str(_attr(dev, names.ATTRIBUTE_PROFILE)),
                        placement=Placement(
                            start=int(_attr(dev, names.ATTRIBUTE_PLACEMENT_START)),
                            size=int(_attr(dev, names.ATTRIBUTE_PLACEMENT_SIZE)),
                        ),
                        media_extensions=bool(_attr(dev, names.ATTRIBUTE_MEDIA_EXTENSIONS)),
                        memory_bytes=_quantity_int(dev, names.CAPACITY_MEMORY),
                        multiprocessors=_quantity_int(dev, names.CAPACITY_MULTIPROCESSORS),
                        memory_slices_total=sizes.get(counter_set_name(gpu_index), 0),
                        attributes=mapping(path(dev.raw, "attributes")),
                        capacity=mapping(path(dev.raw, "capacity")),
                        taints=device_taints(dev.taints),
                    )
                )
            except (TypeError, ValueError):
                continue
    return devices
