"""The DRA node service (``DRAPlugin``), one servicer for both API versions the kubelet may speak.

The v1 and v1beta1 protos differ only in their package and in v1's ``Device.share_id`` (which we
never set): one ``DraService`` is registered for both, answers each request with the messages of
the version it came in, converts to ``kubeletplugin.model`` and delegates to one ``ClaimPreparer``. Failures are reported per claim
inside the response map; the RPC itself fails only if the request is malformed. Even a bug in the
core is turned into a per-claim error for every claim of the call, so one bad claim cannot fail the
others, and every claim asked about gets an entry (the kubelet retries the missing).
"""

import logging
import time
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import TypeVar, overload

import grpc

from driver.ids import ClaimUid
from kubeletplugin.metrics import PluginMetrics
from kubeletplugin.model import ClaimPreparer, ClaimRef, PrepareResult
from protos.dra.v1 import api_pb2 as v1
from protos.dra.v1 import api_pb2_grpc as v1_grpc
from protos.dra.v1beta1 import api_pb2 as v1beta1
from protos.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc

logger = logging.getLogger(__name__)

_ClaimMessage = v1.Claim | v1beta1.Claim
_PrepareRequest = v1.NodePrepareResourcesRequest | v1beta1.NodePrepareResourcesRequest
_PrepareResponse = v1.NodePrepareResourcesResponse | v1beta1.NodePrepareResourcesResponse
_UnprepareRequest = v1.NodeUnprepareResourcesRequest | v1beta1.NodeUnprepareResourcesRequest
_UnprepareResponse = v1.NodeUnprepareResourcesResponse | v1beta1.NodeUnprepareResourcesResponse
_T = TypeVar("_T")


def claim_refs(claims: Iterable[_ClaimMessage]) -> list[ClaimRef]:
    return [ClaimRef(uid=ClaimUid(c.uid), namespace=c.namespace, name=c.name) for c in claims]


def _prepare(preparer: ClaimPreparer, refs: list[ClaimRef]) -> dict[str, PrepareResult]:
    if not refs:
        return {}
    try:
        results = preparer.prepare(refs)
    except Exception as exc:
        logger.exception("prepare failed for %d claim(s)", len(refs))
        return {ref.uid: PrepareResult(error=f"internal error: {exc}") for ref in refs}
    return _complete({ref.uid for ref in refs}, results, missing=PrepareResult(error="no result"))


def _unprepare(preparer: ClaimPreparer, refs: list[ClaimRef]) -> dict[str, str]:
    if not refs:
        return {}
    try:
        results = preparer.unprepare(refs)
    except Exception as exc:
        logger.exception("unprepare failed for %d claim(s)", len(refs))
        return {ref.uid: f"internal error: {exc}" for ref in refs}
    return _complete({ref.uid for ref in refs}, results, missing="no result")


def _complete(uids: set[str], results: Mapping[ClaimUid, _T], *, missing: _T) -> dict[str, _T]:
    return {uid: results.get(ClaimUid(uid), missing) for uid in uids}


class DraService(v1_grpc.DRAPluginServicer, v1beta1_grpc.DRAPluginServicer):
    """``DRAPlugin`` in both versions: each answer is built from the request's own version's
    messages (``protos.dra.v1.api_pb2`` or ``protos.dra.v1beta1.api_pb2``)."""

    def __init__(self, preparer: ClaimPreparer, metrics: PluginMetrics | None = None) -> None:
        self._preparer = preparer
        self._metrics = metrics

    @overload
    def NodePrepareResources(
        self, request: v1.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1.NodePrepareResourcesResponse: ...
    @overload
    def NodePrepareResources(
        self, request: v1beta1.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1beta1.NodePrepareResourcesResponse: ...
    def NodePrepareResources(  # noqa: N802 - gRPC method name
        self, request: _PrepareRequest, context: grpc.ServicerContext
    ) -> _PrepareResponse:
        started = time.monotonic()
        try:
            results = _prepare(self._preparer, claim_refs(request.claims))
        finally:
            self._rpc_done("NodePrepareResources", started)
        api = _api_of(request)
        response: _PrepareResponse = api.NodePrepareResourcesResponse(
            claims={
                uid: api.NodePrepareResourceResponse(
                    error=result.error,
                    devices=[
                        api.Device(
                            request_names=list(d.request_names),
                            pool_name=d.pool_name,
                            device_name=d.device_name,
                            cdi_device_ids=list(d.cdi_device_ids),
                        )
                        for d in result.devices
                    ],
                )
                for uid, result in results.items()
            }
        )
        return response

    @overload
    def NodeUnprepareResources(
        self, request: v1.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1.NodeUnprepareResourcesResponse: ...
    @overload
    def NodeUnprepareResources(
        self, request: v1beta1.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1beta1.NodeUnprepareResourcesResponse: ...
    def NodeUnprepareResources(  # noqa: N802 - gRPC method name
        self, request: _UnprepareRequest, context: grpc.ServicerContext
    ) -> _UnprepareResponse:
        started = time.monotonic()
        try:
            errors = _unprepare(self._preparer, claim_refs(request.claims))
        finally:
            self._rpc_done("NodeUnprepareResources", started)
        api = _api_of(request)
        response: _UnprepareResponse = api.NodeUnprepareResourcesResponse(
            claims={uid: api.NodeUnprepareResourceResponse(error=e) for uid, e in errors.items()}
        )
        return response

    def _rpc_done(self, method: str, started: float) -> None:
        if self._metrics is not None:
            self._metrics.rpc_done(method=method, seconds=time.monotonic() - started)


def _api_of(request: _PrepareRequest | _UnprepareRequest) -> ModuleType:
    """The messages module of the API version ``request`` came in."""
    return v1 if request.DESCRIPTOR.file is v1.DESCRIPTOR else v1beta1


def add_dra_services(
    server: grpc.Server, preparer: ClaimPreparer, *, metrics: PluginMetrics | None = None
) -> None:
    """Register one service for both API versions on ``server``, backed by ``preparer``."""
    service = DraService(preparer, metrics)
    v1_grpc.add_DRAPluginServicer_to_server(service, server)
    v1beta1_grpc.add_DRAPluginServicer_to_server(service, server)
