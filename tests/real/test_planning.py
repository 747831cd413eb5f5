"""``instaslice defrag --apply`` on the real API server: its plan evicted through the real Eviction
API, where a real PodDisruptionBudget (enforced by kube-apiserver, its status kept by
kube-controller-manager) refuses — the one thing the local cluster only imitates."""

from __future__ import annotations

import io
from typing import Any

from api import names
from driver.cluster.port import NODES, ClusterApi, JsonObject
from instaslice import cli, plancli
from localcluster.realstack import RealStack
from tests.e2e.conftest import E2E_NS
from tests.e2e.helpers import apply, get_pod, wait_for, wait_pod_running

HOSTNAME = "kubernetes.io/hostname"
PDB_PATH = f"/apis/policy/v1/namespaces/{E2E_NS}/poddisruptionbudgets/keep-small"


def _template(name: str, *, profile: str, gpu_index: int | None = None) -> JsonObject:
    exactly: JsonObject = {"deviceClassName": names.profile_device_class(profile)}
    if gpu_index is not None:
        attribute = f'device.attributes["{names.DRIVER_NAME}"].{names.ATTRIBUTE_GPU_INDEX}'
        exactly["selectors"] = [{"cel": {"expression": f"{attribute} == {gpu_index}"}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": E2E_NS},
        "spec": {"spec": {"devices": {"requests": [{"name": "mig", "exactly": exactly}]}}},
    }


def _pod(name: str, *, template: str, hostname: str) -> JsonObject:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": E2E_NS, "labels": {"app": name}},
        "spec": {
            "nodeSelector": {HOSTNAME: hostname},
            "resourceClaims": [{"name": "mig", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "app",
                    "image": "busybox:1.36",
                    "resources": {"requests": {"cpu": "10m"}, "claims": [{"name": "mig"}]},
                }
            ],
        },
    }


class _Borrowed:
    """The stack's client lent to the CLI, which closes what it connects: this one stays open."""

    def __init__(self, api: ClusterApi) -> None:
        self._api = api

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def __enter__(self) -> _Borrowed:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


def _defrag(cluster: RealStack) -> tuple[int, str]:
    args = cli.build_parser().parse_args(
        ["defrag", "--profile", "7g.40gb", "--kube-api-url", "http://unused", "--apply", "--yes"]
    )
    out = io.StringIO()
    code = plancli.run_defrag(args, out=out, connect=lambda _: _Borrowed(cluster.api))
    return code, out.getvalue()


def test_defrag_evicts_its_plan_through_the_eviction_api_and_a_budget_holds(
    cluster: RealStack,
) -> None:
    first, second = (
        cluster.api.get(NODES, name=node)["metadata"]["labels"][HOSTNAME]
        for node in cluster.node_names[:2]
    )
    # every GPU of the two nodes holds something, so no 7g.40gb fits: a 3g on GPU 0 and GPU 1 of
    # the second node and on GPU 1 of the first, and a small pod (first fit: the first GPU 0)
    apply(
        cluster,
        [
            _template("g0-3g", profile="3g.20gb", gpu_index=0),
            _template("g1-3g", profile="3g.20gb", gpu_index=1),
            _template("small", profile="1g.5gb"),
        ],
    )
    apply(
        cluster,
        [
            _pod("big-a", template="g0-3g", hostname=second),
            _pod("big-b", template="g1-3g", hostname=second),
            _pod("big-c", template="g1-3g", hostname=first),
        ],
    )
    for name in ("big-a", "big-b", "big-c"):
        wait_pod_running(cluster, E2E_NS, name)
    apply(cluster, [_pod("small", template="small", hostname=first)])
    wait_pod_running(cluster, E2E_NS, "small")
    apply(
        cluster,
        [
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "keep-small", "namespace": E2E_NS},
                "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "small"}}},
            }
        ],
    )
    try:
        code, out = _defrag(cluster)
        assert code == 1, out
        assert f"{E2E_NS}/small: not evicted, a PodDisruptionBudget refuses now" in out, out
        assert get_pod(cluster, E2E_NS, "small") is not None
    finally:
        cluster.api.request("DELETE", PDB_PATH)
    code, out = _defrag(cluster)  # the budget gone, kube-apiserver lets the eviction through
    assert code == 0, out
    assert f"{E2E_NS}/small: evicted" in out, out
    wait_for(
        cluster,
        lambda: get_pod(cluster, E2E_NS, "small") is None or None,
        message="the evicted pod is gone",
    )
