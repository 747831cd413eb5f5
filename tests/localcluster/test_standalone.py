"""Contract: ``python -m localcluster`` runs standalone, and kubectl works against the server."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from localcluster.apiserver import LocalApiServer

MANIFEST = """\
apiVersion: v1
kind: Pod
metadata:
  name: demo
  labels: {app: demo}
spec:
  containers:
  - name: c
    image: busybox:1
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: mig.instaslice.dev
spec:
  selectors:
  - cel: {expression: 'device.driver == "mig.instaslice.dev"'}
"""


def _kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kubectl_apply_get_and_delete(apiserver: LocalApiServer, tmp_path: Path) -> None:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(MANIFEST)

    applied = _kubectl(kubeconfig, "apply", "-f", str(manifest))
    reapplied = _kubectl(kubeconfig, "apply", "-f", str(manifest))
    relabelled = _kubectl(kubeconfig, "label", "pod", "demo", "tier=gpu")
    listed = _kubectl(kubeconfig, "get", "pods", "-l", "tier=gpu", "-o", "name")
    classes = _kubectl(kubeconfig, "get", "deviceclasses")
    deleted = _kubectl(kubeconfig, "delete", "pod", "demo")

    assert applied.returncode == 0, applied.stderr
    assert "pod/demo created" in applied.stdout
    assert reapplied.returncode == 0, reapplied.stderr
    assert "unchanged" in reapplied.stdout
    assert relabelled.returncode == 0, relabelled.stderr
    assert listed.stdout.split() == ["pod/demo"]
    assert "mig.instaslice.dev" in classes.stdout
    assert deleted.returncode == 0, deleted.stderr


def test_module_serves_and_prints_kubeconfig(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc.yaml"
    process = subprocess.Popen(
        [sys.executable, "-m", "localcluster", "--port", "0", "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(2)]
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()

    assert lines[0].startswith("serving on http://127.0.0.1:")
    assert lines[1].strip() == f"kubeconfig: {kubeconfig}"
    assert kubeconfig.exists()
    assert code == 0
