"""The pure parts of the churn workload of ``bench.modes``: claims it writes, what it counts as used,
overlapping and stranded, and the offline figures it compares against."""

from __future__ import annotations

import pytest

from api import wire
from bench.modes_churn import ChurnSettings, _claim, _Gpus, make_trace, offline
from driver.cluster.port import JsonObject
from driver.mig.catalog import CATALOG
from driver.resourceslices import GpuInventory, build_pool
from instaslice.planning.fleet import parse_fleet
from instaslice.planning.trace import TraceRequest

NODE = "n0"


def _gpus() -> _Gpus:
    model = CATALOG["A100-40GB"]
    inventory = [
        GpuInventory(
            index=i,
            uuid=f"GPU-{i}",
            product_name=model.product_name,
            memory_slices=model.memory_slices,
            profiles=model.profiles,
        )
        for i in range(2)
    ]
    owner: wire.OwnerReference = {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "u"}
    return _Gpus(build_pool(node=NODE, gpus=inventory, generation=1, owner=owner))


def _allocated(*devices: str) -> JsonObject:
    results = [{"pool": NODE, "device": d, "driver": "mig.instaslice.dev"} for d in devices]
    return {"status": {"allocation": {"devices": {"results": results}}}}


def _device(gpus: _Gpus, *, gpu: int, size: int, start: int) -> str:
    for (_, name), (key, mask) in gpus.mask.items():
        if key == (NODE, gpu) and mask == ((1 << size) - 1) << start:
            return name
    raise AssertionError(f"no device of {size} slices at {start} on GPU {gpu}")


def test_used_slices_and_overlaps_come_from_the_allocations() -> None:
    gpus = _gpus()
    assert gpus.capacity == 16
    whole = _device(gpus, gpu=0, size=8, start=0)
    small = _device(gpus, gpu=0, size=1, start=3)
    other = _device(gpus, gpu=1, size=1, start=0)
    used, overlaps = gpus.used([_allocated(small), _allocated(other), {"status": {}}])
    assert used == {(NODE, 0): 1 << 3, (NODE, 1): 1}
    assert overlaps == 0
    _, overlaps = gpus.used([_allocated(small), _allocated(whole)])
    assert overlaps == 1


@pytest.mark.parametrize(
    ("taken", "slices", "stranded"),
    [
        ([(0, 8, 0), (1, 4, 0)], 4, True),
        ([(0, 8, 0), (1, 4, 0), (1, 1, 4)], 4, False),
        ([(0, 1, 0), (1, 1, 0)], 8, False),
    ],
    ids=["half-gpu-free", "three-free-is-not-four", "no-whole-gpu-free"],
)
def test_a_rejection_is_stranded_when_some_gpu_had_the_memory_slices(
    taken: list[tuple[int, int, int]], slices: int, stranded: bool
) -> None:
    gpus = _gpus()
    claims = [_allocated(_device(gpus, gpu=g, size=s, start=st)) for g, s, st in taken]
    used, _ = gpus.used(claims)
    assert gpus.stranded(used, slices) is stranded


def test_a_multi_slice_request_is_one_claim_constrained_to_one_gpu() -> None:
    one = _claim("a", TraceRequest(t=0, profile="2g.10gb"))
    three = _claim("b", TraceRequest(t=0, profile="1g.5gb", count=3))
    assert "constraints" not in one["spec"]["devices"]
    assert one["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "mig-2g.10gb.instaslice.dev"
    }
    request = three["spec"]["devices"]["requests"][0]["exactly"]
    assert request["count"] == 3
    assert request["allocationMode"] == "ExactCount"
    assert three["spec"]["devices"]["constraints"] == [
        {"requests": ["mig"], "matchAttribute": "mig.instaslice.dev/parentUUID"}
    ]


def test_the_trace_is_the_same_for_both_modes_and_replayed_offline() -> None:
    fleet = parse_fleet("2x8xA100-40GB")
    settings = ChurnSettings(events=200, load=1.2)
    trace = make_trace(fleet, settings)
    assert trace == make_trace(fleet, settings)
    assert {r.count for r in trace} > {1}
    figures = offline(trace, fleet)
    first_fit = figures["first_fit_replay"]
    assert first_fit["accepted"] + first_fit["rejected"] == len(trace)
    assert 0 < figures["fluid_floor_rejected"] < len(trace)
    assert 0 <= first_fit["stranded"] <= first_fit["rejected"]
