"""The names InstaSlice puts on Kubernetes objects: one place, so every component agrees."""

import hashlib
from typing import Final

DRIVER_NAME: Final = "mig.instaslice.dev"
"""DRA driver name; also the attribute domain of our devices."""

DEVICE_CLASS_ANY: Final = "mig.instaslice.dev"
"""DeviceClass matching any MIG slice our driver publishes."""

DEVICE_CLASS_SUFFIX: Final = ".instaslice.dev"
"""Per-profile DeviceClasses are named ``mig-<profile>.instaslice.dev`` (e.g. ``mig-1g.5gb…``)."""

SCHEDULING_GATE: Final = "instaslice.dev/placement"
"""Added by our webhook; removed by the controller once every claim of the pod is allocated."""

PLACEMENT_CONDITION: Final = "instaslice.dev/Placement"
"""Pod condition type saying whether (and why not) the pod's slices could be placed."""

CLASSIC_RESOURCE_PREFIX: Final = "nvidia.com/mig-"
"""Classic extended resources served by the device-plugin shim: ``nvidia.com/mig-<profile>``."""

CDI_KIND: Final = "instaslice.dev/mig"
"""CDI kind (vendor/class) of the specs the kubelet plugin writes."""

DELETE_PROTECTION_FINALIZER: Final = "resource.kubernetes.io/delete-protection"
"""Finalizer kube-scheduler puts on claims before allocating them (docs/design.md F3)."""

SHADOW_CLAIM_LABEL: Final = "instaslice.dev/shadow-for-pod"
"""Label on shadow claims: the UID of the classic pod the claim stands for."""

SHADOW_CLAIM_PROFILE_LABEL: Final = "instaslice.dev/profile"
"""Label on shadow claims: the MIG profile name of the classic request."""

SHADOW_CLAIM_CONTAINER_ANNOTATION: Final = "instaslice.dev/container"
"""Annotation on shadow claims: the container whose classic request the claim serves."""

LEADER_LEASE_NAME: Final = "instaslice-controller"
SHIM_LEASE_PREFIX: Final = "instaslice-shim-"
"""Lease ``instaslice-shim-<node>`` (namespace ``SYSTEM_NAMESPACE``): held while the node's
device-plugin shim serves, released when it stops (the controller places classic pods by it)."""
SHIM_LEASE_LABEL: Final = "instaslice.dev/classic-shim"
"""Label on shim leases; its value is the node name when that fits a label value."""
SHIM_LEASE_NODE_ANNOTATION: Final = "instaslice.dev/node"
HOLD_ANNOTATION: Final = "instaslice.dev/hold"
"""On a gated pod: the GPUs held for it (a reservation or a preemption's room), so that a new
leader restores the hold (``controller/allocation/holds.py``)."""
SYSTEM_NAMESPACE: Final = "instaslice-system"

RESOURCE_SLICE_NAME_PREFIX: Final = "instaslice"

ATTRIBUTE_PROFILE: Final = "profile"
ATTRIBUTE_GPU_INDEX: Final = "gpuIndex"
ATTRIBUTE_PARENT_UUID: Final = "parentUUID"
ATTRIBUTE_PRODUCT_NAME: Final = "productName"
ATTRIBUTE_PLACEMENT_START: Final = "placementStart"
ATTRIBUTE_PLACEMENT_SIZE: Final = "placementSize"
ATTRIBUTE_MEMORY_SLICES: Final = "memorySlices"
ATTRIBUTE_COMPUTE_SLICES: Final = "computeSlices"
ATTRIBUTE_MEDIA_EXTENSIONS: Final = "mediaExtensions"
CAPACITY_MEMORY: Final = "memory"
CAPACITY_MULTIPROCESSORS: Final = "multiprocessors"

COUNTER_MEMORY_SLICE_PREFIX: Final = "memory-slice-"
COUNTER_MEDIA_EXTENSIONS: Final = "media-extensions"


def profile_device_class(profile: str) -> str:
    """DeviceClass name for one MIG profile, e.g. ``mig-1g.5gb.instaslice.dev``.

    ``+`` is not allowed in object names, so ``1g.5gb+me`` becomes ``mig-1g.5gb-me…``.
    """
    return "mig-" + profile.replace("+", "-") + DEVICE_CLASS_SUFFIX


def classic_resource_name(profile: str, *, prefix: str = CLASSIC_RESOURCE_PREFIX) -> str:
    """Extended-resource name for a profile, e.g. ``nvidia.com/mig-1g.5gb``.

    The name part of an extended resource must be a qualified name (alphanumerics, ``-``, ``_``,
    ``.``), so ``+`` is spelled ``-`` as NVIDIA's own device plugin does (``mig-1g.5gb-me``).
    """
    return prefix + profile.replace("+", "-")


def is_our_device_class_name(name: str) -> bool:
    """Classes named in our domain (``mig.instaslice.dev``, ``mig-1g.5gb.instaslice.dev``, ...)
    are ours even before they exist: a pod naming one waits for it instead of being let go."""
    return name == DEVICE_CLASS_ANY or name.endswith(DEVICE_CLASS_SUFFIX)


def shim_lease_name(node: str) -> str:
    """The shim lease of ``node`` (a DNS subdomain: long node names are shortened with a hash)."""
    name = SHIM_LEASE_PREFIX + node
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:16]
    return f"{name[: 253 - 17]}-{digest}"
