"""Typed views: lenient parsing of wire JSON, one reading per field, parse once per cached version."""

from __future__ import annotations

import copy
from typing import Any

from driver.cluster import views
from driver.cluster.cache import IndexedCache
from driver.cluster.views import ClaimView, DeviceClassView, NodeView, PodView, SliceView


def _claim(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "c",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": "7",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "pod-1"}],
            "finalizers": ["resource.kubernetes.io/delete-protection"],
        },
        "spec": {
            "devices": {
                "requests": [
                    {"name": "a", "exactly": {"deviceClassName": "mig-1g.5gb", "count": 2}},
                    {
                        "name": "b",
                        "firstAvailable": [
                            {"name": "big", "deviceClassName": "mig-3g.20gb"},
                            {"name": "small", "deviceClassName": "mig-2g.10gb"},
                        ],
                    },
                ],
                "config": [{"requests": ["a"], "opaque": {"driver": "d", "parameters": {"x": 1}}}],
            }
        },
        "status": status,
    }


ALLOCATION = {
    "devices": {
        "results": [
            {"request": "a", "driver": "mig.nvidia.com", "pool": "n1", "device": "gpu-0-mig-1"},
            {"request": "a", "driver": "other", "pool": "n1", "device": "x"},
            "not an object",
        ],
        "config": [{"source": "FromClass", "opaque": {"driver": "mig.nvidia.com"}}],
    },
    "nodeSelector": {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
        ]
    },
}


def test_claim_view_reads_spec_allocation_and_reservations() -> None:
    claim = _claim(
        allocation=ALLOCATION,
        reservedFor=[
            {"resource": "pods", "name": "p", "uid": "pod-1"},
            {"apiGroup": "batch", "resource": "jobs", "name": "j", "uid": "job-1"},
        ],
    )
    view = ClaimView.of(claim)
    assert view.key == "ns/c"
    assert view.raw is claim
    assert view.spec.device_class_names() == ("mig-1g.5gb", "mig-3g.20gb", "mig-2g.10gb")
    assert view.spec.requests[0].exactly is not None
    assert view.spec.requests[0].exactly.count == 2
    assert [a.name for a in view.spec.requests[1].alternatives] == ["big", "small"]
    assert view.spec.config[0].driver == "d"
    assert view.allocated
    assert view.devices_of("mig.nvidia.com") == (("n1", "gpu-0-mig-1"),)
    assert len(view.allocation.results if view.allocation else ()) == 2
    assert view.node_names() == ("n1",)
    assert view.reserved_pod_uids() == ("pod-1",)
    assert view.meta.owner_pod_uids() == ("pod-1",)


def test_views_never_fail_on_missing_or_mistyped_fields() -> None:
    junk: dict[str, Any] = {
        "metadata": {"name": 5, "labels": ["x"], "ownerReferences": "no"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": "no"}, 3]}},
        "status": {"allocation": {"devices": {"results": None}}, "reservedFor": {}},
    }
    view = ClaimView.of(junk)
    assert view.name == "5"
    assert view.meta.labels == {}
    assert view.spec.requests[0].exactly is None
    assert view.allocated  # an allocation object without results is still an allocation
    assert view.devices_of("mig.nvidia.com") == ()
    assert ClaimView.of({}).allocation is None
    assert PodView.of({}).all_containers == ()
    assert SliceView.of({"spec": []}).devices == ()
    assert NodeView.of({"status": {"conditions": [1]}}).ready is False
    assert DeviceClassView.of({}).extended_resource_name is None


def test_pod_view_walks_containers_once_and_resolves_claims() -> None:
    pod: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "pod-1"},
        "spec": {
            "schedulingGates": [{"name": "instaslice.dev/placement"}],
            "initContainers": [
                {"name": "side", "restartPolicy": "Always", "resources": {"limits": {"a": "1"}}}
            ],
            "containers": [
                {
                    "name": "main",
                    "resources": {
                        "requests": {"nvidia.com/mig-1g.5gb": "1", "cpu": "1"},
                        "limits": {"nvidia.com/mig-1g.5gb": "2"},
                        "claims": [{"name": "gpu"}],
                    },
                }
            ],
            "resourceClaims": [
                {"name": "gpu", "resourceClaimTemplateName": "t"},
                {"name": "direct", "resourceClaimName": "shared"},
                {"name": "unneeded", "resourceClaimTemplateName": "t2"},
            ],
        },
        "status": {
            "resourceClaimStatuses": [
                {"name": "gpu", "resourceClaimName": "p-gpu-x"},
                {"name": "unneeded", "resourceClaimName": None},
            ],
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        },
    }
    view = PodView.of(pod)
    assert [c.name for c in view.all_containers] == ["side", "main"]
    assert view.all_containers[0].sidecar
    assert view.containers[0].amounts() == {"nvidia.com/mig-1g.5gb": "2", "cpu": "1"}
    assert view.containers[0].claims == ("gpu",)
    assert view.gated_by("instaslice.dev/placement")
    assert view.requests_resource(lambda r: r.startswith("nvidia.com/mig-"))
    refs = {r.name: r for r in view.claim_refs}
    assert view.claim_name_of(refs["gpu"]) == "p-gpu-x"
    assert view.claim_name_of(refs["direct"]) == "shared"
    assert view.claim_name_of(refs["unneeded"]) is None
    assert view.claim_keys() == ("ns/shared", "ns/p-gpu-x")
    scheduled = view.condition("PodScheduled")
    assert scheduled is not None
    assert scheduled.reason == "Unschedulable"
    assert not scheduled.true


def test_slice_view_reads_devices_counters_and_taints() -> None:
    obj = {
        "metadata": {"name": "s"},
        "spec": {
            "driver": "mig.nvidia.com",
            "pool": {"name": "n1", "generation": 3, "resourceSliceCount": 1},
            "nodeName": "n1",
            "sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": "8"}}}],
            "devices": [
                {
                    "name": "gpu-0-1g",
                    "attributes": {"profile": {"string": "1g.5gb"}, "index": {"int": 0}},
                    "capacity": {"memory": {"value": "5Gi"}},
                    "consumesCounters": [
                        {"counterSet": "gpu-0", "counters": {"memory": {"value": "1"}}}
                    ],
                    "taints": [{"key": "k", "effect": "NoSchedule", "timeAdded": "t"}],
                }
            ],
        },
    }
    view = SliceView.of(obj)
    assert (view.driver, view.pool, view.pool_generation, view.node) == (
        "mig.nvidia.com",
        "n1",
        3,
        "n1",
    )
    device = view.devices[0]
    assert device.attributes == {"profile": "1g.5gb", "index": 0}
    assert device.capacity == {"memory": "5Gi"}
    assert device.consumes[0].counters == {"memory": "1"}
    assert device.taints[0].effect == "NoSchedule"
    assert view.shared_counters[0].counters == {"memory": "8"}


def test_node_selector_pinning() -> None:
    selector = views.NodeSelector.parse(
        {
            "nodeSelectorTerms": [
                {
                    "matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": ["a", "b"]}
                    ],
                    "matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["b", "c"]}
                    ],
                }
            ]
        }
    )
    assert selector is not None
    assert selector.node_names() == ("a", "b", "c")
    assert selector.pinned_names() == frozenset({"b"})
    open_selector = views.NodeSelector.parse(
        {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In"}]}]}
    )
    assert open_selector is not None
    assert open_selector.pinned_names() is None


def test_tolerations_follow_kubernetes_rules() -> None:
    taint = views.Taint(key="k", value="v", effect="NoSchedule", time_added="")
    assert views.Toleration.parse({"operator": "Exists"}).tolerates(taint)
    assert views.Toleration.parse({"key": "k", "value": "v"}).tolerates(taint)
    assert not views.Toleration.parse({"key": "k", "value": "w"}).tolerates(taint)
    assert views.Toleration.parse({"key": "k", "operator": "Exists"}).tolerates(taint)
    assert not views.Toleration.parse(
        {"key": "k", "effect": "NoExecute", "operator": "Exists"}
    ).tolerates(taint)


def test_cached_objects_are_parsed_once_per_version_and_released() -> None:
    cache = IndexedCache()
    before = views.memo_size()
    v1 = _claim()
    cache.upsert(v1)
    first = ClaimView.of(v1)
    assert ClaimView.of(v1) is first  # parsed once while cached
    assert views.memo_size() == before + 1

    v2 = copy.deepcopy(v1)
    v2["metadata"]["resourceVersion"] = "8"
    v2["status"] = {"allocation": ALLOCATION}
    cache.upsert(v2)
    assert views.memo_size() == before  # the replaced version is forgotten
    second = ClaimView.of(v2)
    assert second.allocated
    assert ClaimView.of(v1) is not first  # no longer cached: parsed afresh
    assert ClaimView.of(v1).allocation is None

    cache.remove(v2)
    assert views.memo_size() == before
    assert ClaimView.of(v2) is not second


def test_objects_outside_a_cache_are_never_kept() -> None:
    before = views.memo_size()
    obj = _claim()
    first = ClaimView.of(obj)
    assert ClaimView.of(obj) is not first
    assert views.memo_size() == before


def test_lease_view_reads_spec_and_defaults_to_zero_values() -> None:
    lease = views.LeaseView.of(
        {
            "metadata": {"name": "l", "namespace": "ns"},
            "spec": {
                "holderIdentity": "me",
                "leaseDurationSeconds": 15,
                "acquireTime": "2026-01-01T00:00:00.000000Z",
                "renewTime": "2026-01-01T00:00:05.000000Z",
                "leaseTransitions": 2,
            },
        }
    )
    assert (lease.meta.key, lease.holder_identity, lease.lease_duration_seconds) == (
        "ns/l",
        "me",
        15,
    )
    assert (lease.acquire_time, lease.renew_time, lease.lease_transitions) == (
        "2026-01-01T00:00:00.000000Z",
        "2026-01-01T00:00:05.000000Z",
        2,
    )
    empty = views.LeaseView.of({"metadata": {"name": "l"}, "spec": None})
    assert (empty.spec, empty.holder_identity, empty.lease_duration_seconds) == ({}, "", 0)
    assert (empty.acquire_time, empty.lease_transitions) == ("", 0)


def test_pod_view_reads_status_reason_and_message() -> None:
    pod = {"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": "m"}}
    view = PodView.of(pod)
    assert (view.phase, view.reason, view.message) == ("Failed", "UnexpectedAdmissionError", "m")
    assert (PodView.of({}).reason, PodView.of({}).message) == ("", "")


def test_lease_view_reads_holder_and_times() -> None:
    lease = {
        "metadata": {"name": "l", "namespace": "ns", "annotations": {"a": "node-1"}},
        "spec": {
            "holderIdentity": "plugin_1",
            "acquireTime": "2026-01-01T00:00:00.000000Z",
            "renewTime": "2026-01-01T00:00:05.000000Z",
            "leaseDurationSeconds": 15,
        },
    }
    view = views.LeaseView.of(lease)
    assert view.meta.annotations == {"a": "node-1"}
    assert (view.holder_identity, view.acquire_time) == ("plugin_1", "2026-01-01T00:00:00.000000Z")
    assert (view.renew_time, view.lease_duration_seconds) == ("2026-01-01T00:00:05.000000Z", 15)
    empty = views.LeaseView.of({"spec": {"holderIdentity": None}})
    assert (empty.holder_identity, empty.acquire_time, empty.lease_duration_seconds) == ("", "", 0)


def test_claim_spec_reads_tolerations_capacity_and_constraints() -> None:
    claim = _claim()
    devices = claim["spec"]["devices"]
    devices["requests"][0]["exactly"]["tolerations"] = [{"key": "k", "operator": "Exists"}]
    devices["requests"][0]["exactly"]["capacity"] = {"requests": {"memory": "1Gi"}}
    devices["constraints"] = [
        {"requests": ["a", "b/big"], "matchAttribute": "mig.nvidia.com/parentUUID"},
        {"distinctAttribute": "mig.nvidia.com/gpuIndex"},
        {"requests": ["a"]},
    ]
    spec = ClaimView.of(claim).spec
    exactly = spec.requests[0].exactly
    assert exactly is not None
    assert exactly.tolerations == [{"key": "k", "operator": "Exists"}]
    assert exactly.capacity_requests == {"memory": "1Gi"}
    assert spec.requests[1].first_available[0].tolerations is None
    assert spec.requests[1].first_available[0].capacity_requests == {}
    match, distinct, empty = spec.device_constraints()
    assert (match.requests, match.attribute, match.distinct) == (
        ("a", "b/big"),
        "mig.nvidia.com/parentUUID",
        False,
    )
    assert (distinct.requests, distinct.attribute, distinct.distinct) == (
        (),
        "mig.nvidia.com/gpuIndex",
        True,
    )
    assert (empty.attribute, empty.distinct) == ("", False)


def test_consumers_keep_the_entry_as_written() -> None:
    entry = {"resource": "pods", "name": "p", "uid": "pod-1", "extra": "kept"}
    (consumer,) = ClaimView.of(_claim(reservedFor=[entry, "junk"])).reserved_for
    assert consumer.raw == entry
    assert consumer.is_pod
