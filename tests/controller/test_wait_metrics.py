"""Why pods wait, as the controller's metrics say it: each reason of ``waitreport`` reached by a
real pod on the local API server, the oldest wait per profile, and the free memory slices no
waiting profile can use (stranded) per GPU model."""

from __future__ import annotations

from contextlib import ExitStack
from functools import partial

import pytest

from api.names import SCHEDULING_GATE
from controller.allocation.sync import SyncConfig
from controller.app import Controller
from driver.cluster.kube import KubeClusterApi, configuration_for_url
from driver.cluster.port import PODS, RESOURCE_CLAIMS
from driver.mig.catalog import CATALOG
from localcluster.apiserver import LocalApiServer
from localcluster.cluster.client import LocalClusterClient
from tests.controller.harness import (
    KUEUE_GATE,
    NS,
    claim_object,
    cluster_api,
    condition_reason,
    create_pod_with_claim,
    pod_object,
    publish_node,
    release_claim,
    request,
    start_controller,
    ungated,
    wait_for,
)

MODEL = "A100-40GB"  # 8 memory slices; 1g.5gb may start at 0..6, 2g.10gb at 0, 2, 4
PRODUCT = CATALOG[MODEL].product_name  # the model label: what NVML and dcgm-exporter call it


@pytest.fixture
def api(apiserver: LocalApiServer, stack: ExitStack) -> KubeClusterApi:
    api = cluster_api(apiserver, stack)
    publish_node(api, "node-a", gpus=1, model=MODEL)
    return api


def _samples(controller: Controller, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    """``{labels: value}`` of one metric family in the controller's exposition."""
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for line in controller.metrics.exposition().decode().splitlines():
        if not line.startswith(f"instaslice_controller_{family}"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        if not name_labels.startswith(f"instaslice_controller_{family}{{"):
            continue
        labels = name_labels[len(f"instaslice_controller_{family}{{") : -1]
        pairs = tuple(
            (k, v.strip('"')) for k, v in (p.split("=", 1) for p in labels.split(",") if p)
        )
        out[pairs] = float(value)
    return out


def _waiting(controller: Controller) -> dict[tuple[str, str], float]:
    return {
        (dict(k)["reason"], dict(k)["profile"]): v
        for k, v in _samples(controller, "waiting_pods").items()
        if v
    }


def _by_model(controller: Controller, family: str) -> dict[str, float]:
    return {dict(k)["model"]: v for k, v in _samples(controller, family).items()}


def _fragment(api: KubeClusterApi) -> None:
    """1g.5gb pods at placements 0..6 one by one (first-fit), then those at 1, 3 and 5 gone:
    four memory slices free (1, 3, 5, 7), no two of them a 2g.10gb placement."""
    for i in range(7):
        name = f"small-{i}"
        create_pod_with_claim(api, name)
        wait_for(partial(ungated, api, name), what=f"{name} placed")
    for i in (1, 3, 5):
        api.delete(PODS, name=f"small-{i}", namespace=NS)
        release_claim(api, f"small-{i}-claim")


def test_each_reason_a_pod_waits_for_is_counted_with_its_profile(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    controller = start_controller(apiserver, stack)
    _fragment(api)
    wait_for(lambda: _by_model(controller, "free_memory_slices") == {PRODUCT: 4.0}, what="free")
    assert _by_model(controller, "stranded_memory_slices") == {PRODUCT: 0.0}  # nobody waits

    create_pod_with_claim(
        api, "two", claim_object("two-claim", requests=[request(profile="2g.10gb")])
    )
    create_pod_with_claim(
        api, "full", claim_object("full-claim", requests=[request(profile="7g.40gb")])
    )
    wait_for(lambda: condition_reason(api, "two") == "NoCapacity", what="two waits")
    wait_for(lambda: condition_reason(api, "full") == "NoCapacity", what="full waits")
    assert _waiting(controller) == {("fragmented", "2g.10gb"): 1.0, ("no-capacity", "7g.40gb"): 1.0}
    # neither profile fits the GPU: its four free slices are stranded
    assert _by_model(controller, "stranded_memory_slices") == {PRODUCT: 4.0}
    oldest = {
        dict(k)["profile"]: v for k, v in _samples(controller, "oldest_waiting_pod_seconds").items()
    }
    assert set(oldest) == {"2g.10gb", "7g.40gb"}
    assert all(0.0 <= age < 600 for age in oldest.values())

    # a 1g.5gb pod that may not go to the node: room exists, the filter keeps it off
    api.create(RESOURCE_CLAIMS, claim_object("picky-claim"), namespace=NS)
    api.create(
        PODS,
        pod_object("picky", claims=["picky-claim"], nodeSelector={"pool": "elsewhere"}),
        namespace=NS,
    )
    # a request no GPU can ever hold, a pod behind Kueue's gate, a pod whose claim is missing
    create_pod_with_claim(
        api, "huge", claim_object("huge-claim", requests=[request(profile="1g.5gb", count=15)])
    )
    api.create(
        PODS,
        pod_object(
            "queued", gates=(KUEUE_GATE, SCHEDULING_GATE), classic={"nvidia.com/mig-1g.5gb": 1}
        ),
        namespace=NS,
    )
    api.create(PODS, pod_object("early", claims=["not-yet"]), namespace=NS)
    wait_for(lambda: condition_reason(api, "huge") == "Unsatisfiable", what="huge refused")
    expected = {
        ("fragmented", "2g.10gb"): 1.0,
        ("no-capacity", "7g.40gb"): 1.0,
        ("node-filter", "1g.5gb"): 1.0,
        ("unsatisfiable", ""): 1.0,
        ("gated-elsewhere", ""): 1.0,
        ("pending", ""): 1.0,
    }
    wait_for(lambda: _waiting(controller) == expected, what=f"the reasons {expected}")
    # a waiting 1g.5gb pod could use the free slices: none is stranded any more
    assert _by_model(controller, "stranded_memory_slices") == {PRODUCT: 0.0}

    # room comes back: the 2g.10gb pod is placed and counts no more
    release_claim(api, "small-2-claim")
    api.delete(PODS, name="small-2", namespace=NS)
    wait_for(lambda: ungated(api, "two"), what="two placed")
    wait_for(
        lambda: ("fragmented", "2g.10gb") not in _waiting(controller), what="two counted no more"
    )


def test_a_pod_handed_to_kube_scheduler_counts_until_bound(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    controller = start_controller(apiserver, stack, sync=SyncConfig(handoff_after=0.3))
    full = claim_object("first-claim", requests=[request(profile="7g.40gb")])
    create_pod_with_claim(api, "first", full)
    wait_for(lambda: ungated(api, "first"), what="first placed")
    create_pod_with_claim(
        api, "second", claim_object("second-claim", requests=[request(profile="7g.40gb")])
    )
    wait_for(lambda: condition_reason(api, "second") == "HandedOff", what="second handed off")
    # its profile stays known until the controller has seen the gate go; the reason at once
    wait_for(
        lambda: {reason for reason, _ in _waiting(controller)} == {"hand-off"},
        timeout=30,
        what="hand-off counted",
    )
    binder = LocalClusterClient(configuration=configuration_for_url(apiserver.url))
    stack.callback(binder.close)
    second = api.get(PODS, name="second", namespace=NS)
    binder.bind_pod(namespace=NS, name="second", uid=second["metadata"]["uid"], node="node-a")
    wait_for(lambda: _waiting(controller) == {}, timeout=30, what="a bound pod waits no more")
