"""Scheduler mode deployed as a user deploys it (``make deploy OVERLAY=scheduler-native-emulated``),
then switched live to controller mode by the steps of docs/deploy.md ("Scheduler → controller
mode", three ``make deploy``) while its pods run: they keep their slices, and new pods — DRA and
classic — are placed by the controller."""

from __future__ import annotations

from api import names
from driver.cluster.port import RESOURCE_CLAIMS
from driver.cluster.views import ClaimView
from tests.deployed import checks
from tests.deployed.deploy import SAMPLES_NS, Deploy, sample_path


def test_scheduler_mode_serves_dra_and_classic_pods_as_real_containers(deployed: Deploy) -> None:
    deployed.install("scheduler-native-emulated")
    assert (
        deployed.cluster.kubectl(
            "get", "mutatingwebhookconfigurations", "-o", "name"
        ).stdout.strip()
        == ""
    ), "scheduler mode has no webhook"
    deployed.namespaces()
    deployed.apply_ok("-f", sample_path("dra-pod-1g.5gb.yaml"))
    deployed.apply_ok("-f", sample_path("test-pod.yaml"))  # classic: nvidia.com/mig-1g.5gb: 1
    pods = deployed.wait_running(SAMPLES_NS, ["dra-1g-5gb", "cuda-vectoradd"])
    views = [checks.check_container(deployed.cluster, pod) for pod in pods]
    checks.check_no_slice_twice(views)
    logs = deployed.cluster.kubectl("-n", SAMPLES_NS, "logs", "cuda-vectoradd").stdout
    assert "emulated MIG slice" in logs, logs


def test_a_live_switch_to_controller_mode_keeps_the_slices_and_places_new_pods(
    deployed: Deploy,
) -> None:
    running = checks.running_pods(deployed.cluster, [SAMPLES_NS])
    before = {
        p["metadata"]["name"]: checks.container_view(deployed.cluster, p).mig_uuids for p in running
    }
    containers = checks.containers_by_pod(running)
    assert set(before) == {"dra-1g-5gb", "cuda-vectoradd"}
    # docs/deploy.md, scheduler -> controller: the controller and webhook first (shim still off),
    # then the shim, then the classes without extendedResourceName
    deployed.install("emulated", components="extended-resource-names classic-shim-off")
    deployed.install("emulated", components="extended-resource-names")
    deployed.install("emulated")
    after = checks.running_pods(deployed.cluster, [SAMPLES_NS])
    assert checks.containers_by_pod(after) == containers, "a running pod was restarted"
    for pod in after:
        assert (
            checks.container_view(deployed.cluster, pod).mig_uuids
            == before[pod["metadata"]["name"]]
        )
    deployed.apply_ok("-f", sample_path("dra-pod-2g.10gb.yaml"))
    deployed.apply_ok("-f", sample_path("deployment.yaml"))  # two classic pods
    pods = deployed.wait_running(SAMPLES_NS)
    assert len(pods) == 5
    views = [checks.check_container(deployed.cluster, pod) for pod in pods]
    checks.check_no_slice_twice(views)
    # classic pods of controller mode get a shadow claim from the controller
    shadows = [
        ClaimView.of(c)
        for c in deployed.api.list_objects(RESOURCE_CLAIMS, namespace=SAMPLES_NS).items
        if names.SHADOW_CLAIM_LABEL in ClaimView.of(c).meta.labels
    ]
    deployment_pods = {
        p["metadata"]["uid"] for p in pods if p["metadata"]["name"].startswith("mig-deployment-")
    }
    assert {uid for c in shadows for uid in c.meta.owner_pod_uids()} == deployment_pods
    deployed.delete_namespaced(SAMPLES_NS)
    deployed.cluster.wait_for(
        lambda: not checks.leaks(deployed.cluster) and not checks.node_artifacts(deployed.cluster),
        timeout=60,
        message="slices left after the pods ended",
        explain=lambda: (
            f"{checks.leaks(deployed.cluster)} {checks.node_artifacts(deployed.cluster)}"
        ),
    )
