"""A hypothetical cluster for capacity planning: ``20x8xA100-40GB,4x8xH100-80GB``.

Each group is nodes x GPUs per node x model (a catalog name, case-insensitive), within the limits
of ``instaslice.planning.limits`` (the fleet is built in memory, node by node). Nodes are named
``node-0000``, ``node-0001``… across groups in the order given, so first-fit fills the first group
first, as it would fill the alphabetically first nodes of a real cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from driver.errors import ConfigError
from driver.mig.catalog import gpu_model
from driver.mig.model import GpuModel
from driver.placement import Engine, GpuSpec, NodeSpec, Policy
from instaslice.planning.limits import MAX_FLEET_GPUS, MAX_FLEET_NODES, MAX_GPUS_PER_NODE

_GROUP = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*[xX]\s*([A-Za-z0-9][A-Za-z0-9.+-]*)\s*$")


@dataclass(frozen=True, slots=True)
class FleetGroup:
    nodes: int
    gpus_per_node: int
    model: GpuModel

    @property
    def text(self) -> str:
        return f"{self.nodes}x{self.gpus_per_node}x{self.model.name}"


@dataclass(frozen=True, slots=True)
class Fleet:
    """Node specs for the placement engine plus the few totals planning needs."""

    groups: tuple[FleetGroup, ...]
    nodes: tuple[NodeSpec, ...]

    @property
    def memory_slices(self) -> int:
        return sum(g.nodes * g.gpus_per_node * g.model.memory_slices for g in self.groups)

    @property
    def gpu_count(self) -> int:
        return sum(g.nodes * g.gpus_per_node for g in self.groups)

    @property
    def models(self) -> tuple[GpuModel, ...]:
        return tuple(dict.fromkeys(g.model for g in self.groups))

    @property
    def text(self) -> str:
        return ",".join(g.text for g in self.groups)

    def slices_of(self, profile: str) -> int | None:
        """Memory slices ``profile`` takes on the first model of the fleet that offers it."""
        for model in self.models:
            for candidate in model.profiles:
                if candidate.name == profile:
                    return candidate.memory_slices
        return None

    def most_on_one_gpu(self, profile: str) -> int:
        """The most instances of ``profile`` one GPU of the fleet holds (0: none offers it)."""
        return max(
            (p.max_count for m in self.models for p in m.profiles if p.name == profile), default=0
        )

    def profile_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.name for m in self.models for p in m.profiles))

    def engine(self, policy: str | Policy) -> Engine:
        """A placement engine holding the fleet's nodes, every GPU empty."""
        engine = Engine(policy=policy)
        for node in self.nodes:
            engine.set_node(node)
        return engine


def parse_fleet(text: str) -> Fleet:
    """``NODESxGPUSxMODEL[,…]``; ``ConfigError`` naming the bad group and why."""
    groups: list[FleetGroup] = []
    for part in text.split(","):
        if not part.strip():
            continue
        match = _GROUP.match(part)
        if match is None:
            raise ConfigError(
                f"GPU group {part.strip()!r} is not NODESxGPUSxMODEL (e.g. 20x8xA100-40GB)"
            )
        where = f"GPU group {part.strip()!r}"
        nodes = _bounded(match.group(1), most=MAX_FLEET_NODES, what=f"{where}: nodes")
        gpus = _bounded(match.group(2), most=MAX_GPUS_PER_NODE, what=f"{where}: GPUs per node")
        groups.append(FleetGroup(nodes=nodes, gpus_per_node=gpus, model=gpu_model(match.group(3))))
    if not groups:
        raise ConfigError("no GPUs given; write NODESxGPUSxMODEL[,…] (e.g. 20x8xA100-40GB)")
    total_nodes = sum(g.nodes for g in groups)
    if total_nodes > MAX_FLEET_NODES:
        raise ConfigError(f"the fleet has {total_nodes:,} nodes; at most {MAX_FLEET_NODES:,}")
    total_gpus = sum(g.nodes * g.gpus_per_node for g in groups)
    if total_gpus > MAX_FLEET_GPUS:
        raise ConfigError(f"the fleet has {total_gpus:,} GPUs; at most {MAX_FLEET_GPUS:,}")
    return fleet_of(groups)


def _bounded(digits: str, *, most: int, what: str) -> int:
    """``digits`` as a number from 1 to ``most``; the length is checked first, so that a thousand
    digits are refused without converting them."""
    value = int(digits) if len(digits) <= len(str(most)) else most + 1
    if not 1 <= value <= most:
        raise ConfigError(f"{what} must be from 1 to {most:,}, got {_shorten(digits)}")
    return value


def _shorten(digits: str) -> str:
    return digits if len(digits) <= 20 else f"{digits[:8]}… ({len(digits)} digits)"


def fleet_of(groups: list[FleetGroup]) -> Fleet:
    total = sum(g.nodes for g in groups)
    width = max(4, len(str(total - 1)))
    specs: list[NodeSpec] = []
    for group in groups:
        for _ in range(group.nodes):
            n = len(specs)
            name = f"node-{n:0{width}d}"
            gpus = tuple(
                GpuSpec(index=i, model=group.model, uuid=f"GPU-{name}-{i}")
                for i in range(group.gpus_per_node)
            )
            specs.append(NodeSpec(name=name, gpus=gpus))
    return Fleet(groups=tuple(groups), nodes=tuple(specs))
