"""Contract: ``policy/v1`` PodDisruptionBudgets are served like any kind, and their status is what
kube-controller-manager's disruption controller computes, kept current as pods and budgets change."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client

from driver.cluster import POD_DISRUPTION_BUDGETS, PODS, PatchType
from driver.cluster.kube import KubeClusterApi, configuration_for_url
from driver.cluster.throttle import ClientSettings
from localcluster.apiserver import LocalApiServer
from localcluster.policy.controller import DisruptionController
from localcluster.resources import POD_DISRUPTION_BUDGETS as STORED_BUDGETS
from localcluster.resources import PODS as STORED_PODS
from localcluster.store import Store
from tests.localcluster.budgets import (
    DEPLOYMENTS,
    JOBS,
    REPLICA_SETS,
    counts,
    replica_set,
    settled_status,
    start_pod,
)
from tests.localcluster.helpers import NS, budget, eventually, pod, pod_status


@pytest.fixture
def api(apiserver: LocalApiServer) -> Iterator[KubeClusterApi]:
    with KubeClusterApi(
        configuration=configuration_for_url(apiserver.url),
        settings=ClientSettings(qps=0, request_timeout=10.0),
    ) as client_api:
        yield client_api


def test_discovery_lists_budgets_and_their_status(kube_client: Any) -> None:
    resources = client.PolicyV1Api(kube_client).get_api_resources()

    by_name = {r.name: r for r in resources.resources}
    assert resources.group_version == "policy/v1"
    assert by_name["poddisruptionbudgets"].namespaced
    assert by_name["poddisruptionbudgets"].kind == "PodDisruptionBudget"
    assert by_name["poddisruptionbudgets"].short_names == ["pdb"]
    assert "watch" in by_name["poddisruptionbudgets"].verbs
    assert by_name["poddisruptionbudgets/status"].verbs == ["get", "patch", "update"]
    groups = client.ApisApi(kube_client).get_api_versions().groups
    assert "policy" in [g.name for g in groups]


def test_create_resets_status_and_a_spec_change_bumps_generation(kube_client: Any) -> None:
    policy: Any = client.PolicyV1Api(kube_client)
    body = budget(minAvailable=1)
    body["status"] = {"disruptionsAllowed": 5, "currentHealthy": 9}

    created = policy.create_namespaced_pod_disruption_budget(NS, body)
    changed = policy.patch_namespaced_pod_disruption_budget(
        "web", NS, {"spec": {"minAvailable": 2}}
    )

    assert created.metadata.generation == 1
    assert created.status.disruptions_allowed == 0
    assert created.status.current_healthy == 0
    assert changed.metadata.generation == 2
    listed = policy.list_namespaced_pod_disruption_budget(NS, label_selector="")
    assert [b.metadata.name for b in listed.items] == ["web"]
    policy.delete_namespaced_pod_disruption_budget("web", NS)
    assert policy.list_namespaced_pod_disruption_budget(NS).items == []


def test_a_status_write_keeps_the_spec_and_fills_missing_counts(api: KubeClusterApi) -> None:
    api.create(POD_DISRUPTION_BUDGETS, budget(minAvailable=1), namespace=NS)

    written = api.patch(
        POD_DISRUPTION_BUDGETS,
        name="web",
        namespace=NS,
        patch={"spec": {"minAvailable": 7}, "status": {"expectedPods": 4}},
        patch_type=PatchType.MERGE,
        subresource="status",
    )

    assert written["spec"]["minAvailable"] == 1
    assert written["status"]["expectedPods"] == 4
    assert written["status"]["currentHealthy"] == 0


def _pods(api: KubeClusterApi, spec: str, owner: dict[str, Any] | None) -> None:
    """``spec``: one letter per pod: R ready, U running but not Ready, S succeeded (still
    Ready, as a hand-written status may say), P pending, O ready but labelled otherwise."""
    for i, kind in enumerate(spec):
        name = f"p{i}"
        if kind == "O":
            start_pod(api, name, labels={"app": "other"}, owner=owner)
        elif kind == "S":
            start_pod(api, name, phase="Succeeded", owner=owner)
        elif kind == "P":
            start_pod(api, name, phase="Pending", ready=False, owner=owner)
        else:
            start_pod(api, name, ready=kind == "R", owner=owner)


@pytest.mark.parametrize(
    ("spec", "pods", "replicas", "want"),
    [
        ({"minAvailable": 2}, "RRR", None, (3, 2, 3, 1)),
        ({"minAvailable": 3}, "RRR", None, (3, 3, 3, 0)),
        ({"minAvailable": 2}, "RRU", None, (3, 2, 2, 0)),
        ({"minAvailable": 1}, "RUSPO", None, (4, 1, 1, 0)),
        ({"minAvailable": 0}, "RR", None, (2, 0, 2, 2)),
        ({"minAvailable": "50%"}, "RRRR", 4, (4, 2, 4, 2)),
        ({"minAvailable": "34%"}, "RRR", 3, (3, 2, 3, 1)),
        ({"minAvailable": "50%"}, "RR", 4, (4, 2, 2, 0)),
        ({"maxUnavailable": 1}, "RRR", 3, (3, 2, 3, 1)),
        ({"maxUnavailable": "50%"}, "RRR", 3, (3, 1, 3, 2)),
        ({"maxUnavailable": 1}, "RRU", 3, (3, 2, 2, 0)),
        ({"maxUnavailable": 5}, "RR", 2, (2, 0, 2, 2)),
        ({"maxUnavailable": 1}, "RRR", None, (0, 0, 3, 0)),
        ({}, "RRR", None, (0, 0, 3, 0)),
        ({"minAvailable": 1, "selector": {}}, "RO", None, (2, 1, 2, 1)),
        (
            {
                "minAvailable": 1,
                "selector": {
                    "matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]
                },
            },
            "RRO",
            None,
            (2, 1, 2, 1),
        ),
    ],
    ids=[
        "min-int-one-spare",
        "min-int-none-spare",
        "min-int-unready-not-healthy",
        "min-int-terminal-pending-and-other-labels",
        "min-zero",
        "min-percent-of-replicas",
        "min-percent-rounds-up",
        "min-percent-of-missing-replicas",
        "max-int",
        "max-percent-rounds-up",
        "max-int-unready",
        "max-above-replicas",
        "max-of-unmanaged-pods-expects-none",
        "neither-expects-none",
        "empty-selector-selects-all",
        "match-expressions",
    ],
)
def test_status_numbers(
    api: KubeClusterApi,
    apiserver: LocalApiServer,
    spec: dict[str, Any],
    pods: str,
    replicas: int | None,
    want: tuple[int, int, int, int],
) -> None:
    owner = replica_set(api, replicas=replicas) if replicas is not None else None
    _pods(api, pods, owner)

    api.create(POD_DISRUPTION_BUDGETS, budget(**spec), namespace=NS)

    status = settled_status(api, apiserver)
    assert counts(status) == want
    assert status["observedGeneration"] == 1
    [condition] = status["conditions"]
    assert condition["type"] == "DisruptionAllowed"
    assert (condition["status"], condition["reason"]) == (
        ("True", "SufficientPods") if want[3] else ("False", "InsufficientPods")
    )


def test_a_budget_without_a_selector_selects_no_pod(
    api: KubeClusterApi, apiserver: LocalApiServer
) -> None:
    start_pod(api, "p0")
    body = budget(minAvailable=1)
    del body["spec"]["selector"]

    api.create(POD_DISRUPTION_BUDGETS, body, namespace=NS)

    assert counts(settled_status(api, apiserver)) == (0, 1, 0, 0)


def test_a_pod_of_a_deployment_counts_the_deployments_replicas(
    api: KubeClusterApi, apiserver: LocalApiServer
) -> None:
    deployment = api.create(
        DEPLOYMENTS,
        {"metadata": {"name": "web"}, "spec": {"replicas": 5, "selector": {}, "template": {}}},
        namespace=NS,
    )
    owned = replica_set(api, replicas=2)
    owned["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": "web",
            "uid": deployment["metadata"]["uid"],
            "controller": True,
        }
    ]
    owned = api.update(REPLICA_SETS, owned)
    start_pod(api, "p0", owner=owned)

    api.create(POD_DISRUPTION_BUDGETS, budget(maxUnavailable=1), namespace=NS)

    assert counts(settled_status(api, apiserver)) == (5, 4, 1, 0)


def test_status_follows_pods_and_spec(api: KubeClusterApi, apiserver: LocalApiServer) -> None:
    for name in ("p0", "p1", "p2"):
        start_pod(api, name)
    api.create(POD_DISRUPTION_BUDGETS, budget(minAvailable=1), namespace=NS)
    assert counts(settled_status(api, apiserver)) == (3, 1, 3, 2)

    api.patch(
        PODS,
        name="p0",
        namespace=NS,
        patch={"status": pod_status(ready=False)},
        patch_type=PatchType.MERGE,
        subresource="status",
    )
    assert counts(settled_status(api, apiserver)) == (3, 1, 2, 1)

    api.delete(PODS, name="p1", namespace=NS)
    assert counts(settled_status(api, apiserver)) == (2, 1, 1, 0)

    start_pod(api, "p3")
    api.patch(
        POD_DISRUPTION_BUDGETS,
        name="web",
        namespace=NS,
        patch={"spec": {"minAvailable": 0}},
        patch_type=PatchType.MERGE,
    )
    status = settled_status(api, apiserver)
    assert counts(status) == (3, 0, 2, 2)
    assert status["observedGeneration"] == 2


def test_a_relabelled_pod_leaves_the_budget(api: KubeClusterApi, apiserver: LocalApiServer) -> None:
    start_pod(api, "p0")
    start_pod(api, "p1")
    api.create(POD_DISRUPTION_BUDGETS, budget(minAvailable=1), namespace=NS)
    assert counts(settled_status(api, apiserver)) == (2, 1, 2, 1)

    api.patch(
        PODS,
        name="p1",
        namespace=NS,
        patch={"metadata": {"labels": {"app": "other"}}},
        patch_type=PatchType.MERGE,
    )

    assert counts(settled_status(api, apiserver)) == (1, 1, 1, 0)


def test_a_pod_whose_controller_has_no_scale_fails_safe(
    api: KubeClusterApi, apiserver: LocalApiServer
) -> None:
    job = api.create(JOBS, {"metadata": {"name": "batch"}, "spec": {"template": {}}}, namespace=NS)
    start_pod(api, "p0", owner=job)
    start_pod(api, "p1", owner=job)

    api.create(POD_DISRUPTION_BUDGETS, budget(maxUnavailable=1), namespace=NS)

    status = settled_status(api, apiserver)
    assert status["disruptionsAllowed"] == 0
    assert "observedGeneration" not in status
    [condition] = status["conditions"]
    assert (condition["status"], condition["reason"]) == ("False", "SyncFailed")
    assert condition["message"] == "jobs.batch does not implement the scale subresource"


class _FakeClock:
    def __init__(self, now: datetime) -> None:
        self.wall = now

    def monotonic(self) -> float:
        return self.wall.timestamp()

    def now(self) -> datetime:
        return self.wall


def test_an_eviction_in_flight_holds_until_the_deletion_timeout() -> None:
    """A pod listed in ``disruptedPods`` is not counted healthy until the entry runs out."""
    store = Store()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    clock = _FakeClock(start + timedelta(seconds=30))
    controller = DisruptionController(store, clock=clock, deletion_timeout=timedelta(minutes=2))
    for name in ("p0", "p1"):
        body = pod(name)
        body["metadata"]["labels"] = {"app": "web"}
        created = store.create(STORED_PODS, NS, body)
        store.update(
            STORED_PODS, NS, name, {**created, "status": pod_status()}, subresource="status"
        )
    created = store.create(STORED_BUDGETS, NS, budget(minAvailable=1))
    store.update(
        STORED_BUDGETS,
        NS,
        "web",
        {**created, "status": {"disruptedPods": {"p0": "2026-01-01T00:00:00Z"}}},
        subresource="status",
    )

    controller.sync(NS, "web")
    held = store.get(STORED_BUDGETS, NS, "web")["status"]
    clock.wall = start + timedelta(minutes=3)
    controller.sync(NS, "web")
    expired = store.get(STORED_BUDGETS, NS, "web")["status"]

    assert counts(held) == (2, 1, 1, 0)
    assert held["disruptedPods"] == {"p0": "2026-01-01T00:00:00Z"}
    assert counts(expired) == (2, 1, 2, 1)
    assert "disruptedPods" not in expired


def test_the_controller_rechecks_a_budget_when_an_entry_runs_out() -> None:
    """Nothing else happens after the eviction: the controller's own timer drops the entry."""
    store = Store()
    controller = DisruptionController(store, deletion_timeout=timedelta(seconds=2))
    body = pod("p0")
    body["metadata"]["labels"] = {"app": "web"}
    created = store.create(STORED_PODS, NS, body)
    store.update(STORED_PODS, NS, "p0", {**created, "status": pod_status()}, subresource="status")
    created = store.create(STORED_BUDGETS, NS, budget(minAvailable=0))
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    store.update(
        STORED_BUDGETS,
        NS,
        "web",
        {**created, "status": {"disruptedPods": {"p0": now}}},
        subresource="status",
    )
    controller.start()  # the writes above are queued for it already
    try:
        assert controller.wait_idle(5)
        held = store.get(STORED_BUDGETS, NS, "web")["status"]

        eventually(lambda: "disruptedPods" not in store.get(STORED_BUDGETS, NS, "web")["status"])
    finally:
        controller.stop()

    assert counts(held) == (1, 0, 0, 0)
    assert counts(store.get(STORED_BUDGETS, NS, "web")["status"]) == (1, 0, 1, 1)
