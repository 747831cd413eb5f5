"""The shipped webhook configuration while no controller answers it (an outage, a rollout gone
wrong): only classic nvidia.com/mig-* pods are refused; a pod with another DRA driver's claim, and
an ordinary pod, are created as if InstaSlice were not installed; a pod with one of our claims is
created ungated (kube-scheduler allocates it: the same hand-off as --handoff-after)."""

from __future__ import annotations

import base64
import copy
import re
import socket
from collections.abc import Iterator

import pytest

from api.names import SCHEDULING_GATE
from driver.cluster.kube import KubeClusterApi, connect
from driver.cluster.port import PODS, JsonObject, gate_names
from driver.errors import ClusterError
from localcluster.apiserver import LocalApiServer
from localcluster.manifests import apply_object, load_file
from localcluster.resources import MUTATING_WEBHOOKS
from tests.deploy.manifests import DEPLOY

NS = "default"


def _closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def api(apiserver: LocalApiServer) -> Iterator[KubeClusterApi]:
    with connect(url=apiserver.url) as client:
        (config,) = [
            o
            for o in load_file(DEPLOY / "base" / "webhook.yaml")
            if o["kind"] == MUTATING_WEBHOOKS.kind
        ]
        config = copy.deepcopy(config)
        port = _closed_port()
        for hook in config["webhooks"]:
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}/mutate-v1-pod",
                "caBundle": base64.b64encode(b"unused: nothing answers").decode(),
            }
        apply_object(client, config)
        yield client


def _pod(
    name: str, *, claim_template: str | None = None, limits: dict[str, str] | None = None
) -> JsonObject:
    container: JsonObject = {"name": "main", "image": "busybox:1.36"}
    if limits:
        container["resources"] = {"limits": limits}
    spec: JsonObject = {"containers": [container]}
    if claim_template:
        spec["resourceClaims"] = [{"name": "dev", "resourceClaimTemplateName": claim_template}]
        container.setdefault("resources", {})["claims"] = [{"name": "dev"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


@pytest.mark.parametrize(
    "pod",
    [
        _pod("ordinary", limits={"cpu": "1"}),
        _pod("other-driver", claim_template="gpu-claim-of-another-driver"),
        _pod("ours-dra", claim_template="mig-1g-5gb"),
    ],
    ids=["ordinary", "another-drivers-claim", "our-dra-claim"],
)
def test_pods_without_classic_requests_are_created_ungated_while_the_webhook_is_down(
    api: KubeClusterApi, pod: JsonObject
) -> None:
    created = api.create(PODS, pod, namespace=NS)
    assert SCHEDULING_GATE not in gate_names(created)


@pytest.mark.parametrize(
    "pod",
    [
        _pod("classic", limits={"nvidia.com/mig-1g.5gb": "1"}),
        _pod(
            "classic-with-claim", claim_template="mig-1g-5gb", limits={"nvidia.com/mig-1g.5gb": "1"}
        ),
    ],
    ids=["classic", "classic-and-claim"],
)
def test_classic_pods_are_refused_while_the_webhook_is_down(
    api: KubeClusterApi, pod: JsonObject
) -> None:
    with pytest.raises(ClusterError, match=re.escape("pod-gate.instaslice.dev")):
        api.create(PODS, pod, namespace=NS)
