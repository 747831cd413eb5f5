"""This node's MIG inventory: what the publisher advertises and how prepare reads device names back.

Device names in ResourceSlices are DNS labels (``gpu-0-1g-5gb-me-0``), which lose the ``.`` and
``+`` of profile names, so a name cannot be parsed back reliably. Both the publisher and
``DeviceState`` use the same table built here from the GPU backend: the publisher publishes exactly
its devices, and prepare maps an allocated device name back to the (GPU, profile, placement) it was
published for. A GPU without MIG mode (or whose profiles the backend cannot read) offers nothing.

An unhealthy GPU (``GpuInfo.healthy`` False) with MIG mode is published with a taint on each of its
devices (``tainted_gpus``; the publisher adds the taints), so allocators leave it alone while
everyone can see why; its devices stay in the name table like any other: claims prepared on it
before, or allocated to it just before it turned unhealthy, still resolve, so that a repeated
prepare answers from the checkpoint, recovery keeps their slices, and unprepare frees them. Tainting
a GPU never destroys what runs on it. ``gpus`` (what the classic shim advertises) holds only the
healthy ones.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from driver.errors import NotFoundError
from driver.gpu.backend import GpuInfo
from driver.ids import GpuUuid
from driver.mig.model import MigProfile, Placement
from driver.mig.naming import device_name
from driver.resourceslices import GpuInventory


@dataclass(frozen=True, slots=True)
class InventoryDevice:
    """One published device: a slice that could be created on this node."""

    name: str
    gpu_index: int
    gpu_uuid: GpuUuid
    gpu_minor: int | None
    profile: MigProfile
    placement: Placement


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """The GPUs we publish, the GPUs we cannot (MIG mode off), the GPUs we withhold (unhealthy),
    and the device-name table."""

    gpus: tuple[GpuInventory, ...] = ()
    """Healthy GPUs with MIG mode on: published untainted."""
    non_mig_gpus: tuple[GpuInfo, ...] = ()
    """Healthy GPUs without MIG mode."""
    devices: Mapping[str, InventoryDevice] = field(default_factory=lambda: MappingProxyType({}))
    """Every device of the published *and* the unhealthy MIG GPUs (see the module docstring)."""
    unhealthy_gpus: tuple[GpuInfo, ...] = ()
    """GPUs the backend reports unhealthy, with or without MIG mode."""
    tainted_gpus: tuple[GpuInventory, ...] = ()
    """Unhealthy GPUs with MIG mode on: published with a taint on every device."""

    @property
    def published_device_count(self) -> int:
        """How many devices the healthy published GPUs offer (the tainted ones' not counted)."""
        published = {gpu.index for gpu in self.gpus}
        return sum(1 for device in self.devices.values() if device.gpu_index in published)

    @property
    def tainted_device_count(self) -> int:
        tainted = {gpu.index for gpu in self.tainted_gpus}
        return sum(1 for device in self.devices.values() if device.gpu_index in tainted)

    def device(self, name: str) -> InventoryDevice:
        """The device published as ``name`` (or withheld, its GPU unhealthy); ``NotFoundError``
        if this node never published it."""
        try:
            return self.devices[name]
        except KeyError:
            raise NotFoundError(
                f"device {name!r} is not in this node's inventory "
                f"({len(self.devices)} devices on {len(self.gpus)} MIG-enabled GPUs)"
            ) from None


def build_inventory(gpus: Iterable[GpuInfo]) -> NodeInventory:
    """The inventory of the GPUs the backend reports now (pure)."""
    published: list[GpuInventory] = []
    tainted: list[GpuInventory] = []
    non_mig: list[GpuInfo] = []
    unhealthy: list[GpuInfo] = []
    devices: dict[str, InventoryDevice] = {}
    for gpu in sorted(gpus, key=lambda g: g.index):
        if not gpu.healthy:
            unhealthy.append(gpu)
        if not gpu.mig_enabled or gpu.model is None:
            if gpu.healthy:
                non_mig.append(gpu)
            continue
        (published if gpu.healthy else tainted).append(
            GpuInventory(
                index=gpu.index,
                uuid=gpu.uuid,
                product_name=gpu.product_name,
                memory_slices=gpu.model.memory_slices,
                profiles=gpu.model.profiles,
            )
        )
        for profile in gpu.model.profiles:
            for placement in profile.placements:
                name = device_name(gpu_index=gpu.index, profile=profile.name, start=placement.start)
                devices[name] = InventoryDevice(
                    name=name,
                    gpu_index=gpu.index,
                    gpu_uuid=gpu.uuid,
                    gpu_minor=gpu.minor,
                    profile=profile,
                    placement=placement,
                )
    return NodeInventory(
        gpus=tuple(published),
        non_mig_gpus=tuple(non_mig),
        devices=MappingProxyType(devices),
        unhealthy_gpus=tuple(unhealthy),
        tainted_gpus=tuple(tainted),
    )
