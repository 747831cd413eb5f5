"""DRA pods end to end: capacity, mixed profiles, several slices, whole GPUs, foreign gates, Jobs."""

from __future__ import annotations

import time
from typing import Any

from api import names
from api.names import DRIVER_NAME
from driver.cluster.port import PODS, RESOURCE_CLAIMS
from driver.errors import ApiNotFoundError
from localcluster.manifests import JOBS
from localcluster.stack import InstaSliceStack
from tests.e2e.conftest import E2E_NS
from tests.e2e.helpers import (
    KUEUE_GATE,
    SAMPLES_NS,
    apply,
    claim_template,
    container_env,
    dra_pod,
    get_pod,
    is_gated,
    phase,
    placement_reason,
    pods,
    remove_gate,
    renamed,
    running,
    sample,
    sample_object,
    slices_of_pod,
    visible_devices,
    wait_for,
    wait_pod_running,
    wait_running,
)

HOLD_S = 2.0
"""How long a pod that must not be placed is watched staying unplaced."""


def test_pods_of_one_profile_fill_the_cluster_and_one_more_runs_after_a_deletion(
    cluster: InstaSliceStack,
) -> None:
    # 3g.20gb: two per A100-40GB, so 2 nodes x 2 GPUs hold exactly eight.
    apply(cluster, [claim_template("half-gpu", profile="3g.20gb", namespace=E2E_NS)])
    apply(cluster, [dra_pod(f"half-{i}", template="half-gpu", namespace=E2E_NS) for i in range(8)])
    wait_running(cluster, E2E_NS, 8)
    view = cluster.view()
    placements = {
        (node, gpu, item.placement.start)
        for i in range(8)
        for node, gpu, item in slices_of_pod(view, E2E_NS, f"half-{i}")
    }
    assert len(placements) == 8

    apply(cluster, [dra_pod("one-too-many", template="half-gpu", namespace=E2E_NS)])
    deadline = time.monotonic() + HOLD_S
    while time.monotonic() < deadline:
        pod = get_pod(cluster, E2E_NS, "one-too-many")
        assert is_gated(pod), "a pod that cannot fit must stay gated"
        time.sleep(0.1)
    assert not slices_of_pod(cluster.view(), E2E_NS, "one-too-many")
    wait_for(
        cluster,
        lambda: placement_reason(cluster, E2E_NS, "one-too-many") == "NoCapacity",
        message="the waiting pod does not say NoCapacity",
    )

    (freed,) = slices_of_pod(cluster.view(), E2E_NS, "half-5")
    cluster.api.delete(PODS, name="half-5", namespace=E2E_NS)
    wait_for(cluster, lambda: running(get_pod(cluster, E2E_NS, "one-too-many")))
    (taken,) = slices_of_pod(cluster.view(), E2E_NS, "one-too-many")
    assert (taken[0], taken[1], taken[2].placement) == (freed[0], freed[1], freed[2].placement)


def test_the_node_a_pod_is_bound_to_was_nominated_while_it_was_gated(
    cluster: InstaSliceStack,
) -> None:
    """docs/design.md F24: the controller names the node in ``status.nominatedNodeName`` before
    lifting the gate; kube-scheduler binds there and the API server clears the field."""
    apply(cluster, [claim_template("nominated", profile="1g.5gb", namespace=E2E_NS)])
    listed = cluster.api.list_objects(PODS, namespace=E2E_NS)
    apply(cluster, [dra_pod("nominated", template="nominated", namespace=E2E_NS)])
    bound = wait_pod_running(cluster, E2E_NS, "nominated")
    node = bound["spec"]["nodeName"]
    versions: list[tuple[bool, str | None, str | None]] = []  # gated, nominated, bound node
    with cluster.api.watch(
        PODS,
        resource_version=listed.resource_version,
        namespace=E2E_NS,
        field_selector="metadata.name=nominated",
        timeout_seconds=5,
    ) as events:
        for event in events:
            pod = event.object
            spec, status = pod.get("spec") or {}, pod.get("status") or {}
            versions.append((is_gated(pod), status.get("nominatedNodeName"), spec.get("nodeName")))
            if spec.get("nodeName"):
                break
    assert (True, node, None) in versions, versions  # named while still gated
    assert versions[-1] == (False, None, node), versions  # bound there; the hint cleared


def test_1g_2g_and_3g_slices_share_one_gpu(cluster: InstaSliceStack) -> None:
    names = {"dra-pod-1g.5gb.yaml": "dra-1g-5gb", "dra-pod-2g.10gb.yaml": "dra-2g-10gb",
             "dra-pod-3g.20gb.yaml": "dra-3g-20gb"}  # fmt: skip
    for relative, pod_name in names.items():  # one at a time: first-fit then fills one GPU
        apply(cluster, sample(relative))
        wait_pod_running(cluster, SAMPLES_NS, pod_name)
    view = cluster.view()
    held = [slices_of_pod(view, SAMPLES_NS, n) for n in names.values()]
    assert [len(h) for h in held] == [1, 1, 1]
    assert len({(node, gpu) for ((node, gpu, _),) in held}) == 1
    assert sorted(item.profile for ((_, _, item),) in held) == ["1g.5gb", "2g.10gb", "3g.20gb"]


def test_one_pod_gets_three_slices_on_one_gpu_and_sees_all_three(
    cluster: InstaSliceStack,
) -> None:
    apply(cluster, sample("dra-pod-3-slices-one-gpu.yaml"))
    pod = wait_pod_running(cluster, SAMPLES_NS, "three-slices")
    held = slices_of_pod(cluster.view(), SAMPLES_NS, "three-slices")
    assert len(held) == 3
    assert len({(node, gpu) for node, gpu, _ in held}) == 1
    uuids = {item.mig_uuid for _, _, item in held}
    assert None not in uuids
    assert len(uuids) == 3
    # Every slice a container receives is visible to it (docs/design.md F9: last env var wins).
    assert visible_devices(cluster, pod) == uuids


def test_a_4g_and_a_3g_slice_fill_one_gpu(cluster: InstaSliceStack) -> None:
    # NVIDIA's guide: 4g.20gb (memory slices 0-3) + 3g.20gb (4-7) fill an A100-40GB.
    apply(cluster, sample("large-profiles/dra-pod-4g.20gb.yaml"))
    wait_pod_running(cluster, SAMPLES_NS, "dra-4g-20gb")
    apply(cluster, sample("dra-pod-3g.20gb.yaml"))
    wait_pod_running(cluster, SAMPLES_NS, "dra-3g-20gb")
    view = cluster.view()
    ((node4, gpu4, four),) = slices_of_pod(view, SAMPLES_NS, "dra-4g-20gb")
    ((node3, gpu3, three),) = slices_of_pod(view, SAMPLES_NS, "dra-3g-20gb")
    assert (node4, gpu4) == (node3, gpu3)
    assert (four.placement.start, four.placement.size) == (0, 4)
    assert (three.placement.start, three.placement.size) == (4, 4)


def test_two_whole_gpu_pods_land_on_two_gpus(cluster: InstaSliceStack) -> None:
    objects = sample("large-profiles/dra-pod-7g.40gb.yaml")
    pod = next(o for o in objects if o["kind"] == "Pod")
    apply(cluster, [*objects, renamed(pod, "dra-7g-40gb-second")])
    names = [pod["metadata"]["name"], "dra-7g-40gb-second"]
    wait_for(cluster, lambda: all(running(get_pod(cluster, SAMPLES_NS, n)) for n in names))
    view = cluster.view()
    gpus = [(node, gpu) for n in names for node, gpu, _ in slices_of_pod(view, SAMPLES_NS, n)]
    assert len(gpus) == 2
    assert len(set(gpus)) == 2


def test_a_pod_held_by_another_gate_is_placed_only_after_that_gate_is_lifted(
    cluster: InstaSliceStack,
) -> None:
    apply(cluster, [claim_template("queued", profile="1g.5gb", namespace=E2E_NS)])
    apply(cluster, [dra_pod("queued", template="queued", namespace=E2E_NS, gates=[KUEUE_GATE])])
    deadline = time.monotonic() + HOLD_S
    while time.monotonic() < deadline:
        pod = get_pod(cluster, E2E_NS, "queued")
        assert pod is not None
        gates = [g["name"] for g in pod["spec"].get("schedulingGates") or []]
        assert KUEUE_GATE in gates
        claims = cluster.api.list_objects(RESOURCE_CLAIMS, namespace=E2E_NS).items
        assert not any((c.get("status") or {}).get("allocation") for c in claims)
        time.sleep(0.1)
    assert pod is not None
    assert is_gated(pod), "the webhook gates the pod even while another gate holds it"
    remove_gate(cluster, pod, KUEUE_GATE)
    wait_for(cluster, lambda: running(get_pod(cluster, E2E_NS, "queued")))
    assert len(slices_of_pod(cluster.view(), E2E_NS, "queued")) == 1


def test_a_job_of_three_runs_to_completion_and_gives_its_slices_back(
    cluster: InstaSliceStack,
) -> None:
    template = sample_object("job.yaml", "ResourceClaimTemplate")
    job = sample_object("job.yaml", "Job")
    job["spec"].update(completions=3, parallelism=3)
    job["spec"]["template"]["metadata"].setdefault("annotations", {}).update(
        cluster.exit_annotations(job["spec"]["template"]["spec"]["containers"][0]["name"], 1)
    )
    apply(cluster, [template, job])
    label = "app.kubernetes.io/name=mig-job"
    held: set[str] = set()

    def job_done() -> bool:
        view = cluster.view()
        held.update(ref.key for g in view.gpus for t in g.taken for ref in t.pods)
        status = cluster.api.get(JOBS, name="mig-job", namespace=SAMPLES_NS).get("status") or {}
        return status.get("succeeded") == 3

    wait_for(cluster, job_done, message="the Job did not count three completions")
    job_pods = pods(cluster, SAMPLES_NS, label=label)
    assert [phase(p) for p in job_pods] == ["Succeeded"] * 3
    assert held == {f"{SAMPLES_NS}/{p['metadata']['name']}" for p in job_pods}
    wait_for(cluster, lambda: cluster.view().slices_taken() == 0, message="slices not released")
    wait_for(cluster, lambda: not any(cluster.mig_instances(n) for n in cluster.node_names))


def test_the_claims_opaque_config_reaches_the_container(cluster: InstaSliceStack) -> None:
    template = claim_template("configured", profile="1g.5gb", namespace=E2E_NS)
    template["spec"]["spec"]["devices"]["config"] = [
        {
            "opaque": {
                "driver": DRIVER_NAME,
                "parameters": {
                    "apiVersion": "mig.instaslice.dev/v1alpha1",
                    "kind": "MigDeviceConfig",
                    "env": {"HF_HOME": "/models/cache", "MIG_TEAM": "vision"},
                },
            }
        }
    ]
    apply(cluster, [template, dra_pod("configured", template="configured", namespace=E2E_NS)])
    pod = wait_pod_running(cluster, E2E_NS, "configured")
    env = container_env(cluster, pod)
    assert env["HF_HOME"] == "/models/cache"
    assert env["MIG_TEAM"] == "vision"
    (held,) = slices_of_pod(cluster.view(), E2E_NS, "configured")
    assert visible_devices(cluster, pod) == {held[2].mig_uuid}


GATED = 'instaslice_webhook_admissions_total{decision="gated"} '


def _gated_count(cluster: InstaSliceStack) -> float | None:
    """How many pods our webhook gated, as the controller's /metrics tells (None: unreadable)."""
    for line in cluster.controller_metrics().splitlines():
        if line.startswith(GATED):
            return float(line.removeprefix(GATED))
    return None


def test_the_controllers_metrics_count_the_pods_our_webhook_gated(
    cluster: InstaSliceStack,
) -> None:
    """The webhook runs in a process of its own; its figures reach the controller's /metrics."""
    before = wait_for(
        cluster,
        lambda: (_gated_count(cluster),) if _gated_count(cluster) is not None else None,
        timeout=30,
        message="the webhook's figures in the controller's /metrics",
    )[0]
    assert before is not None
    apply(cluster, [claim_template("counted", profile="1g.5gb", namespace=E2E_NS)])
    apply(cluster, [dra_pod("counted", template="counted", namespace=E2E_NS)])
    wait_pod_running(cluster, E2E_NS, "counted")
    wait_for(
        cluster,
        lambda: (_gated_count(cluster) or 0.0) >= before + 1 or None,
        timeout=30,
        message="one more gated pod counted",
    )


def _gone(cluster: InstaSliceStack, name: str) -> bool:
    try:
        cluster.api.get(RESOURCE_CLAIMS, name=name, namespace=E2E_NS)
    except ApiNotFoundError:
        return True
    return False


def _claim(name: str, device_class: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": E2E_NS},
        "spec": {
            "devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": device_class}}]}
        },
    }


def test_claims_of_our_classes_are_created_protected_and_still_go_away_unallocated(
    cluster: InstaSliceStack,
) -> None:
    """docs/design.md F25: the webhook adds the delete-protection finalizer when a claim of ours is
    created — the one the allocator needs before an allocation — so the controller has no update
    of its own to write. A claim that is deleted before it was ever allocated must not be held by
    it: kube-controller-manager lifts the finalizer of any unreserved claim being deleted."""
    listed = cluster.api.list_objects(RESOURCE_CLAIMS, namespace=E2E_NS)
    ours = cluster.api.create(
        RESOURCE_CLAIMS, _claim("protected", names.profile_device_class("1g.5gb")), namespace=E2E_NS
    )
    assert names.DELETE_PROTECTION_FINALIZER in ours["metadata"].get("finalizers", [])
    foreign = cluster.api.create(
        RESOURCE_CLAIMS, _claim("not-ours", "gpu.example.com"), namespace=E2E_NS
    )
    assert names.DELETE_PROTECTION_FINALIZER not in foreign["metadata"].get("finalizers", [])

    # a claim made for a pod from a template is protected from its first version on
    apply(cluster, [claim_template("protected", profile="1g.5gb", namespace=E2E_NS)])
    apply(cluster, [dra_pod("protected", template="protected", namespace=E2E_NS)])
    wait_pod_running(cluster, E2E_NS, "protected")
    first_seen: dict[str, list[str]] = {}
    with cluster.api.watch(
        RESOURCE_CLAIMS,
        resource_version=listed.resource_version,
        namespace=E2E_NS,
        timeout_seconds=5,
    ) as events:
        for event in events:
            claim = event.object
            owners = claim["metadata"].get("ownerReferences") or []
            if any(o.get("name") == "protected" for o in owners):
                first_seen.setdefault(
                    claim["metadata"]["name"], claim["metadata"].get("finalizers", [])
                )
                break
    assert len(first_seen) == 1, first_seen  # the pod's one generated claim
    ((generated, finalizers),) = first_seen.items()
    assert names.DELETE_PROTECTION_FINALIZER in finalizers, (generated, finalizers)

    for name in ("protected", "not-ours"):
        cluster.api.delete(RESOURCE_CLAIMS, name=name, namespace=E2E_NS)
    wait_for(
        cluster,
        lambda: all(_gone(cluster, n) for n in ("protected", "not-ours")) or None,
        timeout=60,
        message="both unallocated claims deleted (the finalizer lifted by the claim controller)",
    )
