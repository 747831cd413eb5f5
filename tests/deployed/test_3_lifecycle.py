"""The life cycle with pods holding slices: an upgrade to new image tags (no running pod loses its
slice, pods created during the roll are placed, nothing leaks), the plugin container killed and
restarted by the kubelet (recovery from the checkpoint on the host), the uninstall that refuses,
the drained uninstall that strands nothing, and installing again."""

from __future__ import annotations

import threading

import pytest
import yaml

from api import names
from driver.cluster.port import PODS, JsonObject
from driver.cluster.views import PodView
from tests.deployed import checks
from tests.deployed.deploy import SAMPLES, SAMPLES_NS, TIER_NS, Deploy, sample_path

WORKLOADS = (
    "deployment.yaml",
    "statefulset.yaml",
    "dra-pod-3-slices-one-gpu.yaml",
    "dra-pod-1g.10gb.yaml",
)
ORDINARY_POD = f"""
apiVersion: v1
kind: Pod
metadata: {{name: ordinary, namespace: {TIER_NS}}}
spec:
  containers:
  - {{name: app, image: "busybox:1.36", command: [sleep, "3600"]}}
"""


def _views(deployed: Deploy) -> dict[str, frozenset[str]]:
    return {
        PodView.of(p).key: checks.check_container(deployed.cluster, p).mig_uuids
        for p in checks.running_pods(deployed.cluster, [SAMPLES_NS])
    }


@pytest.fixture(scope="module")
def workloads(deployed: Deploy) -> dict[str, frozenset[str]]:
    """Classic and DRA workloads holding slices on both nodes, and what each container sees."""
    deployed.install("emulated")
    deployed.namespaces()
    for name in WORKLOADS:
        deployed.apply_ok("-f", sample_path(name))
    deployed.wait_running(SAMPLES_NS)
    views = _views(deployed)
    assert len(views) == 6
    return views


def _images(deployed: Deploy) -> set[str]:
    return {
        c["image"]
        for p in deployed.api.list_objects(PODS, namespace=names.SYSTEM_NAMESPACE).items
        for c in p["spec"]["containers"]
    }


def test_an_upgrade_keeps_every_slice_and_places_the_pods_created_during_the_roll(
    deployed: Deploy, workloads: dict[str, frozenset[str]]
) -> None:
    containers = checks.containers_by_pod(checks.running_pods(deployed.cluster, [SAMPLES_NS]))
    images = deployed.images
    result: dict[str, object] = {}
    roll = threading.Thread(
        target=lambda: result.update(
            done=deployed.install(
                "emulated",
                controller=images.controller_v2,
                plugin=images.plugin_v2,
                expect_success=False,
            )
        )
    )
    roll.start()
    try:
        # as soon as the first new daemon exists, users keep creating pods
        deployed.cluster.wait_for(
            lambda: bool(_images(deployed) & {images.controller_v2, images.plugin_v2}),
            timeout=120,
            message="the roll did not begin",
            interval=0.5,
        )
        deployed.apply_ok("-f", sample_path("dra-pod-1g.5gb.yaml"))
        deployed.apply_ok("-f", sample_path("test-pod.yaml"))
    finally:
        roll.join(timeout=600)
    done = result["done"]
    assert getattr(done, "returncode", 1) == 0, f"make deploy (upgrade): {done}"
    assert _images(deployed) == {images.controller_v2, images.plugin_v2}
    pods = deployed.wait_running(SAMPLES_NS)
    before = {k: v for k, v in checks.containers_by_pod(pods).items() if k in containers}
    assert before == containers, "a running pod was restarted by the upgrade"
    views = {PodView.of(p).key: checks.check_container(deployed.cluster, p) for p in pods}
    for key, uuids in workloads.items():
        assert views[key].mig_uuids == uuids, f"{key} lost or changed its slices"
    assert {f"{SAMPLES_NS}/dra-1g-5gb", f"{SAMPLES_NS}/cuda-vectoradd"} <= set(views)
    checks.check_no_slice_twice(views.values())
    assert checks.leaks(deployed.cluster) == []


def _plugin_on(deployed: Deploy, node: str) -> JsonObject:
    (pod,) = [
        p
        for p in deployed.api.list_objects(
            PODS,
            namespace=names.SYSTEM_NAMESPACE,
            label_selector="app.kubernetes.io/component=kubelet-plugin",
        ).items
        if PodView.of(p).node_name == node and PodView.of(p).meta.deletion_timestamp is None
    ]
    return pod


def _pinned_pod(node: str) -> str:
    """samples/dra-pod-1g.5gb.yaml's pod, renamed and pinned to ``node``."""
    objects = list(yaml.safe_load_all((SAMPLES / "dra-pod-1g.5gb.yaml").read_text()))
    pod = next(o for o in objects if o["kind"] == "Pod")
    pod["metadata"]["name"] = "pinned"
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return yaml.safe_dump(pod)


def test_the_plugin_killed_and_restarted_by_the_kubelet_recovers_from_its_checkpoint(
    deployed: Deploy,
) -> None:
    three = deployed.api.get(PODS, name="three-slices", namespace=SAMPLES_NS)
    node = PodView.of(three).node_name
    on_node = [
        p
        for p in checks.running_pods(deployed.cluster, [SAMPLES_NS])
        if PodView.of(p).node_name == node
    ]
    before = {
        PodView.of(p).key: checks.container_view(deployed.cluster, p).mig_uuids for p in on_node
    }
    plugin = _plugin_on(deployed, node)
    status = plugin["status"]["containerStatuses"][0]
    deployed.cluster.kill_container(node, status["containerID"])

    def restarted() -> bool:
        now = _plugin_on(deployed, node)
        ready = PodView.of(now).condition("Ready")
        restarts = now["status"]["containerStatuses"][0]["restartCount"]
        return restarts == status["restartCount"] + 1 and ready is not None and ready.true

    deployed.cluster.wait_for(
        restarted, timeout=180, message="the kubelet did not restart the plugin"
    )
    logs = deployed.cluster.kubectl(
        "-n", names.SYSTEM_NAMESPACE, "logs", plugin["metadata"]["name"]
    ).stdout
    recovery = [line for line in logs.splitlines() if '"recovery: ' in line]
    assert recovery, "the restarted plugin logged no recovery"
    kept = int(recovery[-1].split('"recovery: ', 1)[1].split(" kept", 1)[0])
    assert kept >= len(before), recovery[-1]
    for p in checks.running_pods(deployed.cluster, [SAMPLES_NS]):
        key = PodView.of(p).key
        if key in before:
            assert checks.container_view(deployed.cluster, p).mig_uuids == before[key]
    # the restarted plugin serves new pods on its node, and releases slices
    deployed.apply_ok("-f", "-", stdin=_pinned_pod(node))
    (pinned,) = deployed.wait_running(SAMPLES_NS, ["pinned"])
    checks.check_container(deployed.cluster, pinned)
    deployed.cluster.kubectl(
        "-n", SAMPLES_NS, "delete", "pod", "pinned", "dra-1g-5gb", "--grace-period=1"
    )
    deployed.cluster.wait_for(
        lambda: not checks.leaks(deployed.cluster),
        timeout=60,
        message="slices leaked",
        explain=lambda: str(checks.leaks(deployed.cluster)),
    )


def test_the_uninstall_refuses_while_pods_hold_slices_and_lists_them(deployed: Deploy) -> None:
    classes = deployed.cluster.kubectl("get", "deviceclasses", "-o", "name").stdout
    done = deployed.uninstall()
    assert done.returncode != 0
    assert "refusing to uninstall" in done.stdout, done.stdout + done.stderr
    for pod in checks.running_pods(deployed.cluster, [SAMPLES_NS]):
        assert PodView.of(pod).key in done.stdout
    assert deployed.cluster.kubectl("get", "deviceclasses", "-o", "name").stdout == classes
    assert len(deployed.api.list_objects(PODS, namespace=names.SYSTEM_NAMESPACE).items) == 4


def test_a_drained_uninstall_strands_no_pod_no_claim_no_slice_and_blocks_no_creation(
    deployed: Deploy,
) -> None:
    done = deployed.uninstall(drain=True)
    assert done.returncode == 0, done.stdout + done.stderr
    terminating = [
        PodView.of(p).key
        for p in deployed.api.list_objects(PODS).items
        if PodView.of(p).meta.deletion_timestamp is not None
    ]
    assert terminating == [], terminating
    assert checks.allocated_claims(deployed.cluster) == []
    assert checks.node_artifacts(deployed.cluster) == {}
    assert (
        deployed.cluster.kubectl("get", "mutatingwebhookconfigurations", "-o", "name").stdout == ""
    )
    assert deployed.cluster.kubectl("get", "deviceclasses", "-o", "name").stdout == ""
    assert (
        deployed.cluster.kubectl("get", "namespace", names.SYSTEM_NAMESPACE, check=False).returncode
        != 0
    )
    # no webhook refuses or holds a pod now: an ordinary pod runs, a DRA pod waits for a slice
    deployed.apply_ok("-f", "-", stdin=ORDINARY_POD)
    deployed.wait_running(TIER_NS, ["ordinary"])
    deployed.apply_ok("-f", sample_path("dra-pod-2g.10gb.yaml"))
    # the workloads' recreated pods wait Pending: the classic ones keep our gate (only InstaSlice
    # serves them), the DRA ones do not (kube-scheduler may)
    pending = deployed.pods(SAMPLES_NS)
    assert {PodView.of(p).phase for p in pending} == {"Pending"}
    for pod in pending:
        view = PodView.of(pod)
        classic = view.requests_resource(lambda n: n.startswith(names.CLASSIC_RESOURCE_PREFIX))
        assert view.gated_by(names.SCHEDULING_GATE) == classic, view.key
    deployed.cluster.kubectl("-n", TIER_NS, "delete", "pod", "ordinary", "--grace-period=1")


def test_installed_again_every_waiting_workload_gets_its_slices(deployed: Deploy) -> None:
    deployed.install("emulated")
    for workload in ("deployment/mig-deployment", "statefulset/mig-statefulset"):
        deployed.cluster.kubectl(
            "-n", SAMPLES_NS, "rollout", "status", workload, "--timeout=240s", timeout=300
        )
    pods = deployed.wait_running(SAMPLES_NS)
    views = [checks.check_container(deployed.cluster, p) for p in pods]
    checks.check_no_slice_twice(views)
    assert "dra-2g-10gb" in {PodView.of(p).name for p in pods}
    deployed.delete_namespaced(SAMPLES_NS)
    deployed.cluster.wait_for(
        lambda: not checks.node_artifacts(deployed.cluster),
        timeout=60,
        message="slices left after the workloads ended",
        explain=lambda: str(checks.node_artifacts(deployed.cluster)),
    )
