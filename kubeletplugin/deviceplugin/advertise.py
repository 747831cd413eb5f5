"""How many device-plugin devices each classic resource advertises, and why (pure).

The kubelet's admission and kube-scheduler's ``NodeResourcesFit`` count device-plugin devices: a pod
asking ``nvidia.com/mig-1g.5gb: 2`` is refused on a node advertising fewer than two free ones. They
are not what decides where a slice goes — the controller's gate and its placement (shadow claims
pinned to a node) are — so the count only has to be **never smaller than what the controller may
place here**, and stable, because changing a node's capacity is slow (node status updates every
10 s), and a capacity that moves under the kubelet is what made the public InstaSlice's device
plugin fail admissions again and again.

Choice: per GPU, the most instances of the profile that GPU can hold at once *if it held nothing
else* — the largest set of its placements that do not overlap, capped by the profile's
``max_count`` and by one instance with media extensions per GPU — summed over the node's MIG-enabled
GPUs. An A100-40GB advertises 7 ``1g.5gb``, 3 ``2g.10gb`` (starts 0, 2, 4; the 4th would overlap
the 7-slice limit), 2 ``3g.20gb``, 1 ``1g.5gb+me``. Mixed profiles share the GPU, so the sum over
all resources overstates the node; that is harmless, because every ``Allocate`` must be backed by a
shadow claim the controller placed, and a pod without one is refused there.

Device ids are opaque slot numbers (``1g-5gb-0`` … ``1g-5gb-13``), not placements: which slice a
container gets is decided by its shadow claim, not by the id the kubelet picked. Ids are stable
across plugin restarts, so the kubelet's own checkpoint of which pod holds which id stays valid.
"""

from collections.abc import Iterable, Sequence

from driver.mig.model import MigProfile, Placement
from kubeletplugin.deviceplugin.resources import ResourceSpec
from kubeletplugin.node.inventory import NodeInventory


def max_disjoint(placements: Iterable[Placement]) -> int:
    """Size of the largest set of pairwise non-overlapping placements (interval scheduling)."""
    count = 0
    end = -1
    for placement in sorted(placements, key=lambda p: (p.end, p.start)):
        if placement.start >= end:
            count += 1
            end = placement.end
    return count


def per_gpu_capacity(profile: MigProfile) -> int:
    """The most instances of ``profile`` one GPU holds with nothing else on it."""
    capacity = min(max_disjoint(profile.placements), profile.max_count)
    if profile.media_extensions:
        capacity = min(capacity, 1)
    return max(capacity, 0)


def advertised_counts(inventory: NodeInventory) -> dict[str, int]:
    """Profile name → number of devices to advertise, over the node's MIG-enabled GPUs."""
    counts: dict[str, int] = {}
    for gpu in inventory.gpus:
        for profile in gpu.profiles:
            counts[profile.name] = counts.get(profile.name, 0) + per_gpu_capacity(profile)
    return {name: count for name, count in counts.items() if count > 0}


def device_ids(spec: ResourceSpec, count: int) -> tuple[str, ...]:
    """The ``count`` device ids of ``spec``'s resource, in order."""
    return tuple(f"{spec.device_id_prefix}{n}" for n in range(count))


def slot_number(spec: ResourceSpec, device_id: str) -> int | None:
    """The slot number of one of ``spec``'s ids; None if the id is not of that form."""
    if not device_id.startswith(spec.device_id_prefix):
        return None
    tail = device_id[len(spec.device_id_prefix) :]
    return int(tail) if tail.isdigit() and (tail == "0" or not tail.startswith("0")) else None


def unknown_ids(spec: ResourceSpec, count: int, ids: Sequence[str]) -> list[str]:
    """The ids among ``ids`` that this resource does not advertise now."""
    return [i for i in ids if (n := slot_number(spec, i)) is None or n >= count]
