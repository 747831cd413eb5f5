"""The Node a new instance of a node group would register: cluster-autoscaler's template (pure).

``NodeGroupTemplateNodeInfo`` answers with a ``v1.Node`` in Kubernetes' protobuf encoding (what Go's
``Node.Marshal`` writes; ``protos/k8s`` holds the messages). The autoscaler simulates pending pods on
copies of it when a group has no node to copy — at size 0, or while none of its nodes has been
Ready for a minute. The externalgrpc API carries that Node and nothing else: **no ResourceSlices**,
so on such a template the autoscaler's simulation finds no device for a pod with a DRA claim, and
the pod brings no node. The template holds what a node of the group would publish in its Node:

* the labels its kubelet sets (``kubernetes.io/hostname``, ``/os``, ``/arch``) and the group's own;
* capacity and allocatable: CPU, memory and pods as this machine's kubelets report them and,
  with ``classic``, one extended resource per MIG profile, ``nvidia.com/mig-<profile>``, counted
  as the plugin's classic shim advertises them for the group's GPUs
  (``kubeletplugin.deviceplugin.advertise.advertised_counts``). Those are what makes a group of size
  0 grow for classic requests: a pod asking ``nvidia.com/mig-1g.5gb: 1`` fits the template; on
  the real node kube-scheduler serves it through the DeviceClass's ``extendedResourceName``
  (scheduler mode) or the controller through a shadow claim (controller mode);
* a Ready condition.
"""

from __future__ import annotations

from collections.abc import Mapping

from api import names
from driver.gpu.emulated import EmulatedGpuBackend
from kubeletplugin.deviceplugin.advertise import advertised_counts
from kubeletplugin.node.inventory import build_inventory
from tests.autoscale.groups import NodeGroupSpec, provider_id
from tests.autoscale.protos.k8s.api.core.v1 import generated_pb2 as core

HOSTNAME_LABEL = "kubernetes.io/hostname"
OS_LABEL = "kubernetes.io/os"
ARCH_LABEL = "kubernetes.io/arch"


def classic_capacity(gpus: str) -> dict[str, int]:
    """``nvidia.com/mig-<profile>`` → how many the classic shim advertises on a node with ``gpus``
    (an ``--emulated-gpus`` spec): per GPU, the most instances of the profile it holds alone."""
    backend = EmulatedGpuBackend(node_name="template", spec=gpus)
    try:
        inventory = build_inventory(backend.gpus())
    finally:
        backend.close()
    return {
        names.classic_resource_name(profile): count
        for profile, count in sorted(advertised_counts(inventory).items())
    }


def template_node(
    spec: NodeGroupSpec,
    *,
    base_capacity: Mapping[str, str],
    classic: bool,
    arch: str = "amd64",
) -> core.Node:
    """The template Node of ``spec``'s group. ``base_capacity``: the kubelet's own resources
    (``cpu``, ``memory``, ``pods``... as quantities); ``classic``: add the shim's MIG resources."""
    name = f"{spec.id}-template"
    node = core.Node()
    node.metadata.name = name
    labels = {HOSTNAME_LABEL: name, OS_LABEL: "linux", ARCH_LABEL: arch, **spec.labels}
    for key, value in labels.items():
        node.metadata.labels[key] = value
    node.spec.providerID = provider_id(name)
    capacity = dict(base_capacity)
    if classic:
        capacity.update({k: str(v) for k, v in classic_capacity(spec.gpus).items()})
    for resource, quantity in capacity.items():
        node.status.capacity[resource].string = quantity
        node.status.allocatable[resource].string = quantity
    ready = node.status.conditions.add()
    ready.type = "Ready"
    ready.status = "True"
    ready.reason = "KubeletReady"
    node.status.nodeInfo.operatingSystem = "linux"
    node.status.nodeInfo.architecture = arch
    return node


def node_bytes(node: core.Node) -> bytes:
    """The Node as ``NodeGroupTemplateNodeInfoResponse.nodeBytes`` carries it (map entries in key
    order, as Go writes them)."""
    return node.SerializeToString(deterministic=True)
