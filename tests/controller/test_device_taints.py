"""Tainted devices (an unhealthy GPU's): the controller allocates them only to requests that
tolerate every NoSchedule/NoExecute taint, matching tolerations as kube-scheduler does."""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from api.names import DRIVER_NAME
from driver.cluster.kube import KubeClusterApi
from driver.cluster.port import RESOURCE_CLAIMS, JsonObject
from driver.taints import (
    UNHEALTHY_TAINT_KEY,
    DeviceTaint,
    DeviceToleration,
    parse_tolerations,
    tolerates,
    untolerated,
)
from localcluster.apiserver import LocalApiServer
from tests.controller.harness import (
    NS,
    claim_object,
    cluster_api,
    condition_reason,
    create_pod_with_claim,
    get_pod,
    placement_condition,
    publish_node,
    request,
    start_controller,
    ungated,
    wait_for,
)

XID79 = DeviceTaint(key=UNHEALTHY_TAINT_KEY, value="Xid79", effect="NoSchedule")
GPU_INDEX = f'device.attributes["{DRIVER_NAME}"].gpuIndex'


# -- kube-scheduler's toleration rules (pure) --------------------------------------------------


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        (DeviceToleration(key=UNHEALTHY_TAINT_KEY, operator="Exists"), XID79, True),
        (DeviceToleration(operator="Exists"), XID79, True),  # empty key + Exists: everything
        (DeviceToleration(key=UNHEALTHY_TAINT_KEY, value="Xid79"), XID79, True),  # Equal
        (DeviceToleration(key=UNHEALTHY_TAINT_KEY, operator="", value="Xid79"), XID79, True),
        (DeviceToleration(key=UNHEALTHY_TAINT_KEY, value="Xid48"), XID79, False),
        (DeviceToleration(key="other.dev/x", operator="Exists"), XID79, False),
        (DeviceToleration(operator="Exists", effect="NoExecute"), XID79, False),
        (DeviceToleration(operator="Exists", effect="NoSchedule"), XID79, True),
        (DeviceToleration(key=UNHEALTHY_TAINT_KEY, operator="Lt", value="Xid79"), XID79, False),
        (DeviceToleration(key=UNHEALTHY_TAINT_KEY), XID79, False),  # Equal "" != "Xid79"
    ],
    ids=["key-exists", "all-exists", "equal", "empty-operator-is-equal", "other-value",
         "other-key", "other-effect", "same-effect", "unknown-operator", "equal-empty-value"],
)  # fmt: skip
def test_tolerates_like_kube_scheduler(
    toleration: DeviceToleration, taint: DeviceTaint, tolerated: bool
) -> None:
    assert tolerates(toleration, taint) is tolerated


@pytest.mark.parametrize(
    ("effect", "blocks"), [("NoSchedule", True), ("NoExecute", True), ("None", False)]
)
def test_only_no_schedule_and_no_execute_keep_a_device_away(effect: str, blocks: bool) -> None:
    taint = DeviceTaint(key=UNHEALTHY_TAINT_KEY, value="Xid79", effect=effect)
    assert (untolerated([taint], ()) == taint) is blocks


def test_tolerations_are_read_with_the_apis_default_operator() -> None:
    assert parse_tolerations([{"key": "k", "value": "v"}, {"operator": "Exists"}]) == (
        DeviceToleration(key="k", operator="Equal", value="v"),
        DeviceToleration(operator="Exists"),
    )


# -- the controller ----------------------------------------------------------------------------


@pytest.fixture
def api(apiserver: LocalApiServer, stack: ExitStack) -> KubeClusterApi:
    api = cluster_api(apiserver, stack)
    publish_node(api, "node-a", gpus=2, device_taints={0: [XID79]})
    return api


def allocated_devices(api: KubeClusterApi, claim: str) -> list[str]:
    got = api.get(RESOURCE_CLAIMS, name=claim, namespace=NS)
    return [r["device"] for r in got["status"]["allocation"]["devices"]["results"]]


def place(api: KubeClusterApi, pod: str, claim: JsonObject) -> list[str]:
    create_pod_with_claim(api, pod, claim)
    wait_for(lambda: ungated(api, pod), what=f"{pod} placed")
    return allocated_devices(api, claim["metadata"]["name"])


def test_a_tainted_gpu_is_skipped_and_a_tolerating_request_may_use_it(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    start_controller(apiserver, stack)
    # first fit would take GPU 0; it is tainted, so GPU 1
    assert place(api, "plain", claim_object("plain-claim")) == ["gpu-1-1g-5gb-0"]
    # a toleration for another reason does not help
    other = {"key": UNHEALTHY_TAINT_KEY, "operator": "Equal", "value": "GpuLost"}
    assert place(
        api, "other", claim_object("other-claim", requests=[request(tolerations=[other])])
    ) == ["gpu-1-1g-5gb-1"]
    # tolerating the taint (e.g. a diagnostics pod) makes GPU 0 usable again
    exists = {"key": UNHEALTHY_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
    assert place(
        api, "diag", claim_object("diag-claim", requests=[request(tolerations=[exists])])
    ) == ["gpu-0-1g-5gb-0"]


def test_a_request_only_tainted_devices_match_says_why(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    start_controller(apiserver, stack)
    claim = claim_object("gpu0-claim", requests=[request(selectors=[f"{GPU_INDEX} == 0"])])
    create_pod_with_claim(api, "gpu0", claim)
    wait_for(lambda: condition_reason(api, "gpu0") == "Unsatisfiable", what="the condition")
    condition = placement_condition(get_pod(api, "gpu0"))
    assert condition is not None
    message = str(condition.get("message"))
    assert "taint" in message
    assert f"{UNHEALTHY_TAINT_KEY}=Xid79:NoSchedule" in message
    assert not ungated(api, "gpu0")
