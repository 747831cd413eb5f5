"""Claims from ResourceClaimTemplates, made by kube-controller-manager's resourceclaim controller
(the local cluster's emulation of it) while the pod is gated: the allocator finds them through
``pod.status.resourceClaimStatuses`` and waits until they exist. Also the webhook's view of
templates and claims from the controller's caches."""

from __future__ import annotations

from contextlib import ExitStack
from functools import partial

import pytest

from api.names import DEVICE_CLASS_ANY, DRIVER_NAME, profile_device_class
from controller.app import Controller
from driver.cluster.kube import KubeClusterApi
from driver.cluster.port import DEVICE_CLASSES, PODS, RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS
from localcluster.apiserver import LocalApiServer
from localcluster.cluster.claimcontroller import ResourceClaimController
from localcluster.cluster.client import connect
from localcluster.cluster.loop import InformerFactory
from tests.controller.harness import (
    NS,
    assert_no_overlap,
    claim_object,
    cluster_api,
    get_pod,
    pod_object,
    publish_node,
    request,
    start_controller,
    ungated,
    wait_for,
)


@pytest.fixture
def api(apiserver: LocalApiServer, stack: ExitStack) -> KubeClusterApi:
    api = cluster_api(apiserver, stack)
    publish_node(api, "node-a", gpus=2)
    return api


def _template(name: str, profile: str, count: int = 1) -> dict[str, object]:
    spec = claim_object("unused", requests=[request(profile=profile, count=count)])["spec"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"spec": spec},
    }


def _template_pod(name: str, template: str) -> dict[str, object]:
    pod = pod_object(name)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    return pod


def test_claims_generated_from_templates_are_allocated_and_the_pods_ungated(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    api.create(RESOURCE_CLAIM_TEMPLATES, _template("two-slices", "1g.5gb", count=2), namespace=NS)
    for i in range(5):
        api.create(PODS, _template_pod(f"t{i}", "two-slices"), namespace=NS)
    controller = start_controller(apiserver, stack)
    wait_for(lambda: controller.allocator.leading_ready, what="allocating")
    assert not ungated(api, "t0")  # the claims do not exist yet: the pods wait

    manager_api = stack.enter_context(connect(apiserver.url, user_agent="kube-controller-manager"))
    informers = InformerFactory(manager_api, name="kcm")
    claims = ResourceClaimController(api=manager_api, informers=informers)
    claims.start()
    informers.start()
    stack.callback(informers.stop)
    stack.callback(claims.stop)

    for i in range(5):
        wait_for(partial(ungated, api, f"t{i}"), what=f"t{i} placed")
        (status,) = get_pod(api, f"t{i}")["status"]["resourceClaimStatuses"]
        claim = api.get(RESOURCE_CLAIMS, name=status["resourceClaimName"], namespace=NS)
        assert len(claim["status"]["allocation"]["devices"]["results"]) == 2
    assert assert_no_overlap(api) == 10


def test_the_webhook_context_answers_from_the_caches(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    api.create(RESOURCE_CLAIM_TEMPLATES, _template("tpl", "2g.10gb"), namespace=NS)
    api.create(
        RESOURCE_CLAIMS, claim_object("c", requests=[request(profile="3g.20gb")]), namespace=NS
    )
    controller: Controller = start_controller(apiserver, stack)
    wait_for(controller.informers.has_synced)
    context = controller.admission
    wait_for(lambda: context.claim_device_classes(namespace=NS, name="c") is not None)
    assert context.claim_device_classes(namespace=NS, name="c") == [profile_device_class("3g.20gb")]
    wait_for(lambda: context.template_device_classes(namespace=NS, name="tpl") is not None)
    assert context.template_device_classes(namespace=NS, name="tpl") == [
        profile_device_class("2g.10gb")
    ]
    assert context.claim_device_classes(namespace=NS, name="nope") is None
    ours = context.our_device_classes()
    assert {DEVICE_CLASS_ANY, profile_device_class("1g.5gb+me")} <= ours
    assert "gpus.example.com" not in ours
    api.create(  # a class of another name that selects our driver: ours from its first event on
        DEVICE_CLASSES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "gpus.example.com"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}]},
        },
    )
    wait_for(lambda: "gpus.example.com" in context.our_device_classes(), what="the new class")
    api.delete(DEVICE_CLASSES, name="gpus.example.com")
    wait_for(lambda: "gpus.example.com" not in context.our_device_classes(), what="class gone")
    assert "1g.5gb" in context.known_profiles()
    assert "7g.80gb" in context.known_profiles()  # from the catalog, published nowhere
    wait_for(lambda: context.max_slices_per_gpu("1g.5gb") == 7)
    assert context.max_slices_per_gpu("3g.20gb") == 2
    assert context.max_slices_per_gpu("7g.80gb") == 0
