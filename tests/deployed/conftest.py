"""The deploy tier: InstaSlice as a user installs it — the images built from ``Dockerfile`` (``make
images``), ``make deploy`` / ``make undeploy`` — on real Kubernetes nodes that run real containers
(containerd with CDI, runc; ``../shared/realstack``, ``localcluster.containerstack``).

Collected only with ``--deploy-tier`` (``make test-deploy``, which builds the images first); where
the containerd nodes are not built every test here is skipped with one reason. One cluster (control
plane + two nodes) serves the session. The modules run in the order of their names and each brings
the cluster to what it needs: scheduler mode first, on nodes whose kubelets have never seen our
device plugin (a switch to scheduler mode would wait five minutes for them to forget it), then the
live switch to controller mode, the samples, the life cycle (upgrade, plugin restart, uninstall,
reinstall) and the deploys that cannot work.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster.containerstack import ContainerCluster, describe_missing
from localcluster.realstack import stack_path
from tests.deployed.deploy import Deploy, Images
from tests.tiers import skip_unless_built

HERE = Path(__file__).resolve().parent

IMG = os.environ.get("INSTASLICE_DEPLOY_IMG") or "localhost/instaslice-controller:deploy-test"
IMG_PLUGIN = (
    os.environ.get("INSTASLICE_DEPLOY_IMG_PLUGIN")
    or "localhost/instaslice-kubelet-plugin:deploy-test"
)
STAND_INS = {
    # samples/test-pod.yaml: bash, grep and sleep are what its script needs of the CUDA image
    "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda11.7.1-ubuntu20.04": "localhost/debian-python:bookworm",
}
"""Images the samples name that cannot be pulled here -> a local image of the same shape."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_unless_built(items, HERE, describe_missing())


def logs_dir() -> Path:
    """Where a run's make output, kubelet, containerd and daemon logs are kept."""
    return stack_path("INSTASLICE_DEPLOY_LOGS", "instaslice-deploy-logs")


def _buildah(*args: str) -> str:
    done = subprocess.run(
        ["buildah", *args], capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"buildah {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def _archive(image: str, directory: Path, *, name: str | None = None) -> Path:
    """``image`` from buildah's storage as a docker archive, tagged ``name`` (default: itself)."""
    path = directory / f"{(name or image).replace('/', '_').replace(':', '_')}.tar"
    _buildah("push", "-q", image, f"docker-archive:{path}:{name or image}")
    return path


def _relabelled(image: str, tag: str) -> str:
    """A new image (its own ID) with ``image``'s layers and a version label: an upgrade."""
    name = f"{image.rsplit(':', 1)[0]}:{tag}"
    container = _buildah("from", "--pull=never", image)
    try:
        _buildah("config", "--label", f"org.opencontainers.image.version={tag}", container)
        _buildah("commit", "-q", container, name)
    finally:
        _buildah("rm", container)
    return name


@pytest.fixture(scope="session")
def deployed() -> Iterator[Deploy]:
    for image in (IMG, IMG_PLUGIN):
        try:
            _buildah("inspect", "--type", "image", image)
        except RuntimeError:
            pytest.fail(f"image {image} is not built: run `make test-deploy` (it builds it)")
    logs = logs_dir()
    logs.mkdir(parents=True, exist_ok=True)
    upgrades = [_relabelled(IMG, "deploy-test-v2"), _relabelled(IMG_PLUGIN, "deploy-test-v2")]
    cluster = ContainerCluster(logs_dir=logs)
    try:
        with tempfile.TemporaryDirectory(prefix="instaslice-images-") as temp:
            archives = [_archive(i, Path(temp)) for i in (IMG, IMG_PLUGIN, *upgrades)]
            archives += [_archive(local, Path(temp), name=n) for n, local in STAND_INS.items()]
            cluster.start()
            for archive in archives:
                cluster.load_image(archive)
        deploy = Deploy(
            cluster=cluster,
            images=Images(
                controller=IMG,
                plugin=IMG_PLUGIN,
                controller_v2=upgrades[0],
                plugin_v2=upgrades[1],
            ),
        )
        yield deploy
    finally:
        cluster.stop()
        for image in upgrades:
            subprocess.run(["buildah", "rmi", image], capture_output=True, check=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    deploy = getattr(item, "funcargs", {}).get("deployed")
    if report.failed and isinstance(deploy, Deploy):
        report.sections.append(("cluster", deploy.describe()))
