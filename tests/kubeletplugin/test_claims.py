"""Claim checks and planning, without I/O."""

from __future__ import annotations

from typing import Any

import pytest

from api.names import DRIVER_NAME
from driver.cluster.views import Allocation
from driver.errors import ConfigError
from driver.gpu.emulated import EmulatedGpuBackend
from driver.ids import ClaimUid
from kubeletplugin.model import ClaimRef
from kubeletplugin.node.inventory import build_inventory
from kubeletplugin.state.claims import ClaimRejectedError, allocated_nodes, plan_claim

REF = ClaimRef(uid=ClaimUid("u1"), namespace="ns", name="c")
CONFIG = {"apiVersion": "mig.instaslice.dev/v1alpha1", "kind": "MigDeviceConfig"}


def inventory() -> Any:
    backend = EmulatedGpuBackend(node_name="n1", spec="1xA100-40GB,1xA30-24GB")
    try:
        return build_inventory(backend.gpus())
    finally:
        backend.close()


def claim(results: list[dict[str, Any]], *, config: list[Any] | None = None, **alloc: Any) -> Any:
    allocation: dict[str, Any] = {"devices": {"results": results}, **alloc}
    if config is not None:
        allocation["devices"]["config"] = config
    return {"metadata": {"uid": "u1"}, "status": {"allocation": allocation}}


def result(device: str, *, request: str = "gpu", pool: str = "n1", **extra: Any) -> Any:
    return {"request": request, "driver": DRIVER_NAME, "pool": pool, "device": device, **extra}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        (None, None),
        ({}, None),
        ({"nodeSelectorTerms": []}, set()),
        ({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}]}, {"a"}),
        ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["b"]}]}]}, {"b"}),
        ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}]}]}, None),
    ],
    ids=["absent", "empty", "no-terms", "match-fields", "hostname-label", "other-label"],
)  # fmt: skip
def test_allocated_nodes(selector: Any, expected: set[str] | None) -> None:
    allocation = Allocation.parse({"devices": {}, "nodeSelector": selector})
    assert allocation is not None
    assert allocated_nodes(allocation) == expected


def test_plan_maps_device_names_back_to_profiles_with_plus_me() -> None:
    planned = plan_claim(
        claim([result("gpu-0-1g-5gb-me-3"), result("gpu-1-2g-12gb-2", request="gpu/big")]),
        ref=REF,
        node_name="n1",
        inventory=inventory(),
    )
    assert [
        (p.device.gpu_index, p.device.profile.name, p.device.placement.start) for p in planned
    ] == [
        (0, "1g.5gb+me", 3),
        (1, "2g.12gb", 2),
    ]
    assert planned[1].request_names == ("gpu",)


def test_results_of_other_drivers_are_ignored() -> None:
    other = {"request": "nic", "driver": "net.example.com", "pool": "elsewhere", "device": "x"}
    planned = plan_claim(claim([other]), ref=REF, node_name="n1", inventory=inventory())
    assert planned == []


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"metadata": {"uid": "u2"}, "status": {"allocation": {}}}, "replaced"),
        ({"metadata": {"uid": "u1"}, "status": {}}, "not allocated"),
        (claim([result("gpu-0-1g-5gb-0", adminAccess=True)]), "admin access"),
        (claim([result("gpu-0-1g-5gb-0", pool="n2")]), "pool n2"),
    ],
    ids=["replaced", "unallocated", "admin-access", "other-pool"],
)
def test_claims_refused(obj: Any, message: str) -> None:
    with pytest.raises(ClaimRejectedError, match=message):
        plan_claim(obj, ref=REF, node_name="n1", inventory=inventory())


def test_config_precedence_and_request_scoping() -> None:
    def entry(source: str, requests: list[str], env: dict[str, str]) -> Any:
        return {
            "source": source,
            "requests": requests,
            "opaque": {"driver": DRIVER_NAME, "parameters": {**CONFIG, "env": env}},
        }

    planned = plan_claim(
        claim(
            [result("gpu-0-1g-5gb-0", request="a"), result("gpu-0-1g-5gb-1", request="b/sub")],
            config=[
                entry("FromClaim", ["b"], {"X": "claim-b"}),
                entry("FromClass", [], {"X": "class", "Y": "class"}),
            ],
        ),
        ref=REF,
        node_name="n1",
        inventory=inventory(),
    )
    assert dict(planned[0].env) == {"X": "class", "Y": "class"}
    assert dict(planned[1].env) == {"X": "claim-b", "Y": "class"}


def test_claim_spec_config_is_used_when_the_allocation_has_none() -> None:
    obj = claim([result("gpu-0-1g-5gb-0")])
    obj["spec"] = {
        "devices": {
            "config": [{"opaque": {"driver": DRIVER_NAME, "parameters": {**CONFIG, "bad": 1}}}]
        }
    }
    with pytest.raises(ConfigError, match="unknown field 'bad'"):
        plan_claim(obj, ref=REF, node_name="n1", inventory=inventory())
