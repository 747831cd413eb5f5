"""Classic ``nvidia.com/mig-*`` pods end to end (shadow claims + the device-plugin shim): the seed's
test pod, a Deployment, a StatefulSet, and classic beside DRA pods on one node."""

from __future__ import annotations

import pytest

from api import names
from driver.checkpoint import CheckpointStore
from driver.cluster.port import PODS, RESOURCE_CLAIMS
from localcluster.stack import InstaSliceStack
from tests.e2e.conftest import E2E_NS
from tests.e2e.helpers import (
    QUOTA_NS,
    SAMPLES_NS,
    apply,
    cdi_specs,
    claim_template,
    classic_pod,
    dra_pod,
    get_pod,
    phase,
    running,
    sample,
    sample_object,
    scale,
    slices_of_pod,
    visible_devices,
    wait_for,
    wait_pod_running,
    wait_running,
)


@pytest.fixture
def classic(cluster: InstaSliceStack) -> InstaSliceStack:
    """The cluster once every node's device-plugin shim has registered its resources."""
    cluster.wait_ready(classic=True)
    return cluster


def test_the_seed_test_pod_gets_a_slice_and_its_cdi_spec_and_deleting_it_removes_both(
    classic: InstaSliceStack,
) -> None:
    apply(classic, sample("test-pod.yaml"))
    pod = wait_pod_running(classic, SAMPLES_NS, "cuda-vectoradd")
    node = pod["spec"]["nodeName"]
    (held,) = slices_of_pod(classic.view(), SAMPLES_NS, "cuda-vectoradd")
    slice_node, _, item = held
    assert (slice_node, item.profile, item.shadow) == (node, "1g.5gb", True)
    claim = classic.api.get(RESOURCE_CLAIMS, name=item.claim_name, namespace=SAMPLES_NS)
    assert claim["metadata"]["labels"][names.SHADOW_CLAIM_LABEL] == pod["metadata"]["uid"]
    assert [o["uid"] for o in claim["metadata"]["ownerReferences"]] == [pod["metadata"]["uid"]]

    assert item.mig_uuid is not None
    assert visible_devices(classic, pod, "cuda-vectoradd") == {item.mig_uuid}
    specs = cdi_specs(classic, node)
    assert len(specs) == 1
    text = specs[0].read_text()
    assert item.mig_uuid in text
    assert names.CDI_KIND in text
    assert item.claim_uid in text, "CDI device names carry the claim UID (never reused)"
    checkpoint = CheckpointStore(classic.node_paths(node).checkpoint).load()
    assert list(checkpoint.claims) == [item.claim_uid]
    instances = classic.mig_instances(node)
    assert [(i.profile, i.mig_uuid) for i in instances] == [("1g.5gb", item.mig_uuid)]

    classic.api.delete(PODS, name="cuda-vectoradd", namespace=SAMPLES_NS)
    wait_for(classic, lambda: get_pod(classic, SAMPLES_NS, "cuda-vectoradd") is None)
    wait_for(
        classic,
        lambda: not classic.api.list_objects(RESOURCE_CLAIMS, namespace=SAMPLES_NS).items,
        message="the shadow claim was not removed with its pod",
    )
    wait_for(classic, lambda: not classic.mig_instances(node), message="slice not destroyed")
    wait_for(classic, lambda: not cdi_specs(classic, node), message="CDI spec not removed")
    wait_for(
        classic,
        lambda: not CheckpointStore(classic.node_paths(node).checkpoint).load().claims,
        message="checkpoint entry not removed",
    )


def test_a_deployment_scaled_from_one_to_five_to_zero(classic: InstaSliceStack) -> None:
    apply(classic, sample("deployment.yaml"))
    label = "app.kubernetes.io/name=mig-deployment"
    wait_running(classic, SAMPLES_NS, 2, label=label)
    for replicas in (1, 5):
        scale(classic, "Deployment", SAMPLES_NS, "mig-deployment", replicas)
        running_pods = wait_running(classic, SAMPLES_NS, replicas, label=label)
        view = classic.view()
        wait_for(classic, lambda n=replicas: classic.view().slices_taken() == n)  # type: ignore[misc]
        for pod in running_pods:
            assert len(slices_of_pod(view, SAMPLES_NS, pod["metadata"]["name"])) == 1
    scale(classic, "Deployment", SAMPLES_NS, "mig-deployment", 0)
    wait_for(classic, lambda: not classic.api.list_objects(PODS, namespace=SAMPLES_NS).items)
    wait_for(classic, lambda: classic.view().slices_taken() == 0)
    wait_for(classic, lambda: not any(classic.mig_instances(n) for n in classic.node_names))


def test_a_statefulset_pod_recreated_under_the_same_name_gets_a_fresh_slice(
    classic: InstaSliceStack,
) -> None:
    apply(classic, sample("statefulset.yaml"))
    label = "app.kubernetes.io/name=mig-statefulset"
    first = wait_running(classic, SAMPLES_NS, 2, label=label)
    assert [p["metadata"]["name"] for p in first] == ["mig-statefulset-0", "mig-statefulset-1"]
    view = classic.view()
    for pod in first:
        (held,) = slices_of_pod(view, SAMPLES_NS, pod["metadata"]["name"])
        assert held[2].profile == "2g.10gb"
    old_uid = first[0]["metadata"]["uid"]
    classic.api.delete(PODS, name="mig-statefulset-0", namespace=SAMPLES_NS)

    def recreated() -> bool:
        pod = get_pod(classic, SAMPLES_NS, "mig-statefulset-0")
        return pod is not None and pod["metadata"]["uid"] != old_uid and running(pod)

    wait_for(classic, recreated, message="mig-statefulset-0 was not recreated and run")
    wait_for(classic, lambda: classic.view().slices_taken() == 2)
    assert len(slices_of_pod(classic.view(), SAMPLES_NS, "mig-statefulset-0")) == 1


def test_dra_and_classic_pods_share_a_node_and_each_sees_only_its_own_slices(
    classic: InstaSliceStack,
) -> None:
    apply(classic, sample("test-pod.yaml"))
    apply(classic, sample("dra-pod-1g.5gb.yaml"))
    apply(classic, [classic_pod("classic-two", profile="1g.5gb", count=2, namespace=E2E_NS)])
    apply(classic, sample("dra-pod-2g.10gb.yaml"))
    expected = {
        (SAMPLES_NS, "cuda-vectoradd", "cuda-vectoradd"): 1,
        (SAMPLES_NS, "dra-1g-5gb", "app"): 1,
        (E2E_NS, "classic-two", "app"): 2,
        (SAMPLES_NS, "dra-2g-10gb", "app"): 1,
    }
    wait_for(
        classic,
        lambda: all(running(get_pod(classic, ns, name)) for ns, name, _ in expected),
        message="not every pod runs",
    )
    view = classic.view()
    nodes = set()
    for (namespace, name, container), count in expected.items():
        pod = get_pod(classic, namespace, name)
        assert pod is not None
        held = slices_of_pod(view, namespace, name)
        assert len(held) == count, name
        nodes.add(pod["spec"]["nodeName"])
        own = {item.mig_uuid for _, _, item in held}
        assert None not in own
        assert visible_devices(classic, pod, container) == own, name
    assert len(nodes) == 1, "first-fit puts this small set on the first node"
    assert not view.overlapping()


def test_classic_pods_of_two_namespaces_started_together_each_use_their_own_slice(
    classic: InstaSliceStack,
) -> None:
    # The device-plugin API does not say which pod an Allocate is for; the shim must still end
    # with every slice recorded against the pod whose container uses it — and a shadow claim can
    # only be reserved for a pod of its own namespace. Deployment + seed pod in instaslice-demo,
    # the quota sample's classic Deployment in instaslice-quota-demo, all 1g.5gb, all at once.
    deployment = sample_object("deployment.yaml", "Deployment")
    deployment["spec"]["replicas"] = 4
    quota_classic = sample_object("quota.yaml", "Deployment")
    apply(classic, [deployment, *sample("test-pod.yaml"), quota_classic])
    wait_running(classic, SAMPLES_NS, 4, label="app.kubernetes.io/name=mig-deployment")
    wait_running(classic, QUOTA_NS, 2, label="app.kubernetes.io/name=quota-classic")
    wait_pod_running(classic, SAMPLES_NS, "cuda-vectoradd")
    wait_for(classic, lambda: classic.view().slices_taken() == 7)
    # (the cluster fixture then checks that every pod sees exactly its own slices)


def test_a_placement_freed_by_a_deleted_classic_pod_is_not_handed_out_before_its_slice_is_gone(
    classic: InstaSliceStack,
) -> None:
    # The controller frees the placement as soon as the shadow claim is released, while the shim
    # destroys the old slice only on its next reconcile; the new pod's Allocate must release that
    # stale slice first (kubeletplugin/state/overlaps.py) instead of failing admission
    # (UnexpectedAdmissionError), which a Deployment scaled down and up would hit every time.
    apply(classic, [classic_pod("first", profile="1g.5gb", namespace=E2E_NS)])
    wait_pod_running(classic, E2E_NS, "first")
    classic.api.delete(PODS, name="first", namespace=E2E_NS)
    wait_for(
        classic,
        lambda: not classic.api.list_objects(RESOURCE_CLAIMS, namespace=E2E_NS).items,
        message="the first pod's shadow claim was not removed",
    )
    apply(classic, [classic_pod("second", profile="1g.5gb", namespace=E2E_NS)])

    def settled() -> str | None:
        pod = get_pod(classic, E2E_NS, "second")
        return phase(pod) if phase(pod) in ("Running", "Failed") else None

    outcome = wait_for(classic, settled, message="the second pod neither ran nor failed")
    pod = get_pod(classic, E2E_NS, "second")
    assert outcome == "Running", (pod or {}).get("status", {}).get("message")


def test_one_pod_with_a_claim_and_a_classic_request_sees_both_slices(
    classic: InstaSliceStack,
) -> None:
    apply(classic, [claim_template("mixed", profile="2g.10gb", namespace=E2E_NS)])
    pod = dra_pod("mixed", template="mixed", namespace=E2E_NS)
    container = pod["spec"]["containers"][0]
    container["resources"]["limits"] = {names.classic_resource_name("1g.5gb"): 1}
    apply(classic, [pod])
    running_pod = wait_pod_running(classic, E2E_NS, "mixed")
    held = slices_of_pod(classic.view(), E2E_NS, "mixed")
    assert sorted(item.profile for _, _, item in held) == ["1g.5gb", "2g.10gb"]
    assert sorted(item.shadow for _, _, item in held) == [False, True]
    own = {item.mig_uuid for _, _, item in held}
    assert None not in own
    cdi_ids, _ = classic.kubelet(running_pod["spec"]["nodeName"]).container_devices(
        running_pod["metadata"]["uid"], "app"
    )
    claim_uids = {item.claim_uid for _, _, item in held}
    for uid in claim_uids:
        assert any(uid in cdi_id for cdi_id in cdi_ids), f"no CDI device of claim {uid}"
    # docs/design.md F9: one source's NVIDIA_VISIBLE_DEVICES wins (a known limit, see helpers)
    visible = visible_devices(classic, running_pod)
    assert visible
    assert visible <= own
