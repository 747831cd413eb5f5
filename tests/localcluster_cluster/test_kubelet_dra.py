"""The emulated kubelet with a DRA plugin: registration through ``plugins_registry/`` and the
prepare → run → unprepare sequence, with retries, as the real kubelet drives it."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest

from driver.cluster.ops import add_claim_finalizer, remove_scheduling_gate, write_claim_allocation
from driver.cluster.port import EVENTS, PODS, RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS
from driver.errors import ApiNotFoundError
from localcluster.cluster.kubelet import RUN_SECONDS_ANNOTATION, NodeSpec
from localcluster.cluster.runner import LocalCluster
from protos.podresources.v1 import api_pb2 as pr
from protos.podresources.v1 import api_pb2_grpc as pr_grpc
from tests.localcluster_cluster.conftest import NS, allocation, pod, template
from tests.localcluster_cluster.fakes import FakeDraPlugin

GATE = "instaslice.dev/placement"


@pytest.fixture
def cluster(make_cluster: Callable[..., LocalCluster]) -> LocalCluster:
    return make_cluster()


@pytest.fixture
def plugin(cluster: LocalCluster) -> Iterator[FakeDraPlugin]:
    fake = FakeDraPlugin(cluster.kubelet("node-a").root).start()
    yield fake
    fake.stop()


def _get(cluster: LocalCluster, resource: Any, name: str) -> dict[str, Any] | None:
    assert cluster.api is not None
    try:
        return cluster.api.get(resource, name=name, namespace=NS)
    except ApiNotFoundError:
        return None


def _allocate_and_ungate(cluster: LocalCluster, pod_name: str) -> str:
    """What the InstaSlice controller does: finalizer, allocation with timestamp, lift the gate."""
    api = cluster.api
    assert api is not None
    name = cluster.wait_for(
        lambda: ((_get(cluster, PODS, pod_name) or {}).get("status", {})
                 .get("resourceClaimStatuses") or [{}])[0].get("resourceClaimName")
    )  # fmt: skip
    claim = api.get(RESOURCE_CLAIMS, name=name, namespace=NS)
    claim = add_claim_finalizer(api, claim=claim)
    alloc = allocation("node-a")
    del alloc["allocationTimestamp"]
    write_claim_allocation(api, claim=claim, allocation=alloc, allocated_at=datetime.now(UTC))
    remove_scheduling_gate(api, pod=api.get(PODS, name=pod_name, namespace=NS), gate=GATE)
    return str(name)


def _gpu_pod(name: str, **extra: Any) -> dict[str, Any]:
    return pod(
        name,
        claims=[{"name": "gpu", "resourceClaimTemplateName": "tpl"}],
        container_claims=["gpu"],
        gates=[GATE],
        **extra,
    )


def _phase(cluster: LocalCluster, name: str) -> str | None:
    got = _get(cluster, PODS, name)
    return None if got is None else got.get("status", {}).get("phase")


def test_plugin_registers_through_the_registry_directory(
    cluster: LocalCluster, plugin: FakeDraPlugin
) -> None:
    kubelet = cluster.kubelet("node-a")
    client = cluster.wait_for(lambda: kubelet.plugins.get("mig.instaslice.dev"))
    assert client.endpoint == str(plugin.dra_path)
    assert client.service == "v1.DRAPlugin"
    cluster.wait_for(lambda: plugin.statuses)
    assert plugin.statuses == [(True, "")]

    plugin.stop()  # the registration socket disappears
    cluster.wait_for(lambda: kubelet.plugins.get("mig.instaslice.dev") is None)


@pytest.mark.parametrize(
    ("plugin_type", "services", "error"),
    [
        ("CSIPlugin", ("v1.DRAPlugin",), "no handler registered for plugin type: CSIPlugin"),
        ("DRAPlugin", ("v1alpha3.DRAPlugin",), "none of the supported services"),
    ],
    ids=["wrong-type", "unknown-service"],
)
def test_unusable_plugin_is_told_why(
    cluster: LocalCluster, plugin_type: str, services: tuple[str, ...], error: str
) -> None:
    fake = FakeDraPlugin(
        cluster.kubelet("node-a").root, plugin_type=plugin_type, services=services
    ).start()
    try:
        cluster.wait_for(lambda: fake.statuses)
        assert fake.statuses[0][0] is False
        assert error in fake.statuses[0][1]
        assert cluster.kubelet("node-a").plugins.drivers() == []
    finally:
        fake.stop()


def test_prepare_run_unprepare(cluster: LocalCluster, plugin: FakeDraPlugin) -> None:
    api = cluster.api
    assert api is not None
    kubelet = cluster.kubelet("node-a")
    cluster.wait_for(lambda: kubelet.plugins.get("mig.instaslice.dev"))
    api.create(RESOURCE_CLAIM_TEMPLATES, template())
    created = api.create(PODS, _gpu_pod("p"))
    claim_name = _allocate_and_ungate(cluster, "p")
    cluster.wait_for(lambda: _phase(cluster, "p") == "Running")
    claim = api.get(RESOURCE_CLAIMS, name=claim_name, namespace=NS)
    assert plugin.calls == [("prepare", (claim_name,))]

    cdi_ids, _ = kubelet.container_devices(created["metadata"]["uid"], "c")
    assert cdi_ids == (f"instaslice.dev/mig={claim['metadata']['uid']}",)
    channel = grpc.insecure_channel(f"unix:{kubelet.pod_resources_socket}")
    try:
        listed = pr_grpc.PodResourcesListerStub(channel).List(
            pr.ListPodResourcesRequest(), timeout=5
        )
    finally:
        channel.close()
    (entry,) = listed.pod_resources
    (dynamic,) = entry.containers[0].dynamic_resources
    assert (entry.name, dynamic.claim_name, dynamic.claim_namespace) == ("p", claim_name, NS)
    resource = dynamic.claim_resources[0]
    assert (resource.driver_name, resource.pool_name, resource.device_name) == (
        "mig.instaslice.dev",
        "node",
        f"dev-{claim_name}",
    )

    api.delete(PODS, name="p", namespace=NS)
    cluster.wait_for(lambda: _get(cluster, PODS, "p") is None)
    assert plugin.calls == [("prepare", (claim_name,)), ("unprepare", (claim_name,))]
    cluster.wait_for(lambda: _get(cluster, RESOURCE_CLAIMS, claim_name) is None)


@pytest.mark.parametrize(
    ("services", "version"),
    [(("v1.DRAPlugin", "v1beta1.DRAPlugin"), "v1"), (("v1beta1.DRAPlugin",), "v1beta1")],
    ids=["v1-preferred", "v1beta1-only"],
)
def test_all_claims_of_a_pod_go_in_one_call_per_driver(
    cluster: LocalCluster, services: tuple[str, ...], version: str
) -> None:
    api = cluster.api
    assert api is not None
    fake = FakeDraPlugin(cluster.kubelet("node-a").root, services=services).start()
    try:
        cluster.wait_for(lambda: cluster.kubelet("node-a").plugins.get("mig.instaslice.dev"))
        api.create(RESOURCE_CLAIM_TEMPLATES, template())
        body = pod(
            "two",
            claims=[
                {"name": "first", "resourceClaimTemplateName": "tpl"},
                {"name": "second", "resourceClaimTemplateName": "tpl"},
            ],
            container_claims=["first", "second"],
            gates=[GATE],
        )
        created = api.create(PODS, body)
        statuses = cluster.wait_for(
            lambda: (
                len(
                    s := (_get(cluster, PODS, "two") or {})
                    .get("status", {})
                    .get("resourceClaimStatuses")
                    or []
                )
                == 2
                and s
            )
        )
        names = {s["name"]: s["resourceClaimName"] for s in statuses}
        for name in names.values():
            stored = add_claim_finalizer(
                api, claim=api.get(RESOURCE_CLAIMS, name=name, namespace=NS)
            )
            alloc = allocation("node-a")
            del alloc["allocationTimestamp"]
            write_claim_allocation(
                api, claim=stored, allocation=alloc, allocated_at=datetime.now(UTC)
            )
        remove_scheduling_gate(api, pod=api.get(PODS, name="two", namespace=NS), gate=GATE)
        cluster.wait_for(lambda: _phase(cluster, "two") == "Running")
        assert fake.calls == [("prepare", (names["first"], names["second"]))]
        assert fake.versions == [version]
        cdi_ids, _ = cluster.kubelet("node-a").container_devices(created["metadata"]["uid"], "c")
        assert len(cdi_ids) == 2
    finally:
        fake.stop()


def test_failed_prepare_is_retried_while_the_pod_waits(
    cluster: LocalCluster, plugin: FakeDraPlugin
) -> None:
    api = cluster.api
    assert api is not None
    cluster.wait_for(lambda: cluster.kubelet("node-a").plugins.get("mig.instaslice.dev"))
    api.create(RESOURCE_CLAIM_TEMPLATES, template())
    api.create(PODS, _gpu_pod("p"))
    name = cluster.wait_for(
        lambda: ((_get(cluster, PODS, "p") or {}).get("status", {})
                 .get("resourceClaimStatuses") or [{}])[0].get("resourceClaimName")
    )  # fmt: skip
    plugin.fail_prepare[name] = 2
    _allocate_and_ungate(cluster, "p")
    waiting = cluster.wait_for(
        lambda: (
            (s := (_get(cluster, PODS, "p") or {}).get("status", {})).get("containerStatuses") and s
        )
    )
    assert waiting["phase"] == "Pending"
    assert waiting["containerStatuses"][0]["state"]["waiting"]["reason"] == "ContainerCreating"
    cluster.wait_for(lambda: _phase(cluster, "p") == "Running")
    assert [c for c, _ in plugin.calls] == ["prepare", "prepare", "prepare"]


def test_completed_pod_is_unprepared_before_it_is_marked_succeeded(
    cluster: LocalCluster, plugin: FakeDraPlugin
) -> None:
    api = cluster.api
    assert api is not None
    cluster.wait_for(lambda: cluster.kubelet("node-a").plugins.get("mig.instaslice.dev"))
    api.create(RESOURCE_CLAIM_TEMPLATES, template())
    body = _gpu_pod("job", restartPolicy="Never")
    body["metadata"]["annotations"] = {RUN_SECONDS_ANNOTATION: "0.2"}
    api.create(PODS, body)
    name = _allocate_and_ungate(cluster, "job")
    cluster.wait_for(lambda: _phase(cluster, "job") == "Succeeded")
    assert plugin.calls == [("prepare", (name,)), ("unprepare", (name,))]
    # the claim controller then releases and deletes the generated claim of the finished pod
    cluster.wait_for(lambda: _get(cluster, RESOURCE_CLAIMS, name) is None)


def test_claim_not_reserved_for_the_pod_is_refused(
    cluster: LocalCluster, plugin: FakeDraPlugin
) -> None:
    """A pod bound by hand (no scheduler reservation) is not prepared, as the kubelet refuses."""
    api = cluster.api
    assert api is not None
    cluster.wait_for(lambda: cluster.kubelet("node-a").plugins.get("mig.instaslice.dev"))
    claim = api.create(
        RESOURCE_CLAIMS,
        {"metadata": {"name": "direct", "namespace": NS}, "spec": template()["spec"]["spec"]},
    )
    updated = copy.deepcopy(claim)
    updated["status"] = {"allocation": allocation("node-a")}
    api.update_status(RESOURCE_CLAIMS, updated)
    api.create(
        PODS,
        pod("bound", claims=[{"name": "gpu", "resourceClaimName": "direct"}], nodeName="node-a"),
    )
    event = cluster.wait_for(
        lambda: [
            e
            for e in api.list_objects(EVENTS, namespace=NS).items
            if e["involvedObject"]["name"] == "bound"
            and e["reason"] == "FailedPrepareDynamicResources"
        ]
    )
    assert "is not allowed to use resource claim direct" in event[0]["message"]
    assert plugin.calls == []
    assert _phase(cluster, "bound") == "Pending"


def test_container_environment_comes_from_the_cdi_specs(
    make_cluster: Callable[..., LocalCluster], short_root: Path
) -> None:
    cdi_dir = short_root / "cdi"
    cdi_dir.mkdir()
    cluster = make_cluster((NodeSpec("node-a", cdi_dirs=(cdi_dir,)),))
    api = cluster.api
    assert api is not None
    fake = FakeDraPlugin(cluster.kubelet("node-a").root).start()
    try:
        cluster.wait_for(lambda: cluster.kubelet("node-a").plugins.get("mig.instaslice.dev"))
        api.create(RESOURCE_CLAIM_TEMPLATES, template())
        created = api.create(PODS, _gpu_pod("p"))
        claim_name = _allocate_and_ungate(cluster, "p")
        waiting = cluster.wait_for(
            lambda: (
                (s := (_get(cluster, PODS, "p") or {}).get("status", {}).get("containerStatuses"))
                and s[0]["state"].get("waiting", {}).get("reason") == "CreateContainerError"
                and s
            )
        )
        assert "unresolvable CDI devices" in waiting[0]["state"]["waiting"]["message"]
        claim_uid = api.get(RESOURCE_CLAIMS, name=claim_name, namespace=NS)["metadata"]["uid"]
        spec = {
            "cdiVersion": "0.6.0",
            "kind": "instaslice.dev/mig",
            "devices": [
                {"name": claim_uid, "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=MIG-1"]}}
            ],
        }
        (cdi_dir / f"instaslice.dev-mig_{claim_uid}.json").write_text(json.dumps(spec))
        cluster.wait_for(lambda: _phase(cluster, "p") == "Running")
        _, envs = cluster.kubelet("node-a").container_devices(created["metadata"]["uid"], "c")
        assert envs == {"NVIDIA_VISIBLE_DEVICES": "MIG-1"}
    finally:
        fake.stop()
