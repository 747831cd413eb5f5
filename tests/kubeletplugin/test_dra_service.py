"""One DRA servicer for both API versions: each request is answered in its own version's messages,
and a failing core turns into per-claim errors for every claim asked about."""

from collections.abc import Mapping, Sequence
from types import ModuleType
from unittest import mock

import grpc
import pytest

from driver.ids import ClaimUid
from kubeletplugin.dra.service import DraService
from kubeletplugin.model import ClaimRef, PreparedDevice, PrepareResult
from protos.dra.v1 import api_pb2 as v1
from protos.dra.v1beta1 import api_pb2 as v1beta1

CONTEXT = mock.create_autospec(grpc.ServicerContext, instance=True)
DEVICE = PreparedDevice(
    request_names=("gpu",),
    pool_name="node-a",
    device_name="gpu-0-1g-5gb-0",
    cdi_device_ids=("nvidia.com/gpu=claim-a",),
)


class _Preparer:
    """Answers the first claim of a call only; raises for a claim named ``boom``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[ClaimRef]]] = []

    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[ClaimUid, PrepareResult]:
        self.calls.append(("prepare", list(claims)))
        if any(c.name == "boom" for c in claims):
            raise RuntimeError("broken")
        return {claims[0].uid: PrepareResult(devices=(DEVICE,))}

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[ClaimUid, str]:
        self.calls.append(("unprepare", list(claims)))
        if any(c.name == "boom" for c in claims):
            raise RuntimeError("broken")
        return {claims[0].uid: ""}


@pytest.mark.parametrize("api", [v1, v1beta1], ids=["v1", "v1beta1"])
def test_each_version_is_answered_in_its_own_messages(api: ModuleType) -> None:
    preparer = _Preparer()
    service = DraService(preparer)
    claims = [
        api.Claim(uid="a", namespace="ns", name="one"),
        api.Claim(uid="b", namespace="ns", name="two"),
    ]

    prepared = service.NodePrepareResources(api.NodePrepareResourcesRequest(claims=claims), CONTEXT)
    unprepared = service.NodeUnprepareResources(
        api.NodeUnprepareResourcesRequest(claims=claims), CONTEXT
    )

    assert type(prepared) is api.NodePrepareResourcesResponse
    assert dict(prepared.claims) == {
        "a": api.NodePrepareResourceResponse(
            devices=[
                api.Device(
                    request_names=["gpu"],
                    pool_name="node-a",
                    device_name="gpu-0-1g-5gb-0",
                    cdi_device_ids=["nvidia.com/gpu=claim-a"],
                )
            ]
        ),
        "b": api.NodePrepareResourceResponse(error="no result"),
    }
    assert type(unprepared) is api.NodeUnprepareResourcesResponse
    assert dict(unprepared.claims) == {
        "a": api.NodeUnprepareResourceResponse(),
        "b": api.NodeUnprepareResourceResponse(error="no result"),
    }
    refs = [
        ClaimRef(uid=ClaimUid("a"), namespace="ns", name="one"),
        ClaimRef(uid=ClaimUid("b"), namespace="ns", name="two"),
    ]
    assert preparer.calls == [("prepare", refs), ("unprepare", refs)]


@pytest.mark.parametrize("api", [v1, v1beta1], ids=["v1", "v1beta1"])
def test_a_failing_core_is_an_error_for_every_claim_of_the_call(api: ModuleType) -> None:
    service = DraService(_Preparer())
    claims = [
        api.Claim(uid="a", namespace="ns", name="boom"),
        api.Claim(uid="b", namespace="ns", name="two"),
    ]

    prepared = service.NodePrepareResources(api.NodePrepareResourcesRequest(claims=claims), CONTEXT)
    unprepared = service.NodeUnprepareResources(
        api.NodeUnprepareResourcesRequest(claims=claims), CONTEXT
    )

    assert {uid: r.error for uid, r in prepared.claims.items()} == {
        "a": "internal error: broken",
        "b": "internal error: broken",
    }
    assert {uid: r.error for uid, r in unprepared.claims.items()} == {
        "a": "internal error: broken",
        "b": "internal error: broken",
    }
