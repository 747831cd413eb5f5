"""The published device model: limits of the API, names, counters, and the round trip back."""

import re
from datetime import UTC, datetime

import pytest

from api import wire
from driver.cluster.port import as_json
from driver.mig.catalog import gpu_model
from driver.resourceslices import GpuInventory, build_pool, complete_pools, parse_devices
from driver.taints import UNHEALTHY_TAINT_KEY, DeviceTaint

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _gpus(count: int, model: str = "A100-40GB") -> list[GpuInventory]:
    m = gpu_model(model)
    return [
        GpuInventory(
            index=i,
            uuid=f"GPU-{i:08d}",
            product_name=m.product_name,
            memory_slices=m.memory_slices,
            profiles=m.profiles,
        )
        for i in range(count)
    ]


def test_eight_a100_gpus_make_one_counter_slice_and_one_device_slice_per_gpu() -> None:
    slices = build_pool(node="node-a", gpus=_gpus(8), generation=3)
    counter_slices = [s for s in slices if "sharedCounters" in s["spec"]]
    device_slices = [s for s in slices if "devices" in s["spec"]]
    assert len(counter_slices) == 1
    assert len(device_slices) == 8
    assert all(s["spec"]["pool"]["resourceSliceCount"] == 9 for s in slices)
    assert all(
        s["spec"]["pool"] == {"name": "node-a", "generation": 3, "resourceSliceCount": 9}
        for s in slices
    )
    # 7 + 7 + 4 + 3 + 2 + 1 + 1 placements per A100-40GB
    assert [len(s["spec"]["devices"]) for s in device_slices] == [25] * 8
    for s in slices:
        assert not ("sharedCounters" in s["spec"] and "devices" in s["spec"])
        assert len(s["spec"].get("devices", [])) <= 64
        assert len(s["spec"].get("sharedCounters", [])) <= 8


def test_more_than_eight_gpus_split_counter_sets() -> None:
    slices = build_pool(node="n", gpus=_gpus(10), generation=1)
    counter_slices = [s for s in slices if "sharedCounters" in s["spec"]]
    assert [len(s["spec"]["sharedCounters"]) for s in counter_slices] == [8, 2]
    assert len({s["metadata"]["name"] for s in slices}) == len(slices)


def test_device_names_are_dns_labels_and_unique() -> None:
    slices = build_pool(node="n", gpus=_gpus(2), generation=1)
    names = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
    assert len(names) == len(set(names))
    assert all(DNS_LABEL.match(n) and len(n) <= 63 for n in names)
    assert "gpu-0-1g-5gb-3" in names
    assert "gpu-1-1g-5gb-me-0" in names


@pytest.mark.parametrize(
    ("device", "expected_counters"),
    [
        ("gpu-0-1g-5gb-6", {"memory-slice-6"}),
        ("gpu-0-1g-5gb-me-2", {"memory-slice-2", "media-extensions"}),
        ("gpu-0-1g-10gb-6", {"memory-slice-6", "memory-slice-7"}),
        ("gpu-0-3g-20gb-4", {f"memory-slice-{i}" for i in range(4, 8)}),
        ("gpu-0-7g-40gb-0", {f"memory-slice-{i}" for i in range(8)}),
    ],
    ids=["1g", "1g+me", "1g.10gb", "3g", "7g"],
)
def test_devices_consume_the_memory_slices_they_cover(
    device: str, expected_counters: set[str]
) -> None:
    slices = build_pool(node="n", gpus=_gpus(1), generation=1)
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}
    consumed = devices[device]["consumesCounters"]
    assert len(consumed) == 1
    assert consumed[0]["counterSet"] == "gpu-0"
    assert set(consumed[0]["counters"]) == expected_counters


def test_owner_reference_is_the_node() -> None:
    owner: wire.OwnerReference = {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u-1"}
    slices = build_pool(node="n", gpus=_gpus(1), generation=1, owner=owner)
    assert all(s["metadata"]["ownerReferences"] == [{**owner, "controller": True}] for s in slices)


def test_no_gpus_publish_nothing() -> None:
    assert build_pool(node="n", gpus=[], generation=1) == []


def test_round_trip_parse_gives_back_every_placement() -> None:
    slices = build_pool(node="node-a", gpus=_gpus(2, "A30-24GB"), generation=1)
    pools = complete_pools(slices)
    devices = parse_devices(pools["node-a"])
    assert len(devices) == 2 * (4 + 4 + 2 + 2 + 1)
    d = next(d for d in devices if d.name == "gpu-1-2g-12gb-me-2")
    assert (d.gpu_index, d.profile, d.placement.start, d.placement.size) == (1, "2g.12gb+me", 2, 2)
    assert d.media_extensions is True
    assert d.memory_slices_total == 4
    assert d.parent_uuid == "GPU-00000001"


def test_incomplete_or_old_generation_pools_are_not_trusted() -> None:
    old = build_pool(node="a", gpus=_gpus(1), generation=1)
    new = build_pool(node="a", gpus=_gpus(2), generation=2)
    assert complete_pools(old + new[:-1]) == {}
    pools = complete_pools(old + new)
    assert {s["spec"]["pool"]["generation"] for s in pools["a"]} == {2}


def test_malformed_foreign_device_is_skipped() -> None:
    slices = build_pool(node="a", gpus=_gpus(1), generation=1)
    slices[1]["spec"]["devices"].append({"name": "weird", "attributes": {"profile": {}}})
    devices = parse_devices(complete_pools(slices)["a"])
    assert "weird" not in {d.name for d in devices}
    assert len(devices) == 25


def test_device_taints_round_trip_and_a_malformed_taint_skips_its_device() -> None:
    added = datetime(2026, 5, 9, 7, 35, 25, tzinfo=UTC)
    taint = DeviceTaint(
        key=UNHEALTHY_TAINT_KEY, value="Xid79", effect="NoSchedule", time_added=added
    )
    slices = build_pool(node="a", gpus=_gpus(1), generation=1, taints={0: (taint,)})
    devices = parse_devices(complete_pools(slices)["a"])
    assert len(devices) == 25
    assert {d.taints for d in devices} == {(taint,)}
    broken = as_json(next(d for d in slices[1]["spec"]["devices"] if d["name"] == devices[0].name))
    broken["taints"] = [{"key": UNHEALTHY_TAINT_KEY, "value": "Xid79"}]  # no effect
    devices = parse_devices(complete_pools(slices)["a"])
    assert len(devices) == 24
    assert broken["name"] not in {d.name for d in devices}
