"""Inventory from slices, occupancy from claims (the assume cache's rules), candidates, node
filter: the allocator's state pieces without an API server."""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import pytest

from api.names import DRIVER_NAME
from controller.allocation.candidates import CandidateCache
from controller.allocation.inventory import SliceInventory, gpu_model_of
from controller.allocation.nodefilter import NodeFilter, node_info, pod_usage, static_fit
from controller.allocation.occupancy import ClaimOccupancy
from controller.allocation.state import AllocationState, SliceState
from driver.cluster.port import as_json
from driver.mig.catalog import CATALOG
from driver.placement import Engine, PodRequest
from driver.resourceslices import GpuInventory, build_pool, parse_devices
from tests.controller.harness import node_object, pod_object

A100 = CATALOG["A100-40GB"]


def _slices(node: str, *, gpus: int = 1, generation: int = 1) -> list[dict[str, Any]]:
    inventory = [
        GpuInventory(
            index=i,
            uuid=f"GPU-{node}-{i}",
            product_name=A100.product_name,
            memory_slices=A100.memory_slices,
            profiles=A100.profiles,
        )
        for i in range(gpus)
    ]
    out = build_pool(node=node, gpus=inventory, generation=generation)
    for i, obj in enumerate(out):
        obj["metadata"]["resourceVersion"] = str(i + 1)
    return [as_json(obj) for obj in out]


def _state(*nodes: str) -> tuple[Engine, SliceInventory, ClaimOccupancy]:
    engine = Engine()
    inventory = SliceInventory(engine)
    for node in nodes:
        for obj in _slices(node):
            inventory.slice_changed(obj)
    inventory.refresh()
    return engine, inventory, ClaimOccupancy(engine=engine, inventory=inventory)


def _claim(uid: str, rv: int, *devices: tuple[str, str]) -> dict[str, Any]:
    claim: dict[str, Any] = {
        "metadata": {
            "name": f"claim-{uid}",
            "namespace": "ns",
            "uid": uid,
            "resourceVersion": str(rv),
        },
        "spec": {},
    }
    if devices:
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "r", "driver": DRIVER_NAME, "pool": p, "device": d}
                        for p, d in devices
                    ]
                }
            }
        }
    return claim


def test_the_gpu_model_read_back_from_slices_is_the_catalogs() -> None:
    model = gpu_model_of(parse_devices(_slices("n")))
    assert model.memory_slices == A100.memory_slices
    assert model.product_name == A100.product_name
    for mine, theirs in zip(model.profiles, A100.profiles, strict=True):
        assert (mine.name, mine.placements, mine.max_count, mine.media_extensions) == (
            theirs.name,
            theirs.placements,
            theirs.max_count,
            theirs.media_extensions,
        )


def test_only_complete_pools_count_and_a_half_published_generation_keeps_the_last() -> None:
    engine = Engine()
    inventory = SliceInventory(engine)
    first = _slices("n", gpus=2)
    for obj in first[:-1]:
        inventory.slice_changed(obj)
    assert inventory.refresh() == set()
    assert not inventory.has_node("n")
    inventory.slice_changed(first[-1])
    assert inventory.refresh() == {"n"}
    assert engine.free_instances("1g.5gb") == 14
    # the publisher rewrites its slices in place (same names) for generation 2, one GPU fewer
    newer = _slices("n", gpus=1, generation=2)
    inventory.slice_changed(newer[0])  # the counter slice of generation 2 alone: incomplete
    assert inventory.refresh() == set()
    assert engine.free_instances("1g.5gb") == 14
    inventory.slice_changed(newer[1])
    assert inventory.refresh() == {"n"}
    inventory.slice_deleted(first[-1])  # the stale slice of GPU 1 goes last
    assert inventory.refresh() == set()
    assert engine.free_instances("1g.5gb") == 7


def test_observed_allocations_occupy_and_deallocations_free() -> None:
    engine, _, occupancy = _state("n")
    assert occupancy.observe(_claim("a", 10, ("n", "gpu-0-7g-40gb-0"))) is False
    assert engine.free_instances("1g.5gb") == 0
    assert occupancy.observe(_claim("a", 11)) is True
    assert engine.free_instances("1g.5gb") == 7


def test_an_assumption_survives_stale_events_and_goes_with_a_failed_write() -> None:
    engine, _, occupancy = _state("n")
    occupancy.assume(uid="a", key="ns/a", devices=[("n", "gpu-0-4g-20gb-0")])
    assert occupancy.observe(_claim("a", 5)) is False  # the watch lags: still reserved
    assert engine.free_instances("4g.20gb") == 0
    occupancy.written(uid="a", resource_version=9)
    assert occupancy.observe(_claim("a", 8)) is False  # older than our write
    assert engine.free_instances("4g.20gb") == 0
    assert occupancy.observe(_claim("a", 12)) is True  # newer and unallocated: released
    occupancy.assume(uid="b", key="ns/b", devices=[("n", "gpu-0-4g-20gb-0")])
    assert occupancy.unassume("b") is True
    assert engine.free_instances("4g.20gb") == 1


def test_an_observed_allocation_is_never_replaced_by_an_assumption() -> None:
    _, _, occupancy = _state("n")
    occupancy.observe(_claim("a", 3, ("n", "gpu-0-1g-5gb-0")))
    assert occupancy.known_allocated("a")
    with pytest.raises(ValueError, match="allocated already"):
        occupancy.assume(uid="a", key="ns/a", devices=[("n", "gpu-0-1g-5gb-1")])
    occupancy.assume(uid="b", key="ns/b", devices=[("n", "gpu-0-1g-5gb-1")])
    occupancy.observe(_claim("b", 7, ("n", "gpu-0-1g-5gb-2")))  # someone else's allocation won
    assert occupancy.unassume("b") is False
    record = occupancy.record("b")
    assert record is not None
    assert record.devices == (("n", "gpu-0-1g-5gb-2"),)


def test_claims_seen_before_their_slices_occupy_once_published() -> None:
    engine = Engine()
    inventory = SliceInventory(engine)
    occupancy = ClaimOccupancy(engine=engine, inventory=inventory)
    occupancy.observe(_claim("a", 3, ("n", "gpu-0-3g-20gb-4")))
    for obj in _slices("n"):
        inventory.slice_changed(obj)
    for node in inventory.refresh():
        occupancy.node_refreshed(node)
    assert engine.free_instances("3g.20gb") == 1


@pytest.mark.parametrize(
    ("first", "second", "overlap"),
    [
        ("gpu-0-3g-20gb-0", "gpu-0-1g-5gb-2", True),
        ("gpu-0-3g-20gb-0", "gpu-0-1g-5gb-4", False),
        ("gpu-0-1g-5gb-me-0", "gpu-0-1g-5gb-me-3", True),
        ("gpu-0-7g-40gb-0", "gpu-1-7g-40gb-0", False),
    ],
    ids=["slices", "disjoint", "media-engine", "other-gpu"],
)
def test_overlaps_are_found_by_memory_slice_and_media_engine(
    first: str, second: str, overlap: bool
) -> None:
    engine = Engine()
    inventory = SliceInventory(engine)
    for obj in _slices("n", gpus=2):
        inventory.slice_changed(obj)
    inventory.refresh()
    occupancy = ClaimOccupancy(engine=engine, inventory=inventory)
    occupancy.observe(_claim("a", 3, ("n", first)))
    occupancy.observe(_claim("b", 4, ("n", second)))
    assert [r.uid for r in occupancy.overlapping("a")] == (["b"] if overlap else [])


def test_candidates_need_a_predicate_only_when_a_profile_matches_in_part() -> None:
    _, inventory, _ = _state("n", "m")
    cache = CandidateCache(inventory)
    driver = f'device.driver == "{DRIVER_NAME}"'
    device_class = {"metadata": {"name": "c", "uid": "1", "resourceVersion": "1"},
                    "spec": {"selectors": [{"cel": {"expression": driver}}]}}  # fmt: skip
    profile = f'device.attributes["{DRIVER_NAME}"].profile == "2g.10gb"'
    whole = cache.candidates(device_class, [profile])
    assert whole.profiles == {"2g.10gb"}
    assert whole.complete
    assert whole.per_node == {"n": 3, "m": 3}
    partial = cache.candidates(
        device_class, [profile, 'device.attributes["mig.instaslice.dev"].placementStart == 4']
    )
    assert not partial.complete
    assert partial.matched == {("n", "gpu-0-2g-10gb-4"), ("m", "gpu-0-2g-10gb-4")}
    assert cache.candidates(device_class, [profile]) is whole  # cached


NODE = node_info(
    node_object("n", cpu="4", memory="8Gi", labels={"zone": "a", "gpus": "8"},
                taints=[{"key": "k", "value": "v", "effect": "NoSchedule"},
                        {"key": "soft", "effect": "PreferNoSchedule"}])
)  # fmt: skip
TOLERATE = {"tolerations": [{"key": "k", "operator": "Equal", "value": "v"}]}


def _affinity(
    *expressions: dict[str, Any], fields: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    term: dict[str, Any] = {"matchExpressions": list(expressions)}
    if fields:
        term["matchFields"] = fields
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        }
    }


@pytest.mark.parametrize(
    ("spec", "fits"),
    [
        ({}, False),
        (TOLERATE, True),
        ({"tolerations": [{"operator": "Exists"}]}, True),
        ({"tolerations": [{"key": "k", "operator": "Equal", "value": "w"}]}, False),
        ({**TOLERATE, "nodeSelector": {"zone": "a"}}, True),
        ({**TOLERATE, "nodeSelector": {"zone": "b"}}, False),
        ({**TOLERATE, **_affinity({"key": "zone", "operator": "In", "values": ["a", "b"]})}, True),
        ({**TOLERATE, **_affinity({"key": "zone", "operator": "NotIn", "values": ["a"]})}, False),
        ({**TOLERATE, **_affinity({"key": "gpus", "operator": "Gt", "values": ["4"]})}, True),
        ({**TOLERATE, **_affinity({"key": "gpus", "operator": "Lt", "values": ["4"]})}, False),
        ({**TOLERATE, **_affinity({"key": "missing", "operator": "DoesNotExist"})}, True),
        ({**TOLERATE, **_affinity(fields=[{"key": "metadata.name", "operator": "In", "values": ["x"]}])}, False),
    ],
    ids=["untolerated-taint", "tolerated", "tolerate-all", "wrong-value", "selector", "selector-miss",
         "in", "not-in", "gt", "lt", "does-not-exist", "match-fields"],
)  # fmt: skip
def test_static_fit(spec: dict[str, Any], fits: bool) -> None:
    pod = pod_object("p", **spec)
    assert (static_fit(pod, NODE) is None) is fits


def test_resources_count_bound_and_assumed_pods() -> None:
    nodes = NodeFilter()
    nodes.node_changed(node_object("n", cpu="2", memory="1Gi"))
    big = pod_object("big", cpu="1500m")
    assert pod_usage(big) == {"cpu": 1500, "pods": 1}
    bound = copy.deepcopy(pod_object("bound", cpu="1"))
    bound["metadata"]["uid"] = "u-bound"
    bound["spec"]["nodeName"] = "n"
    nodes.pod_changed(bound)
    assert nodes.why_not(big, "n") == "node n has not enough cpu left"
    assert nodes.why_not(pod_object("small", cpu="1"), "n") is None
    nodes.assume({**pod_object("assumed", cpu="1"), "metadata": {"uid": "u-assumed"}}, "n")
    assert nodes.why_not(pod_object("small", cpu="1"), "n") == "node n has not enough cpu left"
    nodes.pod_deleted(bound)
    assert nodes.why_not(pod_object("small", cpu="1"), "n") is None
    assert nodes.why_not(pod_object("p"), "ghost") == "node ghost has no Node object"


def test_extended_resources_must_be_offered_and_left() -> None:
    nodes = NodeFilter()
    offering = node_object("n")
    offering["status"]["allocatable"]["nvidia.com/mig-1g.5gb"] = "2"
    nodes.node_changed(offering)
    nodes.node_changed(node_object("bare"))
    pod = pod_object("classic", classic={"nvidia.com/mig-1g.5gb": 2})
    assert nodes.why_not(pod, "n") is None
    assert nodes.why_not(pod, "bare") == "node bare does not offer nvidia.com/mig-1g.5gb"
    nodes.assume(
        {**pod_object("other", classic={"nvidia.com/mig-1g.5gb": 1}), "metadata": {"uid": "o"}}, "n"
    )
    assert nodes.why_not(pod, "n") == "node n has not enough nvidia.com/mig-1g.5gb left"


def test_init_containers_count_at_their_maximum_and_sidecars_add_up() -> None:
    pod = pod_object("p", cpu="1")
    pod["spec"]["initContainers"] = [
        {"name": "init", "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}},
        {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
    ]
    assert pod_usage(pod) == {"cpu": 3000, "memory": 1 << 30, "pods": 1}
    assert PodRequest.single("1g.5gb").device_count == 1


def test_a_claim_event_wakes_only_the_workers_whose_write_it_covers() -> None:
    state = AllocationState(policy="firstfit")
    woken: dict[int, bool] = {}

    def wait(rv: int) -> None:
        woken[rv] = state.wait_claims_seen(rv, timeout=30)

    threads = {rv: threading.Thread(target=wait, args=(rv,)) for rv in (5, 10)}
    for thread in threads.values():
        thread.start()
    while len(state._waiters) < 2:  # both registered
        time.sleep(0.001)
    state._advance(7)
    threads[5].join(10)
    assert woken == {5: True}
    assert [entry[0] for entry in state._waiters] == [10]
    state._advance(10)
    threads[10].join(10)
    assert woken == {5: True, 10: True}
    assert state.wait_claims_seen(3, timeout=0)  # already seen: no wait
    assert not state.wait_claims_seen(11, timeout=0.01)  # timed out: its entry is gone
    assert state._waiters == []


def test_the_webhooks_slice_state_answers_as_the_allocators_without_views_or_engine() -> None:
    full = AllocationState(policy="firstfit")
    light = SliceState()
    slices = _slices("n1", gpus=2) + _slices("n2", gpus=1)
    broken = copy.deepcopy(slices[1])  # a device whose attribute is malformed is skipped by both
    broken["spec"]["devices"][0]["attributes"]["profile"] = {"string": 7}
    for obj in [*slices[:1], broken, *slices[2:]]:
        full.slice_changed(obj)
        light.slice_changed(obj)
    with full.lock, light.lock:
        assert full.refresh() == light.refresh() == {"n1", "n2"}
    assert light.inventory.nodes() == full.inventory.nodes() == ["n1", "n2"]
    assert light.inventory.profile_names() == full.inventory.profile_names()
    for profile in A100.profile_names:
        assert light.inventory.max_per_gpu(profile) == full.inventory.max_per_gpu(profile)
    dropped = broken["spec"]["devices"][0]["name"]
    assert full.inventory.device("n1", dropped) is None
    assert light.inventory.device("n1", dropped) is None
    assert list(full.inventory.views())
    assert not list(light.inventory.views())
    assert not hasattr(light, "engine")
