"""The template Node: what it carries, and that its bytes are Kubernetes' own protobuf encoding."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import json_format

from tests.autoscale.groups import NodeGroupSpec
from tests.autoscale.protos.k8s.api.core.v1 import generated_pb2 as core
from tests.autoscale.template import classic_capacity, node_bytes, template_node

GROUP_LABEL = "autoscale.instaslice.dev/node-group"

# ``Node.Marshal()`` of k8s.io/api v1.36.2 (Go) for this Node: name a100-template; labels
# autoscale.instaslice.dev/node-group=a100, kubernetes.io/hostname=a100-template,
# kubernetes.io/os=linux; providerID instaslice-test://a100-template; taint
# example.com/dedicated=gpu:NoSchedule; capacity = allocatable = cpu 2, memory 8Gi, pods 110,
# nvidia.com/mig-1g.5gb 7; condition Ready=True (KubeletReady), both times 2026-12-06T00:00:00Z;
# nodeInfo linux/amd64. Go writes every non-pointer field, empty ones included.
GO_NODE_BYTES = bytes.fromhex(
    "0a8e010a0d613130302d74656d706c61746512001a0022002a003200380042005a2b0a236175746f7363616c"
    "652e696e737461736c6963652e6465762f6e6f64652d67726f75701204613130305a270a166b756265726e65"
    "7465732e696f2f686f73746e616d65120d613130302d74656d706c6174655a190a106b756265726e65746573"
    "2e696f2f6f7312056c696e757812510a0012001a1f696e737461736c6963652d746573743a2f2f613130302d"
    "74656d706c61746520002a280a156578616d706c652e636f6d2f64656469636174656412036770751a0a4e6f"
    "5363686564756c651aef010a0a0a0363707512030a01320a0f0a066d656d6f727912050a033847690a1c0a15"
    "6e76696469612e636f6d2f6d69672d31672e35676212030a01370a0d0a04706f647312050a03313130120a0a"
    "0363707512030a0132120f0a066d656d6f727912050a03384769121c0a156e76696469612e636f6d2f6d6967"
    "2d31672e35676212030a0137120d0a04706f647312050a033131301a0022310a055265616479120454727565"
    "1a080880cbd2d806100022080880cbd2d80610002a0c4b7562656c65745265616479320032040a0208003a1e"
    "0a0012001a0022002a0032003a0042004a056c696e75785205616d643634"
)
GO_TIME_SECONDS = 1796515200  # 2026-12-06T00:00:00Z


def _meaningful(value: Any) -> Any:
    """A decoded message as a dict without empty fields: Go writes them, Python leaves them out,
    and both mean the same Node (JSON spells an int64 as a string: "0")."""
    if isinstance(value, dict):
        kept = {k: _meaningful(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in ("", "0", 0, False, {}, [], None)}
    if isinstance(value, list):
        return [_meaningful(v) for v in value]
    return value


def _as_dict(node: core.Node) -> Any:
    return _meaningful(json_format.MessageToDict(node))


def _same_node_built_here() -> core.Node:
    node = core.Node()
    node.metadata.name = "a100-template"
    node.metadata.labels[GROUP_LABEL] = "a100"
    node.metadata.labels["kubernetes.io/hostname"] = "a100-template"
    node.metadata.labels["kubernetes.io/os"] = "linux"
    node.spec.providerID = "instaslice-test://a100-template"
    taint = node.spec.taints.add()
    taint.key, taint.value, taint.effect = "example.com/dedicated", "gpu", "NoSchedule"
    for resource, quantity in {
        "cpu": "2",
        "memory": "8Gi",
        "pods": "110",
        "nvidia.com/mig-1g.5gb": "7",
    }.items():
        node.status.capacity[resource].string = quantity
        node.status.allocatable[resource].string = quantity
    ready = node.status.conditions.add()
    ready.type, ready.status, ready.reason = "Ready", "True", "KubeletReady"
    ready.lastHeartbeatTime.seconds = GO_TIME_SECONDS
    ready.lastTransitionTime.seconds = GO_TIME_SECONDS
    node.status.nodeInfo.operatingSystem = "linux"
    node.status.nodeInfo.architecture = "amd64"
    return node


def test_our_node_messages_read_what_go_writes_field_for_field() -> None:
    from_go = core.Node.FromString(GO_NODE_BYTES)
    assert _as_dict(from_go) == _as_dict(_same_node_built_here())
    # and what we write reads back the same (the field numbers are the only thing on the wire)
    ours = core.Node.FromString(node_bytes(_same_node_built_here()))
    assert _as_dict(ours) == _as_dict(from_go)


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        (
            "1xA100-40GB",
            {
                "nvidia.com/mig-1g.5gb": 7,
                "nvidia.com/mig-1g.5gb-me": 1,
                "nvidia.com/mig-1g.10gb": 4,
                "nvidia.com/mig-2g.10gb": 3,
                "nvidia.com/mig-3g.20gb": 2,
                "nvidia.com/mig-4g.20gb": 1,
                "nvidia.com/mig-7g.40gb": 1,
            },
        ),
        (
            "2xH100-80GB",
            {
                "nvidia.com/mig-1g.10gb": 14,
                "nvidia.com/mig-1g.10gb-me": 2,
                "nvidia.com/mig-1g.20gb": 8,
                "nvidia.com/mig-2g.20gb": 6,
                "nvidia.com/mig-3g.40gb": 4,
                "nvidia.com/mig-4g.40gb": 2,
                "nvidia.com/mig-7g.80gb": 2,
            },
        ),
    ],
    ids=["one-a100", "two-h100"],
)
def test_classic_capacity_is_what_the_shim_advertises(gpus: str, expected: dict[str, int]) -> None:
    assert classic_capacity(gpus) == expected


def test_template_carries_the_groups_labels_base_capacity_and_mig_resources() -> None:
    spec = NodeGroupSpec(
        id="h100", gpus="1xH100-80GB", min_size=0, max_size=2, labels={GROUP_LABEL: "h100"}
    )
    base = {"cpu": "2", "memory": "4022132Ki", "pods": "110"}
    node = core.Node.FromString(node_bytes(template_node(spec, base_capacity=base, classic=True)))
    assert node.metadata.name == "h100-template"
    assert dict(node.metadata.labels) == {
        GROUP_LABEL: "h100",
        "kubernetes.io/hostname": "h100-template",
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
    }
    capacity = {k: v.string for k, v in node.status.capacity.items()}
    assert capacity == {
        **base,
        **{k: str(v) for k, v in classic_capacity("1xH100-80GB").items()},
    }
    assert {k: v.string for k, v in node.status.allocatable.items()} == capacity
    assert [(c.type, c.status) for c in node.status.conditions] == [("Ready", "True")]
    assert not node.spec.taints

    without = template_node(spec, base_capacity=base, classic=False)
    assert {k: v.string for k, v in without.status.capacity.items()} == base
