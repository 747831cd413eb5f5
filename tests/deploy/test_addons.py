"""Objects of add-ons the local cluster does not run (cert-manager, KServe, Kueue): their references
to each other and to our objects hold, and the pod-shaped parts pass the core schema check."""

from __future__ import annotations

from typing import Any

from api import names
from tests.deploy import manifests as m
from tests.deploy.manifests import parse_quantity

INTEGRATIONS = m.SAMPLES / "integrations"


def test_cert_manager_component_serves_the_webhook_service_name() -> None:
    objects = m.render_script("gpu", {"COMPONENTS": "cert-manager"})
    (issuer,) = m.find(objects, "Issuer")
    (certificate,) = m.find(objects, "Certificate")
    assert certificate["spec"]["issuerRef"] == {
        "kind": "Issuer",
        "name": issuer["metadata"]["name"],
    }
    service = m.one(objects, "Service", "instaslice-webhook")
    service_dns = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert service_dns in certificate["spec"]["dnsNames"]
    controller = m.one(objects, "Deployment", "instaslice-controller")
    volumes = {v["name"]: v for v in controller["spec"]["template"]["spec"]["volumes"]}
    assert volumes["webhook-certs"] == {
        "name": "webhook-certs",
        "secret": {"secretName": certificate["spec"]["secretName"], "defaultMode": 0o440},
    }
    (container,) = controller["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["INSTASLICE_CERT_MODE"] == "cert-manager"
    (config,) = m.find(objects, "MutatingWebhookConfiguration")
    namespace = certificate["metadata"]["namespace"]
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{namespace}/{certificate['metadata']['name']}"
    )


def test_kserve_predictor_asks_for_a_slice_the_classic_way() -> None:
    (service,) = m.find(m.render(INTEGRATIONS), "InferenceService")
    model = service["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"]
    assert model["storageUri"].startswith("hf://")
    resources = model["resources"]
    assert m.field_errors(resources, "V1ResourceRequirements", path="model.resources") == []
    assert any(r.startswith(names.CLASSIC_RESOURCE_PREFIX) for r in resources["limits"])


def test_kueue_queues_reference_each_other_and_cover_what_the_jobs_ask() -> None:
    objects = m.render(INTEGRATIONS)
    flavors = {f["metadata"]["name"] for f in m.find(objects, "ResourceFlavor")}
    (cluster_queue,) = m.find(objects, "ClusterQueue")
    covered: dict[str, Any] = {}
    for group in cluster_queue["spec"]["resourceGroups"]:
        for flavor in group["flavors"]:
            assert flavor["name"] in flavors
            assert [r["name"] for r in flavor["resources"]] == group["coveredResources"]
            for resource in flavor["resources"]:
                parse_quantity(resource["nominalQuota"])
                covered[resource["name"]] = resource["nominalQuota"]
    local_queues = {
        (q["metadata"]["namespace"], q["metadata"]["name"]): q
        for q in m.find(objects, "LocalQueue")
    }
    for queue in local_queues.values():
        assert queue["spec"]["clusterQueue"] == cluster_queue["metadata"]["name"]
    jobs = [
        j for j in m.find(objects, "Job") if "kueue.x-k8s.io/queue-name" in j["metadata"]["labels"]
    ]
    assert len(jobs) > int(covered["nvidia.com/mig-1g.5gb"]), "the sample must show queueing"
    text = (INTEGRATIONS / "kueue.yaml").read_text(encoding="utf-8")
    for job in jobs:
        key = (job["metadata"]["namespace"], job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"])
        assert key in local_queues
        assert job["spec"]["suspend"] is True
        (container,) = job["spec"]["template"]["spec"]["containers"]
        asked = set(container["resources"]["requests"]) | {
            r
            for r in container["resources"]["limits"]
            if r.startswith(names.CLASSIC_RESOURCE_PREFIX)
        }
        assert asked <= set(covered), job["metadata"]["name"]
        for claim in job["spec"]["template"]["spec"].get("resourceClaims", []):
            template = m.one(objects, "ResourceClaimTemplate", claim["resourceClaimTemplateName"])
            (request,) = template["spec"]["spec"]["devices"]["requests"]
            # The DRA job is counted through Kueue's deviceClassMappings, documented in the file.
            assert f"deviceClassNames: [{request['exactly']['deviceClassName']}]" in text
