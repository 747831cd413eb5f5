"""Contract: ``pods/eviction`` honours PodDisruptionBudgets as kube-apiserver does — refused with
429 when a budget allows no disruption, allowed (and counted) otherwise, pods that are not Ready
or not running evictable by kube's rules, and the pod deleted with the eviction's options."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from driver.cluster import POD_DISRUPTION_BUDGETS, PODS, WatchEventType
from driver.cluster.kube import KubeClusterApi, configuration_for_url
from driver.cluster.throttle import ClientSettings
from driver.errors import ApiNotFoundError, ConflictError, TooManyRequestsError
from localcluster.apiserver import LocalApiServer
from localcluster.errors import ApiError
from localcluster.policy.eviction import EvictionOptions, evict_pod
from localcluster.resources import POD_DISRUPTION_BUDGETS as STORED_BUDGETS
from localcluster.resources import PODS as STORED_PODS
from localcluster.store import Store
from localcluster.testing import api_client, close_client
from tests.localcluster.budgets import counts, replica_set, settled_status, start_pod
from tests.localcluster.helpers import NS, budget, pod, pod_status, status_of

VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."


def _client(url: str) -> KubeClusterApi:
    return KubeClusterApi(
        configuration=configuration_for_url(url),
        settings=ClientSettings(qps=0, request_timeout=10.0),
    )


@pytest.fixture
def api(apiserver: LocalApiServer) -> Iterator[KubeClusterApi]:
    with _client(apiserver.url) as client_api:
        yield client_api


def _core(kube_client: Any) -> Any:
    """The typed ``kubernetes`` client as the other contract tests hold it (bodies as dicts)."""
    return client.CoreV1Api(kube_client)


def _names(api: KubeClusterApi) -> set[str]:
    return {p["metadata"]["name"] for p in api.list_objects(PODS, namespace=NS).items}


def _protect(api: KubeClusterApi, apiserver: LocalApiServer, **spec: Any) -> None:
    api.create(POD_DISRUPTION_BUDGETS, budget(**spec), namespace=NS)
    assert apiserver.settle()


def _eviction(name: str, **delete_options: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": NS},
    }
    if delete_options:
        body["deleteOptions"] = delete_options
    return body


def test_an_eviction_the_budget_allows_deletes_the_pod(
    api: KubeClusterApi, apiserver: LocalApiServer
) -> None:
    for name in ("p0", "p1", "p2"):
        start_pod(api, name)
    _protect(api, apiserver, minAvailable=2)

    api.evict(name="p0", namespace=NS)

    assert _names(api) == {"p1", "p2"}
    assert counts(settled_status(api, apiserver)) == (2, 2, 2, 0)


def test_an_eviction_that_would_violate_the_budget_is_429(
    api: KubeClusterApi, apiserver: LocalApiServer, kube_client: Any
) -> None:
    for name in ("p0", "p1", "p2"):
        start_pod(api, name)
    _protect(api, apiserver, minAvailable=3)

    with pytest.raises(TooManyRequestsError, match="violate the pod's disruption budget"):
        api.evict(name="p0", namespace=NS)
    with pytest.raises(ApiException) as caught:
        _core(kube_client).create_namespaced_pod_eviction("p1", NS, _eviction("p1"))

    status = status_of(caught.value)
    assert caught.value.status == 429
    assert (status["reason"], status["message"]) == ("TooManyRequests", VIOLATION)
    assert status["details"]["causes"] == [
        {
            "reason": "DisruptionBudget",
            "message": "The disruption budget web needs 3 healthy pods and has 3 currently",
        }
    ]
    assert _names(api) == {"p0", "p1", "p2"}
    conditions = api.get(PODS, name="p0", namespace=NS)["status"]["conditions"]
    assert "DisruptionTarget" not in [c["type"] for c in conditions]


@pytest.mark.parametrize(
    ("spec", "replicas", "evictable"),
    [
        ({"minAvailable": 2}, None, 2),
        ({"minAvailable": "50%"}, 4, 2),
        ({"minAvailable": "75%"}, 4, 1),
        ({"maxUnavailable": 1}, 4, 1),
        ({"maxUnavailable": "50%"}, 4, 2),
        ({"maxUnavailable": "0%"}, 4, 0),
        ({"maxUnavailable": 1}, None, 0),
    ],
    ids=[
        "min-int",
        "min-percent",
        "min-percent-rounds-up",
        "max-int",
        "max-percent",
        "max-zero-percent",
        "max-of-unmanaged-pods",
    ],
)
def test_evictions_stop_where_the_budget_does(
    api: KubeClusterApi,
    apiserver: LocalApiServer,
    spec: dict[str, Any],
    replicas: int | None,
    evictable: int,
) -> None:
    """Back to back, as a drain does: each allowed eviction uses the budget up at once."""
    owner = replica_set(api, replicas=replicas) if replicas is not None else None
    names = [f"p{i}" for i in range(4)]
    for name in names:
        start_pod(api, name, owner=owner)
    _protect(api, apiserver, **spec)

    evicted, refused = [], []
    for name in names:
        try:
            api.evict(name=name, namespace=NS)
            evicted.append(name)
        except TooManyRequestsError:
            refused.append(name)

    assert evicted == names[:evictable]
    assert refused == names[evictable:]


def test_concurrent_evictions_take_one_disruption_each(
    api: KubeClusterApi, apiserver: LocalApiServer
) -> None:
    owner = replica_set(api, replicas=6)
    names = [f"p{i}" for i in range(6)]
    for name in names:
        start_pod(api, name, owner=owner)
    _protect(api, apiserver, maxUnavailable=2)
    outcomes: dict[str, str] = {}
    start = threading.Barrier(len(names))

    def evict(name: str) -> None:
        with _client(apiserver.url) as own:
            start.wait()
            try:
                own.evict(name=name, namespace=NS)
                outcomes[name] = "evicted"
            except TooManyRequestsError:
                outcomes[name] = "refused"

    threads = [threading.Thread(target=evict, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(outcomes.values()) == ["evicted"] * 2 + ["refused"] * 4
    assert len(_names(api)) == 4


def test_the_eviction_records_the_pod_in_disrupted_pods(
    api: KubeClusterApi, apiserver: LocalApiServer
) -> None:
    for name in ("p0", "p1"):
        start_pod(api, name)
    _protect(api, apiserver, minAvailable=1)
    since = api.get(POD_DISRUPTION_BUDGETS, name="web", namespace=NS)["metadata"]["resourceVersion"]

    api.evict(name="p0", namespace=NS)
    assert apiserver.settle()

    with api.watch(
        POD_DISRUPTION_BUDGETS, resource_version=since, namespace=NS, timeout_seconds=1
    ) as stream:
        written = [e.object["status"] for e in stream if e.type is WatchEventType.MODIFIED]
    assert written[0]["disruptionsAllowed"] == 0
    assert list(written[0]["disruptedPods"]) == ["p0"]
    assert written[0]["conditions"][0]["reason"] == "InsufficientPods"
    # the controller drops the entry once the pod is gone
    assert "disruptedPods" not in written[-1]
    assert counts(written[-1]) == (1, 1, 1, 0)


@pytest.mark.parametrize(
    ("phase", "ready", "policy", "min_available", "evicted"),
    [
        ("Pending", False, None, 3, True),
        ("Succeeded", False, None, 3, True),
        ("Failed", False, None, 3, True),
        ("Running", False, None, 3, True),
        ("Running", False, None, 4, False),
        ("Running", False, "AlwaysAllow", 4, True),
        ("Running", False, "IfHealthyBudget", 4, False),
        ("Running", True, "AlwaysAllow", 4, False),
    ],
    ids=[
        "pending",
        "succeeded",
        "failed",
        "unready-while-the-budget-is-met",
        "unready-while-the-budget-is-short",
        "unready-always-allowed",
        "unready-if-healthy-budget-short",
        "ready-is-guarded-even-with-always-allow",
    ],
)
def test_pods_that_are_not_running_or_not_ready(
    api: KubeClusterApi,
    apiserver: LocalApiServer,
    phase: str,
    ready: bool,
    policy: str | None,
    min_available: int,
    evicted: bool,
) -> None:
    """Three Ready pods and the one evicted; a budget of 3 allows no Ready pod to go."""
    for name in ("p0", "p1", "p2"):
        start_pod(api, name)
    start_pod(api, "odd", phase=phase, ready=ready)
    spec: dict[str, Any] = {"minAvailable": min_available}
    if policy is not None:
        spec["unhealthyPodEvictionPolicy"] = policy
    _protect(api, apiserver, **spec)
    before = settled_status(api, apiserver)

    if evicted:
        api.evict(name="odd", namespace=NS)
        assert "odd" not in _names(api)
        assert settled_status(api, apiserver)["disruptionsAllowed"] == before["disruptionsAllowed"]
    else:
        with pytest.raises(TooManyRequestsError):
            api.evict(name="odd", namespace=NS)
        assert "odd" in _names(api)


def test_a_pod_under_two_budgets_is_500(
    api: KubeClusterApi, apiserver: LocalApiServer, kube_client: Any
) -> None:
    start_pod(api, "p0")
    start_pod(api, "p1")
    api.create(POD_DISRUPTION_BUDGETS, budget("one", maxUnavailable=1), namespace=NS)
    _protect(api, apiserver, minAvailable=0)

    with pytest.raises(ApiException) as caught:
        _core(kube_client).create_namespaced_pod_eviction("p0", NS, _eviction("p0"))

    assert caught.value.status == 500
    assert status_of(caught.value)["message"] == (
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does not "
        "support."
    )
    assert _names(api) == {"p0", "p1"}


def test_a_pod_no_budget_selects_is_evicted(api: KubeClusterApi, apiserver: LocalApiServer) -> None:
    start_pod(api, "p0", labels={"app": "other"})
    _protect(api, apiserver, minAvailable=5)

    api.evict(name="p0", namespace=NS)

    assert _names(api) == set()


def test_a_budget_the_controller_has_not_seen_refuses() -> None:
    """The eviction trusts only a status of the budget's current generation (no controller runs
    beside this bare store, so the new budget's status stays unobserved)."""
    store = Store()
    body = pod("p0")
    body["metadata"]["labels"] = {"app": "web"}
    created = store.create(STORED_PODS, NS, body)
    store.update(STORED_PODS, NS, "p0", {**created, "status": pod_status()}, subresource="status")
    store.create(STORED_BUDGETS, NS, budget(minAvailable=0))

    with pytest.raises(ApiError) as caught:
        evict_pod(store, namespace=NS, name="p0", options=EvictionOptions())

    status = caught.value.status()
    assert (status["code"], status["message"]) == (429, VIOLATION)
    assert status["details"]["retryAfterSeconds"] == 10
    assert status["details"]["causes"][0]["message"] == (
        "The disruption budget web is still being processed by the server."
    )


def test_the_pod_is_deleted_with_the_evictions_grace_period() -> None:
    with LocalApiServer(graceful_pod_deletion=True) as server, _client(server.url) as api:
        for name in ("p0", "p1"):
            start_pod(api, name, nodeName="node-1")
        api.create(POD_DISRUPTION_BUDGETS, budget(minAvailable=0), namespace=NS)
        assert server.settle()
        kube = api_client(server)
        try:
            _core(kube).create_namespaced_pod_eviction(
                "p0", NS, _eviction("p0", gracePeriodSeconds=7)
            )
        finally:
            close_client(kube)
        api.evict(name="p1", namespace=NS)

        short = api.get(PODS, name="p0", namespace=NS)
        default = api.get(PODS, name="p1", namespace=NS)
    assert short["metadata"]["deletionGracePeriodSeconds"] == 7
    assert default["metadata"]["deletionGracePeriodSeconds"] == 30
    target = next(c for c in short["status"]["conditions"] if c["type"] == "DisruptionTarget")
    assert (target["status"], target["reason"]) == ("True", "EvictionByEvictionAPI")


def test_a_uid_precondition_that_no_longer_holds_is_a_conflict(api: KubeClusterApi) -> None:
    start_pod(api, "p0")

    with pytest.raises(ConflictError, match="does not match the UID in record"):
        api.evict(name="p0", namespace=NS, uid="not-the-uid")

    assert _names(api) == {"p0"}


def test_evicting_a_missing_pod_is_not_found(api: KubeClusterApi) -> None:
    with pytest.raises(ApiNotFoundError):
        api.evict(name="ghost", namespace=NS)
