"""The DRA node service (``DRAPlugin``) in both API versions the kubelet may speak, v1 and v1beta1.

The two protos differ only in their package and in v1's ``Device.share_id`` (which we never set), so
both servicers convert to ``kubeletplugin.model`` and delegate to one ``ClaimPreparer``. Failures are
reported per claim inside the response map; the RPC itself fails only if the request is malformed.
A claim reference that cannot name a ResourceClaim gets its own error (``claimrefs``).
Even a bug in the core is turned into a per-claim error for every claim of the call, so one bad claim
cannot fail the others, and every claim asked about gets an entry (the kubelet retries the missing).
"""

import logging
import time
from collections.abc import Iterable, Mapping
from typing import TypeVar

import grpc

from driver.ids import ClaimUid
from kubeletplugin.dra.claimrefs import split_claim_refs
from kubeletplugin.metrics import PluginMetrics
from kubeletplugin.model import ClaimPreparer, ClaimRef, PrepareResult
from protos.dra.v1 import api_pb2 as v1
from protos.dra.v1 import api_pb2_grpc as v1_grpc
from protos.dra.v1beta1 import api_pb2 as v1beta1
from protos.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc

logger = logging.getLogger(__name__)

_ClaimMessage = v1.Claim | v1beta1.Claim
_T = TypeVar("_T")


def claim_refs(claims: Iterable[_ClaimMessage]) -> list[ClaimRef]:
    return [ClaimRef(uid=ClaimUid(c.uid), namespace=c.namespace, name=c.name) for c in claims]


def _safe_prepare(
    preparer: ClaimPreparer, refs: list[ClaimRef], metrics: PluginMetrics | None
) -> dict[str, PrepareResult]:
    started = time.monotonic()
    try:
        return _prepare(preparer, refs)
    finally:
        if metrics is not None:
            metrics.rpc_done(method="NodePrepareResources", seconds=time.monotonic() - started)


def _safe_unprepare(
    preparer: ClaimPreparer, refs: list[ClaimRef], metrics: PluginMetrics | None
) -> dict[str, str]:
    started = time.monotonic()
    try:
        return _unprepare(preparer, refs)
    finally:
        if metrics is not None:
            metrics.rpc_done(method="NodeUnprepareResources", seconds=time.monotonic() - started)


def _prepare(preparer: ClaimPreparer, refs: list[ClaimRef]) -> dict[str, PrepareResult]:
    refs, refused = split_claim_refs(refs)
    answers = {uid: PrepareResult(error=error) for uid, error in refused.items()}
    if not refs:
        return answers
    try:
        results = preparer.prepare(refs)
    except Exception as exc:
        logger.exception("prepare failed for %d claim(s)", len(refs))
        return answers | {ref.uid: PrepareResult(error=f"internal error: {exc}") for ref in refs}
    missing = PrepareResult(error="no result")
    return answers | _complete({ref.uid for ref in refs}, results, missing=missing)


def _unprepare(preparer: ClaimPreparer, refs: list[ClaimRef]) -> dict[str, str]:
    refs, answers = split_claim_refs(refs)
    if not refs:
        return answers
    try:
        results = preparer.unprepare(refs)
    except Exception as exc:
        logger.exception("unprepare failed for %d claim(s)", len(refs))
        return answers | {ref.uid: f"internal error: {exc}" for ref in refs}
    return answers | _complete({ref.uid for ref in refs}, results, missing="no result")


def _complete(uids: set[str], results: Mapping[ClaimUid, _T], *, missing: _T) -> dict[str, _T]:
    return {uid: results.get(ClaimUid(uid), missing) for uid in uids}


class DraServiceV1(v1_grpc.DRAPluginServicer):
    def __init__(self, preparer: ClaimPreparer, metrics: PluginMetrics | None = None) -> None:
        self._preparer = preparer
        self._metrics = metrics

    def NodePrepareResources(  # noqa: N802 - gRPC method name
        self, request: v1.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1.NodePrepareResourcesResponse:
        results = _safe_prepare(self._preparer, claim_refs(request.claims), self._metrics)
        return v1.NodePrepareResourcesResponse(
            claims={
                uid: v1.NodePrepareResourceResponse(
                    error=result.error,
                    devices=[
                        v1.Device(
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

    def NodeUnprepareResources(  # noqa: N802 - gRPC method name
        self, request: v1.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1.NodeUnprepareResourcesResponse:
        errors = _safe_unprepare(self._preparer, claim_refs(request.claims), self._metrics)
        return v1.NodeUnprepareResourcesResponse(
            claims={uid: v1.NodeUnprepareResourceResponse(error=e) for uid, e in errors.items()}
        )


class DraServiceV1beta1(v1beta1_grpc.DRAPluginServicer):
    def __init__(self, preparer: ClaimPreparer, metrics: PluginMetrics | None = None) -> None:
        self._preparer = preparer
        self._metrics = metrics

    def NodePrepareResources(  # noqa: N802 - gRPC method name
        self, request: v1beta1.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1beta1.NodePrepareResourcesResponse:
        results = _safe_prepare(self._preparer, claim_refs(request.claims), self._metrics)
        return v1beta1.NodePrepareResourcesResponse(
            claims={
                uid: v1beta1.NodePrepareResourceResponse(
                    error=result.error,
                    devices=[
                        v1beta1.Device(
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

    def NodeUnprepareResources(  # noqa: N802 - gRPC method name
        self, request: v1beta1.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        errors = _safe_unprepare(self._preparer, claim_refs(request.claims), self._metrics)
        return v1beta1.NodeUnprepareResourcesResponse(
            claims={
                uid: v1beta1.NodeUnprepareResourceResponse(error=e) for uid, e in errors.items()
            }
        )


def add_dra_services(
    server: grpc.Server, preparer: ClaimPreparer, *, metrics: PluginMetrics | None = None
) -> None:
    """Register both API versions on ``server``, backed by the same ``preparer``."""
    v1_grpc.add_DRAPluginServicer_to_server(DraServiceV1(preparer, metrics), server)
    v1beta1_grpc.add_DRAPluginServicer_to_server(DraServiceV1beta1(preparer, metrics), server)
