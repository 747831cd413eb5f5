"""The test cloud provider over real gRPC, as cluster-autoscaler calls it, with a fake launcher."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import pytest

from tests.autoscale.groups import NodeGroups, NodeGroupSpec, provider_id
from tests.autoscale.protos.externalgrpc import externalgrpc_pb2 as pb
from tests.autoscale.protos.externalgrpc import externalgrpc_pb2_grpc as pb_grpc
from tests.autoscale.protos.k8s.api.core.v1 import generated_pb2 as core
from tests.autoscale.provider import START_FAILED, CloudProvider, ProviderServer
from tests.autoscale.template import node_bytes, template_node

WAIT_S = 10.0
CREATING = pb.InstanceStatus.instanceCreating
RUNNING = pb.InstanceStatus.instanceRunning
DELETING = pb.InstanceStatus.instanceDeleting


@dataclass
class FakeLauncher:
    """Starts and stops nothing; records the calls. A node in ``hold`` starts only once its
    event is set; a node in ``fail`` does not start."""

    started: list[tuple[str, str, str]] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    hold: dict[str, threading.Event] = field(default_factory=dict)
    fail: set[str] = field(default_factory=set)

    def start_node(self, *, node: str, group: NodeGroupSpec, provider_id: str) -> None:
        if node in self.hold:
            assert self.hold[node].wait(WAIT_S)
        self.started.append((node, group.id, provider_id))
        if node in self.fail:
            raise RuntimeError("kubelet did not register")

    def stop_node(self, *, node: str) -> None:
        self.stopped.append(node)


@dataclass
class Cloud:
    provider: CloudProvider
    launcher: FakeLauncher
    stub: pb_grpc.CloudProviderStub

    def nodes(self, group: str) -> dict[str, int]:
        response = self.stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=group))
        return {i.id: i.status.instanceState for i in response.instances}

    def settle(self) -> None:
        self.provider.wait_idle(timeout=WAIT_S)


@pytest.fixture
def cloud() -> Iterator[Cloud]:
    groups = NodeGroups(
        [
            NodeGroupSpec(id="a100", gpus="1xA100-40GB", min_size=0, max_size=3),
            NodeGroupSpec(id="h100", gpus="1xH100-80GB", min_size=0, max_size=1),
        ]
    )
    launcher = FakeLauncher()
    provider = CloudProvider(
        groups=groups,
        launcher=launcher,
        template=lambda spec: node_bytes(
            template_node(spec, base_capacity={"pods": "110"}, classic=True)
        ),
    )
    with ProviderServer(provider) as server, grpc.insecure_channel(server.address) as channel:
        yield Cloud(provider, launcher, pb_grpc.CloudProviderStub(channel))
        for event in launcher.hold.values():
            event.set()
        provider.close()


def _code(call: object) -> grpc.StatusCode:
    assert isinstance(call, grpc.RpcError)
    return call.code()


def test_lists_groups_and_tells_which_group_a_node_is_of(cloud: Cloud) -> None:
    groups = cloud.stub.NodeGroups(pb.NodeGroupsRequest()).nodeGroups
    assert [(g.id, g.minSize, g.maxSize) for g in groups] == [("a100", 0, 3), ("h100", 0, 1)]
    cloud.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="h100", delta=1))
    mine = pb.ExternalGrpcNode(providerID=provider_id("h100-1"), name="h100-1")
    assert cloud.stub.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=mine)).nodeGroup.id == "h100"
    stranger = pb.ExternalGrpcNode(providerID="", name="control-plane")
    assert cloud.stub.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=stranger)).nodeGroup.id == ""
    cloud.stub.Refresh(pb.RefreshRequest())
    cloud.stub.Cleanup(pb.CleanupRequest())


def test_increase_answers_at_once_and_the_node_runs_once_its_start_returns(cloud: Cloud) -> None:
    cloud.launcher.hold["a100-1"] = threading.Event()
    cloud.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="a100", delta=2))
    target = cloud.stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id="a100"))
    assert target.targetSize == 2
    assert cloud.nodes("a100")[provider_id("a100-1")] == CREATING
    cloud.launcher.hold["a100-1"].set()
    cloud.settle()
    assert cloud.nodes("a100") == {provider_id("a100-1"): RUNNING, provider_id("a100-2"): RUNNING}
    assert sorted(cloud.launcher.started) == [
        ("a100-1", "a100", provider_id("a100-1")),
        ("a100-2", "a100", provider_id("a100-2")),
    ]
    assert [(e.node, e.what) for e in cloud.provider.history() if e.node == "a100-1"] == [
        ("a100-1", "requested"),
        ("a100-1", "ready"),
    ]


@pytest.mark.parametrize(
    ("group", "delta", "code"),
    [
        ("a100", 4, grpc.StatusCode.INVALID_ARGUMENT),
        ("a100", 0, grpc.StatusCode.INVALID_ARGUMENT),
        ("gpu", 1, grpc.StatusCode.NOT_FOUND),
    ],
    ids=["over-max", "zero", "unknown-group"],
)
def test_increase_refusals_carry_their_status_code(
    cloud: Cloud, group: str, delta: int, code: grpc.StatusCode
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        cloud.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=group, delta=delta))
    assert _code(refused.value) is code
    assert cloud.launcher.started == []


def test_delete_lowers_the_target_at_once_and_stops_the_node(cloud: Cloud) -> None:
    cloud.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="a100", delta=2))
    cloud.settle()
    node = pb.ExternalGrpcNode(providerID=provider_id("a100-2"), name="a100-2")
    cloud.stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id="a100", nodes=[node]))
    target = cloud.stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id="a100"))
    assert target.targetSize == 1
    cloud.settle()
    assert cloud.launcher.stopped == ["a100-2"]
    assert cloud.nodes("a100") == {provider_id("a100-1"): RUNNING}
    # a node of another group is refused, and nothing is stopped
    other = pb.ExternalGrpcNode(providerID=provider_id("a100-1"), name="a100-1")
    with pytest.raises(grpc.RpcError) as refused:
        cloud.stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id="h100", nodes=[other]))
    assert _code(refused.value) is grpc.StatusCode.INVALID_ARGUMENT
    cloud.settle()
    assert cloud.launcher.stopped == ["a100-2"]


def test_a_node_deleted_while_it_starts_is_stopped_when_its_start_ends(cloud: Cloud) -> None:
    cloud.launcher.hold["a100-1"] = threading.Event()
    cloud.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="a100", delta=1))
    node = pb.ExternalGrpcNode(providerID=provider_id("a100-1"), name="a100-1")
    cloud.stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id="a100", nodes=[node]))
    assert cloud.nodes("a100") == {provider_id("a100-1"): DELETING}
    assert cloud.launcher.stopped == []
    cloud.launcher.hold["a100-1"].set()
    cloud.settle()
    assert cloud.launcher.stopped == ["a100-1"]
    assert cloud.nodes("a100") == {}


def test_a_failed_start_is_reported_with_its_error_and_stopped_when_deleted(cloud: Cloud) -> None:
    cloud.launcher.fail.add("h100-1")
    cloud.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="h100", delta=1))
    cloud.settle()
    (instance,) = cloud.stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id="h100")).instances
    assert instance.status.errorInfo.errorCode == START_FAILED
    assert "kubelet did not register" in instance.status.errorInfo.errorMessage
    node = pb.ExternalGrpcNode(providerID=instance.id, name="h100-1")
    cloud.stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id="h100", nodes=[node]))
    cloud.settle()
    assert cloud.launcher.stopped == ["h100-1"]
    assert cloud.nodes("h100") == {}


def test_decrease_target_gives_up_nodes_still_starting_only(cloud: Cloud) -> None:
    cloud.launcher.hold["a100-2"] = threading.Event()
    cloud.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="a100", delta=1))
    cloud.settle()
    cloud.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="a100", delta=1))
    with pytest.raises(grpc.RpcError) as refused:
        cloud.stub.NodeGroupDecreaseTargetSize(
            pb.NodeGroupDecreaseTargetSizeRequest(id="a100", delta=-2)
        )
    assert _code(refused.value) is grpc.StatusCode.INVALID_ARGUMENT
    cloud.stub.NodeGroupDecreaseTargetSize(
        pb.NodeGroupDecreaseTargetSizeRequest(id="a100", delta=-1)
    )
    assert cloud.stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id="a100")).targetSize == 1
    cloud.launcher.hold["a100-2"].set()
    cloud.settle()
    assert cloud.launcher.stopped == ["a100-2"]


def test_template_is_a_node_in_kubernetes_protobuf_and_optional_calls_are_unimplemented(
    cloud: Cloud,
) -> None:
    response = cloud.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id="a100"))
    node = core.Node.FromString(response.nodeBytes)
    assert node.metadata.name == "a100-template"
    assert node.status.allocatable["nvidia.com/mig-1g.5gb"].string == "7"
    with pytest.raises(grpc.RpcError) as missing:
        cloud.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id="gpu"))
    assert _code(missing.value) is grpc.StatusCode.NOT_FOUND
    for call in (
        lambda: cloud.stub.PricingPodPrice(pb.PricingPodPriceRequest()),
        lambda: cloud.stub.PricingNodePrice(pb.PricingNodePriceRequest()),
    ):
        with pytest.raises(grpc.RpcError) as unimplemented:
            call()
        assert _code(unimplemented.value) is grpc.StatusCode.UNIMPLEMENTED
    assert cloud.stub.GPULabel(pb.GPULabelRequest()).label
    assert not cloud.stub.GetAvailableGPUTypes(pb.GetAvailableGPUTypesRequest()).gpuTypes


def test_options_are_the_defaults_but_for_a_groups_own_scale_down_threshold(cloud: Cloud) -> None:
    defaults = pb.NodeGroupAutoscalingOptions(
        scaleDownUtilizationThreshold=0.5, scaleDownGpuUtilizationThreshold=0.5
    )
    defaults.scaleDownUnneededDuration.seconds = 600
    request = pb.NodeGroupAutoscalingOptionsRequest(id="a100", defaults=defaults)
    with pytest.raises(grpc.RpcError) as unimplemented:
        cloud.stub.NodeGroupGetOptions(request)
    assert _code(unimplemented.value) is grpc.StatusCode.UNIMPLEMENTED
    cloud.provider.groups.set_scale_down_utilization_threshold("a100", 1.0)
    options = cloud.stub.NodeGroupGetOptions(request).nodeGroupAutoscalingOptions
    assert options.scaleDownUtilizationThreshold == 1.0
    assert options.scaleDownGpuUtilizationThreshold == 0.5
    assert options.scaleDownUnneededDuration.seconds == 600
    with pytest.raises(grpc.RpcError) as missing:
        cloud.stub.NodeGroupGetOptions(pb.NodeGroupAutoscalingOptionsRequest(id="gpu"))
    assert _code(missing.value) is grpc.StatusCode.NOT_FOUND
