"""MIG UUIDs recorded in the claim's ``status.devices`` after a DRA prepare (best effort)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from api.checkpoint import PreparedClaim, PrepareState
from api.checkpoint import PreparedDevice as CheckpointDevice
from api.names import DRIVER_NAME
from driver.cluster.port import RESOURCE_CLAIMS, Body, JsonObject, Resource, resource_version_of
from driver.cluster.views import ClaimView
from driver.errors import ClusterError, ConflictError
from driver.ids import ClaimUid
from instaslice.status import status_mig_uuid
from kubeletplugin.model import ClaimRef
from kubeletplugin.plugin import KubeletPlugin
from kubeletplugin.state.devicestatus import (
    CONFLICT_ATTEMPTS,
    DeviceStatusWriter,
    RecordingPreparer,
    desired_device_statuses,
)
from tests.kubeletplugin.harness import ClaimHandle, NodeHarness, node_selector

DRAIN_S = 10.0


def _claim(node: NodeHarness, handle: ClaimHandle) -> JsonObject:
    return node.api.get(RESOURCE_CLAIMS, name=handle.name, namespace=handle.namespace)


def _mig_uuids(plugin: KubeletPlugin, handle: ClaimHandle) -> dict[str, str]:
    entry = plugin.state.prepared()[handle.uid]
    return {d.device: str(d.mig_uuid) for d in entry.devices}


def test_prepare_records_each_devices_mig_uuid(node: NodeHarness) -> None:
    plugin = node.start_plugin()
    kubelet = node.kubelet()
    claim = node.claim([("a", "gpu-0-1g-5gb-2"), ("b", "gpu-1-2g-10gb-4")])
    assert kubelet.prepare([claim])[claim.uid].error == ""
    assert plugin.device_status.drain(DRAIN_S)
    uuids = _mig_uuids(plugin, claim)
    assert all(u.startswith("MIG-") for u in uuids.values())
    stored = _claim(node, claim)
    assert sorted(stored["status"]["devices"], key=lambda d: d["device"]) == [
        {"driver": DRIVER_NAME, "pool": node.node, "device": d, "data": {"migUUID": uuids[d]}}
        for d in sorted(uuids)
    ]
    for device, uuid in uuids.items():
        found = status_mig_uuid(
            ClaimView.of(stored), driver=DRIVER_NAME, pool=node.node, device=device
        )
        assert found == uuid


def test_repeat_prepare_writes_nothing(node: NodeHarness) -> None:
    plugin = node.start_plugin()
    kubelet = node.kubelet()
    claim = node.claim(["gpu-0-1g-5gb-2"])
    first = kubelet.prepare([claim])
    assert plugin.device_status.drain(DRAIN_S)
    version = resource_version_of(_claim(node, claim))
    assert kubelet.prepare([claim]) == first
    assert plugin.device_status.drain(DRAIN_S)
    assert resource_version_of(_claim(node, claim)) == version


def test_other_drivers_entries_are_kept(node: NodeHarness) -> None:
    plugin = node.start_plugin()
    kubelet = node.kubelet()
    requests = [
        {"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME}},
        {"name": "nic", "exactly": {"deviceClassName": "nic"}},
    ]
    claim = node.api.create(
        RESOURCE_CLAIMS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "mixed", "namespace": "default"},
            "spec": {"devices": {"requests": requests}},
        },
    )
    results = [
        {"request": "gpu", "driver": DRIVER_NAME, "pool": node.node, "device": "gpu-0-1g-5gb-2"},
        {"request": "nic", "driver": "nic.example.com", "pool": "net", "device": "eth1"},
    ]
    nic_status = {"driver": "nic.example.com", "pool": "net", "device": "eth1", "data": {"x": 1}}
    claim["status"] = {
        "allocation": {
            "devices": {"results": results},
            "nodeSelector": node_selector(node.node),
        },
        "devices": [nic_status],
    }
    claim = node.api.update_status(RESOURCE_CLAIMS, claim)
    handle = ClaimHandle(uid=claim["metadata"]["uid"], namespace="default", name="mixed")
    assert kubelet.prepare([handle])[handle.uid].error == ""
    assert plugin.device_status.drain(DRAIN_S)
    devices = _claim(node, handle)["status"]["devices"]
    assert devices[0] == nic_status
    assert devices[1]["device"] == "gpu-0-1g-5gb-2"
    assert devices[1]["data"] == {"migUUID": _mig_uuids(plugin, handle)["gpu-0-1g-5gb-2"]}


class _FailingApi:
    """The harness's API, except that every status write fails as ``error`` says."""

    def __init__(self, inner: Any, error: ClusterError) -> None:
        self._inner = inner
        self._error = error
        self.status_writes = 0

    def update_status(self, resource: Resource, obj: Body) -> JsonObject:
        self.status_writes += 1
        raise self._error

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.parametrize(
    "error",
    [ConflictError("409"), ClusterError("500 internal error")],
    ids=["conflict-every-time", "server-error"],
)
def test_failed_status_write_leaves_the_answer_alone(
    node: NodeHarness, error: ClusterError, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = node.start_plugin()
    api = _FailingApi(node.api, error)
    writer = DeviceStatusWriter(api=api, driver=DRIVER_NAME, pool=node.node)
    try:
        preparer = RecordingPreparer(plugin.state, prepared=plugin.state, writer=writer)
        claim = node.claim(["gpu-0-1g-5gb-2"])
        ref = ClaimRef(uid=ClaimUid(claim.uid), namespace=claim.namespace, name=claim.name)
        answer = preparer.prepare([ref])
        assert writer.drain(DRAIN_S)
        assert answer == plugin.state.prepare([ref])
        assert answer[ref.uid].error == ""
        assert api.status_writes == (CONFLICT_ATTEMPTS if isinstance(error, ConflictError) else 1)
        assert "MIG UUIDs not recorded" in caplog.text
        assert "devices" not in _claim(node, claim)["status"]
    finally:
        writer.close()


def test_claim_deleted_right_after_prepare(
    node: NodeHarness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="kubeletplugin.state.devicestatus")
    plugin = node.start_plugin()
    kubelet = node.kubelet()
    claim = node.claim(["gpu-0-1g-5gb-2"])
    answer = kubelet.prepare([claim])[claim.uid]
    node.delete_claim(claim)
    assert answer.error == ""
    assert plugin.device_status.drain(DRAIN_S)
    caplog.clear()
    # The checkpoint entry is still there: the write finds the claim gone and gives up quietly.
    plugin.device_status.record(plugin.state.prepared()[claim.uid])
    assert "is gone" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def _entry(*devices: tuple[str, str]) -> PreparedClaim:
    return PreparedClaim(
        uid="u1",
        namespace="ns",
        name="c",
        state=PrepareState.PREPARE_COMPLETED,
        devices=tuple(
            CheckpointDevice(
                request_names=("gpu",),
                pool="node-a",
                device=device,
                gpu_index=0,
                gpu_uuid="GPU-0",
                profile="1g.5gb",
                placement_start=0,
                placement_size=1,
                gi_id=1,
                ci_id=0,
                mig_uuid=uuid,
                cdi_device_ids=("k=x",),
            )
            for device, uuid in devices
        ),
    )


def _allocated(*devices: tuple[str, str, str], status: list[Any] | None = None) -> JsonObject:
    results = [{"request": "r", "driver": d, "pool": p, "device": n} for d, p, n in devices]
    claim: JsonObject = {"status": {"allocation": {"devices": {"results": results}}}}
    if status is not None:
        claim["status"]["devices"] = status
    return claim


@pytest.mark.parametrize(
    ("claim", "want"),
    [
        (
            _allocated((DRIVER_NAME, "node-a", "d1")),
            [{"driver": DRIVER_NAME, "pool": "node-a", "device": "d1", "data": {"migUUID": "M1"}}],
        ),
        (
            _allocated(
                (DRIVER_NAME, "node-a", "d1"),
                status=[
                    {
                        "driver": DRIVER_NAME,
                        "pool": "node-a",
                        "device": "d1",
                        "data": {"migUUID": "M1"},
                    }
                ],
            ),
            None,
        ),
        (
            _allocated(
                (DRIVER_NAME, "node-a", "d1"),
                status=[
                    {
                        "driver": DRIVER_NAME,
                        "pool": "node-a",
                        "device": "d1",
                        "conditions": [{"type": "Ready"}],
                        "data": {"note": "kept", "migUUID": "OLD"},
                    },
                    {"driver": DRIVER_NAME, "pool": "node-a", "device": "gone"},
                ],
            ),
            [
                {
                    "driver": DRIVER_NAME,
                    "pool": "node-a",
                    "device": "d1",
                    "conditions": [{"type": "Ready"}],
                    "data": {"note": "kept", "migUUID": "M1"},
                }
            ],
        ),
        (_allocated((DRIVER_NAME, "node-b", "d1")), None),
    ],
    ids=["added", "already-there", "other-fields-kept-stale-dropped", "other-pool-untouched"],
)
def test_desired_device_statuses(claim: JsonObject, want: list[JsonObject] | None) -> None:
    entry = _entry(("d1", "M1"))
    assert desired_device_statuses(claim, entry, driver=DRIVER_NAME, pool="node-a") == want
