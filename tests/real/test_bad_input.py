"""Bad input on the real API server: each object gets a clear answer of its own — the API server's
validation, our webhook's refusal, or a condition and Warning event on the pod — while a good pod
beside it is placed, and nothing leaks or crashes (the ``cluster`` fixture checks afterwards)."""

from __future__ import annotations

import copy

import pytest

from api.names import DRIVER_NAME
from driver.cluster.port import EVENTS, PODS, RESOURCE_CLAIMS, JsonObject
from driver.errors import ClusterError
from localcluster.realstack import RealStack
from tests.controller.harness import claim_object, request
from tests.e2e.conftest import E2E_NS
from tests.e2e.helpers import (
    claim_pod,
    classic_pod,
    get_pod,
    is_gated,
    placement_reason,
    running,
    wait_for,
)


def _claim(body: JsonObject) -> JsonObject:
    copied = copy.deepcopy(body)
    copied["metadata"]["namespace"] = E2E_NS
    return copied


def _reason(stack: RealStack, name: str) -> str | None:
    return placement_reason(stack, E2E_NS, name)


BAD_OPAQUE = [
    {
        "opaque": {
            "driver": DRIVER_NAME,
            "parameters": {
                "apiVersion": "mig.instaslice.dev/v1alpha1",
                "kind": "MigDeviceConfig",
                "bogus": 1,
            },
        }
    }
]

BAD_CLAIMS = [
    pytest.param(
        claim_object(
            "bad", requests=[request(selectors=["device.attributes['other.dev'].x == 1"])]
        ),
        "InvalidSelector",
        id="selector-fails-at-runtime",
    ),
    pytest.param(
        claim_object("bad", requests=[request(profile="1g.5gb", count=40)]),
        "Unsatisfiable",
        id="more-slices-than-any-node",
    ),
    pytest.param(
        claim_object(
            "bad",
            requests=[request(profile="1g.5gb", count=8)],
            constraints=[{"matchAttribute": f"{DRIVER_NAME}/parentUUID"}],
        ),
        "Unsatisfiable",
        id="more-slices-than-one-gpu",
    ),
    pytest.param(claim_object("bad", config=BAD_OPAQUE), "InvalidRequest", id="bad-opaque-config"),
    pytest.param(
        claim_object(
            "bad", requests=[request(profile=None, device_class="mig-9g.99gb.instaslice.dev")]
        ),
        "DeviceClassNotFound",
        id="unknown-device-class",
    ),
]


@pytest.mark.parametrize(("claim", "reason"), BAD_CLAIMS)
def test_a_bad_claim_gets_its_reason_and_a_good_pod_beside_it_runs(
    cluster: RealStack, claim: JsonObject, reason: str
) -> None:
    cluster.api.create(RESOURCE_CLAIMS, _claim(claim), namespace=E2E_NS)
    cluster.api.create(PODS, claim_pod("bad-pod", claim="bad", namespace=E2E_NS), namespace=E2E_NS)
    cluster.api.create(RESOURCE_CLAIMS, _claim(claim_object("good")), namespace=E2E_NS)
    cluster.api.create(
        PODS, claim_pod("good-pod", claim="good", namespace=E2E_NS), namespace=E2E_NS
    )
    wait_for(cluster, lambda: running(get_pod(cluster, E2E_NS, "good-pod")))
    wait_for(
        cluster,
        lambda: _reason(cluster, "bad-pod") == reason,
        message=f"no {reason}",
        explain=lambda: f"pod: {(get_pod(cluster, E2E_NS, 'bad-pod') or {}).get('status')}",
    )
    assert is_gated(get_pod(cluster, E2E_NS, "bad-pod"))
    events = cluster.api.list_objects(EVENTS, namespace=E2E_NS).items
    assert any(
        e["involvedObject"]["name"] == "bad-pod"
        and e["reason"] == reason
        and e["type"] == "Warning"
        for e in events
    )


@pytest.mark.parametrize(
    ("pod", "words"),
    [
        (classic_pod("odd-profile", profile="9g.99gb", namespace=E2E_NS), "9g.99gb"),
        (classic_pod("too-many", profile="1g.5gb", count=8, namespace=E2E_NS), "1g.5gb"),
    ],
    ids=["unknown-classic-profile", "classic-count-beyond-any-gpu"],
)
def test_the_webhook_refuses_impossible_classic_requests_with_its_reason(
    cluster: RealStack, pod: JsonObject, words: str
) -> None:
    with pytest.raises(ClusterError) as refused:
        cluster.api.create(PODS, pod, namespace=E2E_NS)
    message = str(refused.value)
    assert "pod-gate.instaslice.dev" in message
    assert words in message
    assert get_pod(cluster, E2E_NS, pod["metadata"]["name"]) is None


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"count": -1}, "count"),
        ({"selectors": [{"cel": {"expression": 'device.attributes["x" ==  '}}]}, "compilation"),
    ],
    ids=["count-negative", "selector-does-not-compile"],
)
def test_the_api_server_refuses_a_malformed_claim_itself(
    cluster: RealStack, change: JsonObject, words: str
) -> None:
    bad = _claim(claim_object("malformed"))
    bad["spec"]["devices"]["requests"][0]["exactly"].update(change)
    with pytest.raises(ClusterError) as refused:
        cluster.api.create(RESOURCE_CLAIMS, bad, namespace=E2E_NS)
    assert words in str(refused.value)


def test_a_pod_of_another_dra_driver_is_left_to_kube_scheduler(cluster: RealStack) -> None:
    cluster.kubectl_apply(
        [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "gpu.example.com"},
                "spec": {
                    "selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]
                },
            }
        ]
    )
    try:
        other = claim_object(
            "other", requests=[request(profile=None, device_class="gpu.example.com")]
        )
        cluster.api.create(RESOURCE_CLAIMS, _claim(other), namespace=E2E_NS)
        cluster.api.create(
            PODS, claim_pod("other-driver", claim="other", namespace=E2E_NS), namespace=E2E_NS
        )
        # not ours: never gated (or ungated at once), no condition of ours, never placed on our slices
        wait_for(cluster, lambda: not is_gated(get_pod(cluster, E2E_NS, "other-driver")))
        assert _reason(cluster, "other-driver") is None
        claim = cluster.api.get(RESOURCE_CLAIMS, name="other", namespace=E2E_NS)
        assert not (claim.get("status") or {}).get("allocation")
    finally:
        cluster.kubectl(["delete", "deviceclass", "gpu.example.com", "--ignore-not-found"])
