"""What the controller keeps of cached objects: equal small parts of ResourceSlices shared
(``JsonInterner``), the webhook process's claims without their status (``admission_claim``), index
fingerprints of their own size."""

from __future__ import annotations

import copy
import gc
import tracemalloc
from typing import Any

import orjson
import pytest

from bench.realnodes import gpus_of, node_owner
from controller.allocation.selectors import device_views_from_slice
from controller.informers import admission_claim
from driver.cluster.indexes import pod_claim_keys_inputs
from driver.cluster.informer import JsonInterner, chain, strip_managed_fields
from driver.cluster.port import JsonObject
from driver.errors import ConfigError
from driver.resourceslices import build_pool


def _node_slices(node: str) -> list[bytes]:
    """One node's slices (8 A100-40GB) as the API server sends them."""
    slices = build_pool(
        node=node, gpus=gpus_of(node), generation=1, owner=node_owner(node, f"uid-{node}")
    )
    return [orjson.dumps(s) for s in slices]


def _device(slice_obj: JsonObject, index: int) -> dict[str, Any]:
    device: dict[str, Any] = slice_obj["spec"]["devices"][index]
    return device


def test_interned_objects_equal_the_input_and_share_equal_small_parts() -> None:
    interner = JsonInterner()
    wire = _node_slices("n1")[1]
    first = interner(orjson.loads(wire))
    second = interner(orjson.loads(wire))
    assert first == orjson.loads(wire)
    assert first is not second  # a slice is wide: never one object for two cache entries
    a, b = _device(first, 0), _device(second, 0)
    assert a is not b
    assert a["attributes"] is not b["attributes"]
    assert a["capacity"] is b["capacity"]
    assert a["consumesCounters"] is b["consumesCounters"]
    assert a["attributes"]["profile"] is b["attributes"]["profile"]
    # and across devices of one slice: every 1g.5gb device has the same capacity
    assert _device(first, 0)["capacity"] is _device(first, 1)["capacity"]


def test_values_of_other_types_are_never_merged() -> None:
    interner = JsonInterner()
    values = [True, 1, 1.0, "1", None, [1], {"a": 1}]
    parts = [interner({"metadata": {}, "v": {"x": value}})["v"] for value in values]
    for part, value in zip(parts, values, strict=True):
        assert part == {"x": value}
        assert type(part["x"]) is type(value)
    assert len({id(p) for p in parts}) == len(values)


def test_wide_containers_are_not_shared_but_their_parts_are() -> None:
    interner = JsonInterner(max_width=2)
    one = interner({"w": {"a": {"k": 1}, "b": 2, "c": 3}, "n": [{"k": 1}, 2, 3]})
    two = interner({"w": {"a": {"k": 1}, "b": 2, "c": 3}, "n": [{"k": 1}, 2, 3]})
    assert one == two
    assert one["w"] is not two["w"]
    assert one["n"] is not two["n"]
    assert one["w"]["a"] is two["w"]["a"] is one["n"][0]
    # a container holding a part that is not shared is not shared either
    three = interner({"p": {"w": {"a": 1, "b": 2, "c": 3}}})
    four = interner({"p": {"w": {"a": 1, "b": 2, "c": 3}}})
    assert three["p"] is not four["p"]


def test_the_table_starts_afresh_past_its_bound_and_results_stay_equal() -> None:
    interner = JsonInterner(max_entries=50)
    results = [interner({"metadata": {"name": f"o{i}"}, "v": {"n": i}}) for i in range(200)]
    assert len(interner) <= 51
    assert [r["v"]["n"] for r in results] == list(range(200))
    again = interner({"metadata": {"name": "x"}, "v": {"n": 199}})
    assert again["v"] is results[-1]["v"]  # still shared after the last fresh start


def test_chained_transforms_apply_in_order() -> None:
    full: JsonObject = {
        "metadata": {"name": "a", "managedFields": [{"manager": "m"}]},
        "spec": {"x": 1},
    }
    transform = chain(strip_managed_fields, JsonInterner())
    out = transform(full)
    assert out == {"metadata": {"name": "a"}, "spec": {"x": 1}}
    assert "managedFields" in full["metadata"]  # the input is left alone


def test_interning_a_node_of_slices_keeps_under_a_third_of_the_memory() -> None:
    wires = [_node_slices(f"node-{i}") for i in range(12)]

    def held(make: Any) -> int:
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot()
            kept = [make(orjson.loads(w)) for ws in wires for w in ws]
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        assert len(kept) == sum(len(ws) for ws in wires)
        return sum(s.size_diff for s in after.compare_to(before, "filename"))

    interner = JsonInterner()
    plain, interned = held(lambda o: o), held(interner)
    assert interned * 3 < plain, (plain, interned)


def test_devices_with_equal_capacities_share_one_parsed_capacity() -> None:
    slice_obj = orjson.loads(_node_slices("n1")[1])
    views = device_views_from_slice(slice_obj)
    one_g = [v for v in views if v.attributes[v.driver]["profile"] == "1g.5gb"]
    assert len(one_g) > 1
    assert all(v.capacity is one_g[0].capacity for v in one_g)
    whole = next(v for v in views if v.attributes[v.driver]["profile"] == "7g.40gb")
    small, large = one_g[0].capacity[whole.driver], whole.capacity[whole.driver]
    assert large["memory"].value > small["memory"].value


def test_a_bad_capacity_is_still_refused_for_every_device_that_has_it() -> None:
    slice_obj = orjson.loads(_node_slices("n1")[1])
    for device in slice_obj["spec"]["devices"][:2]:
        device["capacity"] = {"memory": {"value": "lots"}}
    for _ in range(2):  # an error is never remembered as a capacity
        with pytest.raises(ConfigError, match="capacity memory"):
            device_views_from_slice(slice_obj)


def test_the_webhook_keeps_a_claims_spec_and_identity_only() -> None:
    claim: JsonObject = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "c",
            "namespace": "ns",
            "uid": "u",
            "resourceVersion": "7",
            "managedFields": [{"manager": "kube-controller-manager"}],
        },
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "x"}}]}},
        "status": {"allocation": {"devices": {"results": []}}, "reservedFor": [{"name": "p"}]},
    }
    kept = admission_claim(claim)
    assert kept == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "u", "resourceVersion": "7"},
        "spec": claim["spec"],
    }
    assert "status" in claim
    assert "managedFields" in claim["metadata"]


def test_an_index_fingerprint_keeps_no_more_than_its_bytes() -> None:
    pods = [
        {
            "metadata": {"namespace": "ns", "name": f"p{i}"},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": f"c{i}"}]},
        }
        for i in range(500)
    ]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        kept = [pod_claim_keys_inputs(pod) for pod in pods]
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    held = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert held / len(kept) < 256, held / len(kept)  # orjson's result alone held 4 KiB
    assert kept[0] == pod_claim_keys_inputs(copy.deepcopy(pods[0]))
    assert kept[0] != kept[1]
