"""Deploys that cannot work get a clear answer, fast, and hurt nothing else: images that cannot be
pulled, a plugin whose host paths are not the kubelet's, the gpu overlay on a node without NVML.
Each is then repaired with an ordinary ``make deploy``."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest
import yaml

from api import names
from driver.cluster.port import PODS, JsonObject
from driver.cluster.views import PodView
from localcluster.containerstack import REPO_ROOT
from tests.deployed import checks
from tests.deployed.deploy import SAMPLES_NS, TIER_NS, Deploy, sample_path
from tests.deployed.test_3_lifecycle import ORDINARY_POD

FAST_S = 150.0
"""A bad deploy must be reported well before `make deploy`'s 300 s rollout timeout."""
BACKED_OFF_S = 40.0
ELSEWHERE = "/var/lib/kubelet-elsewhere"
"""Where the bad deploy points the kubelet's host paths (a kubelet with another root directory)."""
"""Long enough for a crash loop to show (the kubelet restarts a failed container at once)."""


@pytest.fixture(scope="module", autouse=True)
def nothing_installed(deployed: Deploy) -> Iterator[None]:
    """Each bad deploy starts from a cluster without InstaSlice; the module ends installed."""
    done = deployed.uninstall(drain=True)
    assert done.returncode == 0, done.stdout + done.stderr
    deployed.namespaces()
    yield
    deployed.install("emulated")


def _plugin_pods(deployed: Deploy) -> list[JsonObject]:
    return [
        p
        for p in deployed.api.list_objects(
            PODS,
            namespace=names.SYSTEM_NAMESPACE,
            label_selector="app.kubernetes.io/component=kubelet-plugin",
        ).items
        if PodView.of(p).meta.deletion_timestamp is None
    ]


def _node_events(deployed: Deploy, reason: str) -> list[JsonObject]:
    events = deployed.cluster.kubectl(
        "get", "events", "-A", "-o", "yaml",
        "--field-selector", f"involvedObject.kind=Node,reason={reason}",
    ).stdout  # fmt: skip
    return list((yaml.safe_load(events) or {}).get("items") or [])


def test_images_that_cannot_be_pulled_fail_the_deploy_fast_and_only_our_pods_wait(
    deployed: Deploy,
) -> None:
    missing = (
        "localhost/instaslice-controller:no-such-tag",
        "localhost/instaslice-kubelet-plugin:no-such-tag",
    )
    started = time.monotonic()
    done = deployed.install(
        "emulated", controller=missing[0], plugin=missing[1], expect_success=False
    )
    assert done.returncode != 0
    assert time.monotonic() - started < FAST_S
    assert "rollout: container" in done.stderr, done.stderr
    assert "no-such-tag" in done.stderr
    assert "ErrImagePull" in done.stderr or "ImagePullBackOff" in done.stderr
    # the cluster goes on: an ordinary pod runs; a pod of our classes waits for a slice
    deployed.apply_ok("-f", "-", stdin=ORDINARY_POD)
    deployed.wait_running(TIER_NS, ["ordinary"])
    deployed.apply_ok("-f", sample_path("dra-pod-1g.5gb.yaml"))
    time.sleep(10)
    pod = deployed.api.get(PODS, name="dra-1g-5gb", namespace=SAMPLES_NS)
    assert PodView.of(pod).phase == "Pending"
    # a classic pod is refused with the webhook's name (it could not be served without InstaSlice)
    refused = deployed.apply("-f", sample_path("test-pod.yaml"))
    assert refused.returncode != 0
    assert "pod-gate.instaslice.dev" in refused.stderr, refused.stderr
    # repaired: the waiting pod gets its slice
    deployed.install("emulated")
    (pod,) = deployed.wait_running(SAMPLES_NS, ["dra-1g-5gb"])
    checks.check_container(deployed.cluster, pod)
    deployed.cluster.kubectl("-n", TIER_NS, "delete", "pod", "ordinary", "--grace-period=1")
    deployed.delete_namespaced(SAMPLES_NS)


def _apply_with_host_paths_elsewhere(deployed: Deploy) -> None:
    """The emulated overlay as rendered, with the kubelet's host paths under another root (what
    a kubelet with another --root-dir looks like to the plugin), applied as a user would."""
    objects = list(yaml.safe_load_all(deployed.manifests("emulated")))
    plugin = next(o for o in objects if o and o["kind"] == "DaemonSet")
    for volume in plugin["spec"]["template"]["spec"]["volumes"]:
        path = volume.get("hostPath", {}).get("path", "")
        if path.startswith("/var/lib/kubelet/"):
            volume["hostPath"]["path"] = path.replace("/var/lib/kubelet/", f"{ELSEWHERE}/")
    deployed.apply_ok("-f", "-", stdin=yaml.safe_dump_all([o for o in objects if o]))


def _rollout(deployed: Deploy) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO_ROOT / "deploy" / "rollout.sh")],
        capture_output=True,
        text=True,
        timeout=400,
        env={**deployed.cluster.env(), "KUBECTL": str(deployed.cluster.paths.kubectl)},
        check=False,
    )


def _waiting_plugins(deployed: Deploy) -> list[JsonObject]:
    """The plugin pods that are not ready, each checked to be running and never restarted (no
    crash loop); at least one (no silent success). Nodes the roll has not reached yet keep
    their ready plugin: a DaemonSet replaces one node at a time."""
    pods = [p for p in _plugin_pods(deployed) if not p["status"]["containerStatuses"][0]["ready"]]
    assert pods, "every plugin is ready: a silent success"
    for pod in pods:
        view = PodView.of(pod)
        status = pod["status"]["containerStatuses"][0]
        assert "running" in status["state"], f"{view.key}: {status['state']}"
        assert status["restartCount"] == 0, f"{view.key} restarted: a crash loop"
    return pods


def test_a_plugin_the_kubelet_never_registers_says_so_on_the_node_and_is_not_ready(
    deployed: Deploy,
) -> None:
    _apply_with_host_paths_elsewhere(deployed)
    try:
        started = time.monotonic()
        done = _rollout(deployed)
        assert done.returncode != 0
        assert time.monotonic() - started < FAST_S
        assert "KubeletPluginNotRegistered" in done.stderr, done.stderr
        assert "/var/lib/kubelet/plugins_registry" in done.stderr
        time.sleep(BACKED_OFF_S)
        pods = _waiting_plugins(deployed)
        events = _node_events(deployed, "KubeletPluginNotRegistered")
        nodes = {PodView.of(p).node_name for p in pods}
        assert {e["involvedObject"]["name"] for e in events} >= nodes
        assert all(e["type"] == "Warning" for e in events)
    finally:
        # repaired by deploying what the overlay says
        deployed.install("emulated")
        shutil.rmtree(ELSEWHERE, ignore_errors=True)  # made on the host by DirectoryOrCreate


def test_the_gpu_overlay_on_a_node_without_nvml_says_so_and_backs_off(deployed: Deploy) -> None:
    node = deployed.cluster.node_names[0]
    cluster = deployed.cluster
    # a node labelled MIG-capable whose runtime handler for RuntimeClass nvidia gives no NVIDIA
    # library: the NVIDIA driver is missing there
    cluster.kubectl("label", "node", node, "nvidia.com/mig.capable=true", "--overwrite")
    deployed.apply_ok(
        "-f", "-",
        stdin="apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: nvidia}\nhandler: runc\n",
    )  # fmt: skip
    try:
        started = time.monotonic()
        done = deployed.install("gpu", expect_success=False)
        assert done.returncode != 0
        assert time.monotonic() - started < FAST_S
        assert "GpuBackendUnavailable" in done.stderr, done.stderr
        assert "NVIDIA driver" in done.stderr
        time.sleep(BACKED_OFF_S)
        (pod,) = _waiting_plugins(deployed)
        assert PodView.of(pod).node_name == node
        logs = cluster.kubectl("-n", names.SYSTEM_NAMESPACE, "logs", pod["metadata"]["name"]).stdout
        assert "trying again in 10s" in logs
        assert "trying again in 20s" in logs
        (event,) = _node_events(deployed, "GpuBackendUnavailable")
        assert event["involvedObject"]["name"] == node
        assert event["count"] <= 4, "retried faster than its back-off"
    finally:
        deployed.install("emulated")
        cluster.kubectl("label", "node", node, "nvidia.com/mig.capable-")
        cluster.kubectl("delete", "runtimeclass", "nvidia")
