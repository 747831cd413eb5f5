"""KinD configs, scripts, Dockerfile and Makefile targets: what can be checked without Docker or a
cluster (syntax, wiring, and that they agree with the manifests and pyproject.toml)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib

import pytest
import yaml

from tests.deploy import manifests as m

KIND_CONFIGS = ["cluster.yaml", "cluster-gpu.yaml"]
SCRIPTS = {
    "render.sh": "sh",
    "rollout.sh": "sh",
    "setup.sh": "bash",
    "e2e-kind-emulated.sh": "bash",
}
PYPROJECT = tomllib.loads((m.REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _dockerfile_stages() -> dict[str, list[str]]:
    """Stage name -> its instruction lines (continuations joined)."""
    text = (m.REPO_ROOT / "Dockerfile").read_text(encoding="utf-8")
    text = re.sub(r"\\\n", " ", text)
    stages: dict[str, list[str]] = {}
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if match := re.match(r"FROM \S+ AS (\S+)$", line):
            current = match.group(1)
            stages[current] = []
        elif current:
            stages[current].append(line)
    return stages


@pytest.mark.parametrize("config", KIND_CONFIGS)
def test_kind_config_enables_partitionable_devices_and_cdi(config: str) -> None:
    cluster = yaml.safe_load((m.DEPLOY / "kind" / config).read_text(encoding="utf-8"))
    assert (cluster["kind"], cluster["apiVersion"]) == ("Cluster", "kind.x-k8s.io/v1alpha4")
    assert cluster["featureGates"]["DRAPartitionableDevices"] is True
    (patch,) = cluster["containerdConfigPatches"]
    assert "enable_cdi = true" in patch
    plugin = m.one(
        m.render(m.DEPLOY / "overlays" / "emulated"), "DaemonSet", "instaslice-kubelet-plugin"
    )
    (container,) = plugin["spec"]["template"]["spec"]["containers"]
    cdi_root = next(e["value"] for e in container["env"] if e["name"] == "INSTASLICE_CDI_ROOT")
    assert f'"{cdi_root}"' in patch, (
        "containerd must read the CDI specs where the plugin writes them"
    )
    roles = [node["role"] for node in cluster["nodes"]]
    assert roles.count("control-plane") == 1
    assert roles.count("worker") >= 1


def test_emulated_kind_cluster_has_the_two_worker_nodes_samples_are_sized_for() -> None:
    cluster = yaml.safe_load((m.DEPLOY / "kind" / "cluster.yaml").read_text(encoding="utf-8"))
    assert [node["role"] for node in cluster["nodes"]].count("worker") == 2


def test_gpu_kind_cluster_passes_the_host_gpus_to_a_worker() -> None:
    cluster = yaml.safe_load((m.DEPLOY / "kind" / "cluster-gpu.yaml").read_text(encoding="utf-8"))
    mounts = [mount for node in cluster["nodes"] for mount in node.get("extraMounts", [])]
    assert {
        "hostPath": "/dev/null",
        "containerPath": "/var/run/nvidia-container-devices/all",
    } in mounts


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_scripts_are_executable_and_parse(script: str) -> None:
    path = m.DEPLOY / script
    assert os.access(path, os.X_OK), f"{script} is not executable"
    shell = shutil.which(SCRIPTS[script])
    if shell is None:
        pytest.skip(f"{SCRIPTS[script]} is not installed")
    result = subprocess.run(
        [shell, "-n", str(path)], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr


def test_setup_script_installs_the_gpu_operator_the_way_instaslice_needs_it() -> None:
    text = (m.DEPLOY / "setup.sh").read_text(encoding="utf-8")
    for setting in (
        "devicePlugin.enabled=false",
        "mig.strategy=mixed",
        "migManager.env[0].name=MIG_PARTED_MODE_CHANGE_ONLY",
        "migManager.env[0].value=true",
    ):
        assert setting in text, setting


def test_dockerfile_has_one_target_per_console_script_with_the_right_user() -> None:
    stages = _dockerfile_stages()
    scripts = PYPROJECT["project"]["scripts"]
    expected = {
        "controller": "instaslice-controller",
        "kubelet-plugin": "instaslice-kubelet-plugin",
    }
    controller = m.one(m.render(m.DEPLOY / "base"), "Deployment", "instaslice-controller")
    run_as = controller["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    for stage, script in expected.items():
        assert script in scripts
        assert f'ENTRYPOINT ["{script}"]' in stages[stage]
    assert f"USER {run_as}:{run_as}" in stages["controller"]
    assert "USER 0:0" in stages["kubelet-plugin"]


def test_image_build_context_holds_exactly_the_packages_pyproject_installs() -> None:
    packages = {
        p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    assert "localcluster" not in packages  # the test emulator never ships
    build = _dockerfile_stages()["build"]
    copied = {
        line.split()[1].rstrip("/")
        for line in build
        if line.startswith("COPY ") and line.split()[1].endswith("/")
    }
    assert copied == packages
    ignore = (m.REPO_ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    assert ignore[ignore.index("**") + 1 :], "everything is ignored except an allow-list"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    locks = {"requirements/product.lock", "requirements/build.lock"}
    assert allowed == packages | {"pyproject.toml", "README.md"} | locks


def _make_dry_run(*args: str) -> str:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    result = subprocess.run(
        [make, "-n", "--no-print-directory", *args],
        cwd=m.REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_make_deploy_renders_the_overlay_with_the_given_images() -> None:
    out = _make_dry_run("deploy", "IMG=reg/ctl:v2", "IMG_PLUGIN=reg/plugin:v2")
    assert "IMG='reg/ctl:v2' IMG_PLUGIN='reg/plugin:v2'" in out
    assert "deploy/render.sh gpu | kubectl apply -f -" in out
    emulated = _make_dry_run("deploy-emulated", "EMULATED_GPUS=4xH100-80GB")
    assert "EMULATED_GPUS='4xH100-80GB'" in emulated
    assert "deploy/render.sh emulated" in emulated


def test_make_deploy_waits_for_the_rollout_and_says_why_it_cannot_finish() -> None:
    out = _make_dry_run("deploy", "KUBECTL=/opt/k/kubectl")
    assert "KUBECTL='/opt/k/kubectl' deploy/rollout.sh" in out
    text = (m.DEPLOY / "rollout.sh").read_text(encoding="utf-8")
    for reason in ("ErrImagePull", "ImagePullBackOff", "CrashLoopBackOff"):
        assert reason in text
    assert "source=instaslice-kubelet-plugin" in text  # the plugin's Node warnings


def test_make_undeploy_renders_first_then_feeds_the_uninstall_that_drains_only_when_asked() -> None:
    refusing = _make_dry_run("undeploy", "OVERLAY=emulated")
    # the render's output is taken whole first, so a failed render stops the recipe (&&)
    assert "manifests=$(" in refusing
    assert "deploy/render.sh emulated) && printf" in refusing
    assert "| .venv/bin/python -m instaslice uninstall -f -" in refusing
    assert "--drain" not in refusing
    assert "uninstall -f - --drain" in _make_dry_run("undeploy", "DRAIN=true")


def test_make_images_builds_both_targets_with_buildah() -> None:
    out = _make_dry_run("images", "IMG=a:1", "IMG_PLUGIN=b:1")
    assert "buildah bud --network host --layers --target controller -t a:1 ." in out
    assert "buildah bud --network host --layers --target kubelet-plugin -t b:1 ." in out


def test_make_test_deploy_builds_the_images_then_runs_the_tier_under_the_lock() -> None:
    out = _make_dry_run("test-deploy")
    assert out.index("--target kubelet-plugin") < out.index("flock -w 3600 -o /tmp/realstack.lock")
    assert "pytest tests/deployed --deploy-tier" in out
    assert "flock" not in _make_dry_run("test-deploy", "REALSTACK_LOCK=")


def test_make_docker_targets_build_both_images_with_the_container_tool() -> None:
    out = _make_dry_run(
        "docker-build", "docker-push", "CONTAINER_TOOL=podman", "IMG=a:1", "IMG_PLUGIN=b:1"
    )
    assert "podman build --target controller -t a:1 ." in out
    assert "podman build --target kubelet-plugin -t b:1 ." in out
    assert "podman push a:1" in out
    assert "podman push b:1" in out
    multi = _make_dry_run("docker-buildx", "PLATFORMS=linux/amd64,linux/arm64")
    assert "buildx build --push --platform linux/amd64,linux/arm64 --target controller" in multi


def test_make_classes_targets_apply_the_generated_device_classes() -> None:
    assert "apply -f deploy/base/deviceclasses.yaml" in _make_dry_run("deploy-classes")
    assert "delete --ignore-not-found -f deploy/base/deviceclasses.yaml" in _make_dry_run(
        "undeploy-classes"
    )


def test_make_e2e_kind_targets_build_run_and_clean_up() -> None:
    out = _make_dry_run("test-e2e-kind-emulated", "KIND_CLUSTER=e2e")
    assert "build --target controller" in out
    assert "KIND_CLUSTER='e2e'" in out
    assert "deploy/e2e-kind-emulated.sh" in out
    assert "kind delete cluster --name e2e" in _make_dry_run(
        "cleanup-test-e2e-kind-emulated", "KIND_CLUSTER=e2e"
    )


def test_e2e_script_uses_the_kind_config_the_overlay_and_the_samples() -> None:
    text = (m.DEPLOY / "e2e-kind-emulated.sh").read_text(encoding="utf-8")
    for needed in ("deploy/kind/cluster.yaml", 'render.sh" emulated', 'apply -k "$repo/samples"'):
        assert needed in text, needed


def test_deploy_guide_links_resolve_and_name_every_deploy_target() -> None:
    guide = m.REPO_ROOT / "docs" / "deploy.md"
    text = guide.read_text(encoding="utf-8")
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" not in link:
            assert (guide.parent / link).resolve().exists(), link
    for target in (
        "docker-build",
        "docker-push",
        "docker-buildx",
        "deploy-emulated",
        "undeploy",
        "undeploy-classes",
        "test-e2e-kind-emulated",
        "cleanup-test-e2e-kind-emulated",
        "images",
        "test-deploy",
    ):
        assert f"make {target}" in text, target
    assert "docs/deploy.md" in (m.REPO_ROOT / "README.md").read_text(encoding="utf-8")
