"""The test cloud provider: cluster-autoscaler's ``externalgrpc`` service over our node groups.

cluster-autoscaler (built with only the externalgrpc provider) asks over gRPC which node groups
exist, which group a Node belongs to, each group's target size and instances, a template Node per
group, and to grow or shrink a group. This servicer answers from :class:`NodeGroups` and hands the
real work to a :class:`NodeLauncher` — on the real stack a kubelet and our kubelet plugin per node
(``tests/autoscale/launcher.py``), in unit tests a fake.

Growing and shrinking return at once, as a cloud's API does (cluster-autoscaler calls with a
few-second deadline): the target size changes under the lock, and the node starts or stops on a
worker thread. ``NodeGroupNodes`` shows each instance creating, running or deleting meanwhile, and a
start that failed with its error (the autoscaler then backs the group off and deletes the
instance). A node whose deletion is asked while it is still starting is stopped once its start
ends. Every step is kept with its time (:meth:`CloudProvider.history`): the nodes-over-time figure.

Pricing and GPU types are not offered: ``UNIMPLEMENTED``, which the autoscaler takes as "use the
defaults"; so are a group's options unless it has its own scale-down utilization threshold, which
``NodeGroupGetOptions`` then returns with the autoscaler's defaults for everything else.
``GPULabel`` names a label no node has, so the autoscaler's own GPU handling (``nvidia.com/gpu``)
leaves our nodes alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import NoReturn, Protocol

import grpc

from tests.autoscale.groups import (
    Instance,
    InstanceState,
    NodeGroupError,
    NodeGroups,
    NodeGroupSpec,
)
from tests.autoscale.protos.externalgrpc import externalgrpc_pb2 as pb
from tests.autoscale.protos.externalgrpc import externalgrpc_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

OTHER_ERROR_CLASS = 99
"""cluster-autoscaler's ``cloudprovider.OtherErrorClass`` (1 is ``OutOfResourcesErrorClass``)."""
START_FAILED = "NodeStartFailed"
_STATES = {
    InstanceState.CREATING: pb.InstanceStatus.instanceCreating,
    InstanceState.RUNNING: pb.InstanceStatus.instanceRunning,
    InstanceState.DELETING: pb.InstanceStatus.instanceDeleting,
    InstanceState.FAILED: pb.InstanceStatus.instanceCreating,
}


class NodeLauncher(Protocol):
    def start_node(self, *, node: str, group: NodeGroupSpec, provider_id: str) -> None:
        """Bring the node up; return once it is Ready and serves its GPUs, raise if it cannot."""

    def stop_node(self, *, node: str) -> None:
        """Stop what runs for the node and delete its Node; return once it is gone. Called for
        nodes whose start failed too (whatever part of them runs)."""


TemplateSource = Callable[[NodeGroupSpec], bytes]
"""A group's template Node, as ``nodeBytes`` (``tests/autoscale/template.py``)."""


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """One step of one node: ``requested``, ``ready``, ``failed``, ``deleting``, ``gone``."""

    at: float
    """``time.monotonic()`` seconds."""
    group: str
    node: str
    what: str


class CloudProvider(pb_grpc.CloudProviderServicer):
    """The servicer; ``close`` waits for the node starts and stops in flight."""

    def __init__(
        self,
        *,
        groups: NodeGroups,
        launcher: NodeLauncher,
        template: TemplateSource,
        gpu_label: str = "autoscale.instaslice.dev/no-such-label",
        workers: int = 4,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.groups = groups
        self._launcher = launcher
        self._template = template
        self._gpu_label = gpu_label
        self._clock = clock
        self._work = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="node")
        self._history_lock = threading.Lock()
        self._history: list[NodeEvent] = []
        self._pending: set[futures.Future[None]] = set()

    # --- for tests: grow a group without the autoscaler, read what happened --------------------

    def increase(self, group: str, delta: int) -> list[Instance]:
        """What ``NodeGroupIncreaseSize`` does; ``NodeGroupError`` when refused."""
        added = self.groups.increase(group, delta)
        logger.info("node group %s: +%s -> %s", group, delta, [i.node for i in added])
        for instance in added:
            self._record(instance, "requested")
            self._submit(self._start, instance)
        return added

    def history(self) -> list[NodeEvent]:
        with self._history_lock:
            return list(self._history)

    def wait_idle(self, *, timeout: float) -> None:
        """Until no node start or stop is in flight; ``TimeoutError`` otherwise."""
        with self._history_lock:
            pending = set(self._pending)
        _, not_done = futures.wait(pending, timeout=timeout)
        if not_done:
            raise TimeoutError(f"{len(not_done)} node starts/stops still running")

    def close(self) -> None:
        self._work.shutdown(wait=True)

    # --- CloudProvider RPCs -------------------------------------------------------------------

    def NodeGroups(
        self, request: pb.NodeGroupsRequest, context: grpc.ServicerContext
    ) -> pb.NodeGroupsResponse:
        return pb.NodeGroupsResponse(nodeGroups=[_group(s) for s in self.groups.specs()])

    def NodeGroupForNode(
        self, request: pb.NodeGroupForNodeRequest, context: grpc.ServicerContext
    ) -> pb.NodeGroupForNodeResponse:
        spec = self.groups.group_of(provider_id=request.node.providerID, node=request.node.name)
        # an empty id: a node of no group, which the autoscaler leaves alone
        return pb.NodeGroupForNodeResponse(
            nodeGroup=_group(spec) if spec is not None else pb.NodeGroup()
        )

    def PricingNodePrice(
        self, request: pb.PricingNodePriceRequest, context: grpc.ServicerContext
    ) -> pb.PricingNodePriceResponse:
        _unimplemented(context, "pricing")

    def PricingPodPrice(
        self, request: pb.PricingPodPriceRequest, context: grpc.ServicerContext
    ) -> pb.PricingPodPriceResponse:
        _unimplemented(context, "pricing")

    def GPULabel(
        self, request: pb.GPULabelRequest, context: grpc.ServicerContext
    ) -> pb.GPULabelResponse:
        return pb.GPULabelResponse(label=self._gpu_label)

    def GetAvailableGPUTypes(
        self, request: pb.GetAvailableGPUTypesRequest, context: grpc.ServicerContext
    ) -> pb.GetAvailableGPUTypesResponse:
        return pb.GetAvailableGPUTypesResponse()

    def Cleanup(
        self, request: pb.CleanupRequest, context: grpc.ServicerContext
    ) -> pb.CleanupResponse:
        return pb.CleanupResponse()

    def Refresh(
        self, request: pb.RefreshRequest, context: grpc.ServicerContext
    ) -> pb.RefreshResponse:
        return pb.RefreshResponse()

    def NodeGroupTargetSize(
        self, request: pb.NodeGroupTargetSizeRequest, context: grpc.ServicerContext
    ) -> pb.NodeGroupTargetSizeResponse:
        try:
            return pb.NodeGroupTargetSizeResponse(targetSize=self.groups.target_size(request.id))
        except NodeGroupError as exc:
            _refuse(context, exc)

    def NodeGroupIncreaseSize(
        self, request: pb.NodeGroupIncreaseSizeRequest, context: grpc.ServicerContext
    ) -> pb.NodeGroupIncreaseSizeResponse:
        try:
            self.increase(request.id, request.delta)
        except NodeGroupError as exc:
            _refuse(context, exc)
        return pb.NodeGroupIncreaseSizeResponse()

    def NodeGroupDeleteNodes(
        self, request: pb.NodeGroupDeleteNodesRequest, context: grpc.ServicerContext
    ) -> pb.NodeGroupDeleteNodesResponse:
        nodes = [(n.providerID, n.name) for n in request.nodes]
        try:
            leaving = self.groups.delete(request.id, nodes)
        except NodeGroupError as exc:
            _refuse(context, exc)
        logger.info("node group %s: delete %s", request.id, [i.node for i in leaving])
        for instance in leaving:
            self._record(instance, "deleting")
            if instance.state is not InstanceState.CREATING:  # a start in flight stops after it
                self._submit(self._stop, instance)
        return pb.NodeGroupDeleteNodesResponse()

    def NodeGroupDecreaseTargetSize(
        self, request: pb.NodeGroupDecreaseTargetSizeRequest, context: grpc.ServicerContext
    ) -> pb.NodeGroupDecreaseTargetSizeResponse:
        try:
            dropped = self.groups.decrease_target(request.id, request.delta)
        except NodeGroupError as exc:
            _refuse(context, exc)
        logger.info("node group %s: dropped %s", request.id, [i.node for i in dropped])
        for instance in dropped:
            self._record(instance, "deleting")
        return pb.NodeGroupDecreaseTargetSizeResponse()

    def NodeGroupNodes(
        self, request: pb.NodeGroupNodesRequest, context: grpc.ServicerContext
    ) -> pb.NodeGroupNodesResponse:
        try:
            instances = self.groups.instances(request.id)
        except NodeGroupError as exc:
            _refuse(context, exc)
        return pb.NodeGroupNodesResponse(instances=[_instance(i) for i in instances])

    def NodeGroupTemplateNodeInfo(
        self, request: pb.NodeGroupTemplateNodeInfoRequest, context: grpc.ServicerContext
    ) -> pb.NodeGroupTemplateNodeInfoResponse:
        try:
            spec = self.groups.spec(request.id)
        except NodeGroupError as exc:
            _refuse(context, exc)
        return pb.NodeGroupTemplateNodeInfoResponse(nodeBytes=self._template(spec))

    def NodeGroupGetOptions(
        self, request: pb.NodeGroupAutoscalingOptionsRequest, context: grpc.ServicerContext
    ) -> pb.NodeGroupAutoscalingOptionsResponse:
        try:
            spec = self.groups.spec(request.id)
        except NodeGroupError as exc:
            _refuse(context, exc)
        if spec.scale_down_utilization_threshold is None:
            _unimplemented(context, f"options of node group {spec.id}")  # the defaults apply
        options = pb.NodeGroupAutoscalingOptions()
        options.CopyFrom(request.defaults)  # what is not overridden must be sent back as it came
        options.scaleDownUtilizationThreshold = spec.scale_down_utilization_threshold
        return pb.NodeGroupAutoscalingOptionsResponse(nodeGroupAutoscalingOptions=options)

    # --- the work behind them -----------------------------------------------------------------

    def _start(self, instance: Instance) -> None:
        spec = self.groups.spec(instance.group)
        try:
            self._launcher.start_node(
                node=instance.node, group=spec, provider_id=instance.provider_id
            )
        except Exception as exc:  # a node that did not come up is reported, never raised
            logger.exception("node %s did not start", instance.node)
            now = self.groups.failed(instance.node, f"{type(exc).__name__}: {exc}")
            self._record(instance, "failed")
        else:
            now = self.groups.started(instance.node)
            self._record(instance, "ready")
        if now is not None and now.state is InstanceState.DELETING:
            self._stop(now)

    def _stop(self, instance: Instance) -> None:
        try:
            self._launcher.stop_node(node=instance.node)
        except Exception:  # left deleting: the leak checks see it, the autoscaler may ask again
            logger.exception("node %s did not stop", instance.node)
            return
        self.groups.gone(instance.node)
        self._record(instance, "gone")

    def _submit(self, work: Callable[[Instance], None], instance: Instance) -> None:
        future = self._work.submit(work, instance)
        with self._history_lock:
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: futures.Future[None]) -> None:
        with self._history_lock:
            self._pending.discard(future)

    def _record(self, instance: Instance, what: str) -> None:
        with self._history_lock:
            self._history.append(NodeEvent(self._clock(), instance.group, instance.node, what))


def _group(spec: NodeGroupSpec) -> pb.NodeGroup:
    return pb.NodeGroup(
        id=spec.id, minSize=spec.min_size, maxSize=spec.max_size, debug=f"{spec.id}: {spec.gpus}"
    )


def _instance(instance: Instance) -> pb.Instance:
    status = pb.InstanceStatus(instanceState=_STATES[instance.state])
    if instance.state is InstanceState.FAILED:
        status.errorInfo.errorCode = START_FAILED
        status.errorInfo.errorMessage = instance.error
        status.errorInfo.instanceErrorClass = OTHER_ERROR_CLASS
    return pb.Instance(id=instance.provider_id, status=status)


def _refuse(context: grpc.ServicerContext, exc: NodeGroupError) -> NoReturn:
    code = grpc.StatusCode.NOT_FOUND if exc.not_found else grpc.StatusCode.INVALID_ARGUMENT
    context.abort(code, str(exc))
    raise AssertionError("context.abort returned")  # it raises; this keeps the type checker sure


def _unimplemented(context: grpc.ServicerContext, what: str) -> NoReturn:
    context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{what} is not offered")
    raise AssertionError("context.abort returned")


class ProviderServer:
    """The servicer on a loopback port (``address``: what cluster-autoscaler's cloud config
    names); a context manager."""

    def __init__(self, provider: CloudProvider, *, host: str = "127.0.0.1") -> None:
        self.provider = provider
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_CloudProviderServicer_to_server(provider, self._server)
        port = self._server.add_insecure_port(f"{host}:0")
        self.address = f"{host}:{port}"

    def start(self) -> ProviderServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=2).wait()

    def __enter__(self) -> ProviderServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
