"""The generated DRA v1 stubs work end to end: a real gRPC server and client over a unix socket.

This module also doubles as the typing check for the generated .pyi files: the servicer
subclass and the stub call below must stay `mypy --strict` clean.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from protos.dra.v1 import api_pb2, api_pb2_grpc


class _RecordingDraPlugin(api_pb2_grpc.DRAPluginServicer):
    """Prepares every claim as one device whose CDI id names the claim UID."""

    def __init__(self) -> None:
        self.prepared: list[tuple[str, str, str]] = []

    def NodePrepareResources(
        self,
        request: api_pb2.NodePrepareResourcesRequest,
        context: grpc.ServicerContext,
    ) -> api_pb2.NodePrepareResourcesResponse:
        response = api_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            self.prepared.append((claim.namespace, claim.name, claim.uid))
            response.claims[claim.uid].devices.append(
                api_pb2.Device(
                    request_names=["gpu"],
                    pool_name="node-a",
                    device_name="gpu-0-mig-1g.10gb-0",
                    cdi_device_ids=[f"mig.instaslice.dev/mig={claim.uid}-gpu"],
                )
            )
        return response

    def NodeUnprepareResources(
        self,
        request: api_pb2.NodeUnprepareResourcesRequest,
        context: grpc.ServicerContext,
    ) -> api_pb2.NodeUnprepareResourcesResponse:
        response = api_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].error = ""
        return response


@pytest.fixture
def servicer() -> _RecordingDraPlugin:
    return _RecordingDraPlugin()


@pytest.fixture
def channel(tmp_path: Path, servicer: _RecordingDraPlugin) -> Iterator[grpc.Channel]:
    socket = tmp_path / "dra.sock"
    with ThreadPoolExecutor(max_workers=2) as pool:
        server = grpc.server(pool)
        api_pb2_grpc.add_DRAPluginServicer_to_server(servicer, server)
        assert server.add_insecure_port(f"unix:{socket}") != 0
        server.start()
        try:
            with grpc.insecure_channel(f"unix:{socket}") as client_channel:
                yield client_channel
        finally:
            server.stop(grace=None).wait()


def test_node_prepare_resources_round_trip(
    channel: grpc.Channel, servicer: _RecordingDraPlugin
) -> None:
    stub = api_pb2_grpc.DRAPluginStub(channel)
    request = api_pb2.NodePrepareResourcesRequest(
        claims=[api_pb2.Claim(namespace="team-a", name="train", uid="uid-1")]
    )

    response = stub.NodePrepareResources(request, timeout=10)

    assert servicer.prepared == [("team-a", "train", "uid-1")]
    assert list(response.claims) == ["uid-1"]
    prepared = response.claims["uid-1"]
    assert prepared.error == ""
    assert [
        (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
        for d in prepared.devices
    ] == [(["gpu"], "node-a", "gpu-0-mig-1g.10gb-0", ["mig.instaslice.dev/mig=uid-1-gpu"])]
    assert not prepared.devices[0].HasField("share_id")


def test_empty_prepare_request_is_answered(channel: grpc.Channel) -> None:
    # The liveness probe of the Go helper sends exactly this.
    stub = api_pb2_grpc.DRAPluginStub(channel)

    response = stub.NodePrepareResources(api_pb2.NodePrepareResourcesRequest(), timeout=10)

    assert dict(response.claims) == {}


def test_node_unprepare_resources_round_trip(channel: grpc.Channel) -> None:
    stub = api_pb2_grpc.DRAPluginStub(channel)
    request = api_pb2.NodeUnprepareResourcesRequest(
        claims=[api_pb2.Claim(namespace="team-a", name="train", uid="uid-1")]
    )

    response = stub.NodeUnprepareResources(request, timeout=10)

    assert list(response.claims) == ["uid-1"]
    assert response.claims["uid-1"].error == ""
