"""Pure parts of the cluster layer: resource paths, helpers, indexes, the cache, the token bucket."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from driver.cluster import indexes
from driver.cluster.cache import IndexedCache
from driver.cluster.port import (
    LEASES,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    JsonObject,
    Resource,
    format_micro_time,
    format_time,
    gate_names,
    object_key,
    parse_time,
)
from driver.cluster.throttle import ClientSettings, TokenBucket
from tests.cluster.fakes import FakeClock, obj


@pytest.mark.parametrize(
    ("resource", "kwargs", "expected"),
    [
        (PODS, {"namespace": "ns"}, "/api/v1/namespaces/ns/pods"),
        (PODS, {}, "/api/v1/pods"),
        (
            PODS,
            {"namespace": "ns", "name": "p", "subresource": "status"},
            "/api/v1/namespaces/ns/pods/p/status",
        ),
        (NODES, {"name": "n1"}, "/api/v1/nodes/n1"),
        (
            RESOURCE_CLAIMS,
            {"namespace": "ns", "name": "c", "subresource": "status"},
            "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status",
        ),
        (RESOURCE_SLICES, {}, "/apis/resource.k8s.io/v1/resourceslices"),
        (
            LEASES,
            {"namespace": "kube-system", "name": "l"},
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l",
        ),
    ],
    ids=["pods-ns", "pods-all", "pod-status", "node", "claim-status", "slices", "lease"],
)
def test_resource_paths(resource: Resource, kwargs: dict[str, str], expected: str) -> None:
    assert resource.path(**kwargs) == expected


def test_cluster_scoped_resource_refuses_a_namespace() -> None:
    with pytest.raises(ValueError, match="cluster-scoped"):
        NODES.path(namespace="ns")
    assert RESOURCE_CLAIMS.api_version == "resource.k8s.io/v1"
    assert PODS.api_version == "v1"


def test_gate_names_and_keys() -> None:
    pod = obj("p", "1", spec={"schedulingGates": [{"name": "a"}, {"name": "b"}]})
    assert gate_names(pod) == ["a", "b"]
    assert gate_names(obj("q", "1")) == []
    assert object_key(pod) == "ns/p"
    assert object_key(obj("n", "1", namespace=None)) == "n"


def test_time_formats_round_trip() -> None:
    moment = datetime(2026, 5, 9, 7, 35, 25, 123456, tzinfo=UTC)
    assert format_time(moment) == "2026-05-09T07:35:25Z"
    assert format_micro_time(moment) == "2026-05-09T07:35:25.123456Z"
    assert parse_time(format_micro_time(moment)) == moment
    # the API server's RFC 3339: a zone as Z or an offset, nanoseconds cut to microseconds
    assert parse_time("2026-05-09T09:35:25.123456789+02:00") == moment
    for not_rfc3339 in ("2026-05-09T07:35:25", "2026-05-09", "yesterday"):
        with pytest.raises(ValueError, match="not an RFC 3339 time"):
            parse_time(not_rfc3339)


def _claim(*, node_field: str | None = None, hostname: str | None = None) -> JsonObject:
    term: JsonObject = {}
    if node_field:
        term["matchFields"] = [{"key": "metadata.name", "operator": "In", "values": [node_field]}]
    if hostname:
        term["matchExpressions"] = [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [hostname]}
        ]
    return obj(
        "c",
        "1",
        status={
            "allocation": {"nodeSelector": {"nodeSelectorTerms": [term]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}],
        },
    )


@pytest.mark.parametrize(
    ("claim", "nodes"),
    [
        (_claim(node_field="n1"), ["n1"]),
        (_claim(hostname="n2"), ["n2"]),
        (obj("c", "1"), []),
    ],
    ids=["match-fields", "hostname-label", "unallocated"],
)
def test_claim_node_index(claim: JsonObject, nodes: list[str]) -> None:
    assert list(indexes.claim_node_names(claim)) == nodes


def test_pod_and_claim_indexes() -> None:
    pod = obj(
        "p",
        "1",
        spec={"resourceClaims": [{"name": "a", "resourceClaimName": "direct"}, {"name": "b"}]},
        status={"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-x1"}]},
    )
    assert list(indexes.pod_claim_keys(pod)) == ["ns/direct", "ns/p-b-x1"]
    shadow = obj("s", "1", ownerReferences=None)
    shadow["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "uid": "u2"}]
    assert list(indexes.claim_pod_uids(shadow)) == ["u2"]
    assert list(indexes.claim_pod_uids(_claim(node_field="n"))) == ["u1"]
    assert list(indexes.spec_node_name({"spec": {"nodeName": "n3"}})) == ["n3"]


def test_cache_indexes_follow_updates_and_deletes_without_leftovers() -> None:
    cache = IndexedCache()
    cache.add_index("node", indexes.spec_node_name)
    baseline = cache.footprint()
    for round_ in range(50):
        for i in range(20):
            cache.upsert(obj(f"s{i}", str(round_), spec={"nodeName": f"n{i % 3}"}))
        cache.upsert(obj("s0", "x", spec={"nodeName": "moved"}))
        assert [o["metadata"]["name"] for o in cache.by_index("node", "moved")] == ["s0"]
        assert "s0" not in [o["metadata"]["name"] for o in cache.by_index("node", "n0")]
        for i in range(20):
            cache.remove(obj(f"s{i}", ""))
    assert len(cache) == 0
    assert cache.index_values("node") == []
    assert cache.footprint() == baseline


def test_index_added_late_covers_existing_objects() -> None:
    cache = IndexedCache()
    cache.upsert(obj("a", "1", spec={"nodeName": "n1"}))
    cache.add_index("node", indexes.spec_node_name)
    assert [o["metadata"]["name"] for o in cache.by_index("node", "n1")] == ["a"]
    with pytest.raises(ValueError, match="already exists"):
        cache.add_index("node", indexes.spec_node_name)
    with pytest.raises(KeyError):
        cache.by_index("nope", "x")


def test_index_with_inputs_skips_the_function_only_when_its_inputs_are_unchanged() -> None:
    calls: list[str] = []

    def keys(pod: JsonObject) -> list[str]:
        calls.append(pod["metadata"]["resourceVersion"])
        return list(indexes.pod_claim_keys(pod))

    cache = IndexedCache()
    cache.add_index("claim", keys, inputs=indexes.pod_claim_keys_inputs)
    claims = {"resourceClaims": [{"name": "a", "resourceClaimName": "c1"}]}
    cache.upsert(obj("p", "1", spec=claims))
    cache.upsert(obj("p", "2", spec=claims, status={"nominatedNodeName": "n"}))  # status only
    assert calls == ["1"]
    assert [o["metadata"]["resourceVersion"] for o in cache.by_index("claim", "ns/c1")] == ["2"]
    moved = {"resourceClaims": [{"name": "a", "resourceClaimName": "c2"}]}
    cache.upsert(obj("p", "3", spec=moved))
    assert calls == ["1", "3"]
    assert cache.by_index("claim", "ns/c1") == []
    assert [o["metadata"]["resourceVersion"] for o in cache.by_index("claim", "ns/c2")] == ["3"]
    generated = {"resourceClaimStatuses": [{"name": "a", "resourceClaimName": "g"}]}
    cache.upsert(obj("p", "4", spec=moved, status=generated))
    assert calls == ["1", "3", "4"]
    cache.remove(obj("p", ""))
    cache.upsert(obj("p", "5", spec=moved))  # re-created: indexed afresh
    assert calls == ["1", "3", "4", "5"]
    assert [o["metadata"]["resourceVersion"] for o in cache.by_index("claim", "ns/c2")] == ["5"]
    # ``==`` would take 1 for true; the inputs do not
    assert indexes.pod_claim_keys_inputs(obj("p", "1", spec={"resourceClaims": [1]})) != (
        indexes.pod_claim_keys_inputs(obj("p", "1", spec={"resourceClaims": [True]}))
    )
    shadow = obj("s", "1", status={"reservedFor": [{"resource": "pods", "uid": "u1"}]})
    assert indexes.claim_pod_uids_inputs(shadow) != indexes.claim_pod_uids_inputs(
        obj("s", "2", status={"reservedFor": [{"resource": "pods", "uid": "u2"}]})
    )
    assert indexes.claim_pod_uids_inputs(shadow) == indexes.claim_pod_uids_inputs(
        obj("s", "2", status={"reservedFor": [{"resource": "pods", "uid": "u1"}], "x": 1})
    )


def test_token_bucket_allows_a_burst_then_spaces_requests_at_qps() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=10, burst=3, clock=clock)
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve() == pytest.approx(0.1)
    assert bucket.reserve() == pytest.approx(0.2)
    clock.advance(1.0)
    assert bucket.reserve() == 0.0  # refilled (capped at burst) after the wait


def test_token_bucket_disabled_and_settings_validated() -> None:
    assert TokenBucket(qps=0, burst=1, clock=FakeClock()).reserve() == 0.0
    with pytest.raises(ValueError, match="burst"):
        ClientSettings(burst=0)
