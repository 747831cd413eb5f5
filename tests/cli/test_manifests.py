"""Applying manifests as ``kubectl apply -k`` would: rendering, create-or-update, delete."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.cluster.kube import KubeClusterApi, connect
from driver.cluster.port import PODS
from driver.errors import ConfigError
from localcluster.apiserver import LocalApiServer
from localcluster.manifests import (
    apply_all,
    apply_object,
    delete_all,
    read_kustomization,
    render_kustomization,
)
from localcluster.stack import SAMPLES_DIR


@pytest.fixture
def api(apiserver: LocalApiServer) -> Iterator[KubeClusterApi]:
    with connect(url=apiserver.url) as client:
        yield client


def _ids(objects: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (str(o["kind"]), str(o["metadata"].get("namespace", "")), str(o["metadata"]["name"]))
        for o in objects
    }


def test_samples_render_without_kubectl_as_kubectl_kustomize_does() -> None:
    objects = read_kustomization(SAMPLES_DIR)
    assert objects[0]["kind"] == "Namespace"
    kinds = {str(o["kind"]) for o in objects}
    assert {"Pod", "ResourceClaimTemplate", "Deployment", "Job", "StatefulSet"} <= kinds
    assert ("Pod", "instaslice-demo", "cuda-vectoradd") in _ids(objects)
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: only the fallback is checked")
    assert _ids(render_kustomization(SAMPLES_DIR)) == _ids(objects)


def test_the_fallback_refuses_kustomize_features_it_would_ignore(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: [a.yaml]\nnamePrefix: x-\n")
    with pytest.raises(ConfigError, match="namePrefix"):
        read_kustomization(tmp_path)


def test_apply_creates_then_updates_and_skips_kinds_the_server_does_not_serve(
    api: KubeClusterApi,
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default", "labels": {"a": "1"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "q", "namespace": "default"},
    }
    outcomes = apply_all(api, [pod, quota])
    assert [str(o) for o in outcomes] == [
        "pod/p created",
        "resourcequota/q skipped (kind not served by the local API server)",
    ]
    assert str(apply_object(api, pod)) == "pod/p unchanged"
    relabelled = {**pod, "metadata": {**pod["metadata"], "labels": {"b": "2"}}}  # type: ignore[dict-item]
    assert str(apply_object(api, relabelled)) == "pod/p configured"
    assert api.get(PODS, name="p", namespace="default")["metadata"]["labels"] == {
        "a": "1",
        "b": "2",
    }

    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "extra"}}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "gone-already", "namespace": "default"},
    }
    outcomes = delete_all(api, [namespace, pod, deployment, quota])
    assert [str(o) for o in outcomes] == [
        "resourcequota/q skipped (kind not served by the local API server)",
        "deployment.apps/gone-already not found",
        "pod/p deleted",
    ]
