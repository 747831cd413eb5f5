"""The samples a user applies: listed in their kustomization, explained, schedulable on the emulated
demo cluster (2 nodes x 2 A100-40GB), asking only for profiles and DeviceClasses that exist, and all
recognised by the webhook's matchConditions."""

from __future__ import annotations

from typing import Any

import celpy
import pytest
import yaml
from celpy.adapter import json_to_cel

from api import names
from driver.mig.catalog import CATALOG
from localcluster.admission import match_conditions_hold
from tests.deploy import manifests as m

DEMO_GPU = CATALOG["A100-40GB"]
DEMO_GPUS = 4  # 2 nodes x 2 A100-40GB
SAMPLE_DIRS = {
    "samples": m.SAMPLES,
    "samples/large-profiles": m.SAMPLES / "large-profiles",
    "samples/integrations": m.SAMPLES / "integrations",
}
PINNED_IMAGES = {
    "busybox:1.36",
    "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda11.7.1-ubuntu20.04",
    "vllm/vllm-openai:v0.9.2",
}


def _classes() -> set[str]:
    text = (m.DEPLOY / "base" / "deviceclasses.yaml").read_text(encoding="utf-8")
    return {d["metadata"]["name"] for d in yaml.safe_load_all(text) if d}


def _reached_webhooks(pod_spec: dict[str, Any], *, resource: str = "pods") -> list[str]:
    """Names of the deployed webhooks whose rules take ``resource`` and whose matchConditions send
    this object (a pod's spec, or a claim's) to us."""
    (config,) = m.find(m.render(m.DEPLOY / "base"), "MutatingWebhookConfiguration")
    obj = {"spec": pod_spec, "metadata": {}}
    return [
        w["name"]
        for w in config["webhooks"]
        if any(resource in rule["resources"] for rule in w["rules"])
        and match_conditions_hold(w, obj, None)
    ]


def _containers(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod_spec.get("initContainers", []), *pod_spec["containers"]]


def _classic_requests(pod_spec: dict[str, Any]) -> dict[str, int]:
    """Profile -> slices, over every container's nvidia.com/mig-* limits."""
    wanted: dict[str, int] = {}
    for container in _containers(pod_spec):
        for resource, amount in container.get("resources", {}).get("limits", {}).items():
            if resource.startswith(names.CLASSIC_RESOURCE_PREFIX):
                profile = resource.removeprefix(names.CLASSIC_RESOURCE_PREFIX)
                wanted[profile] = wanted.get(profile, 0) + int(amount)
    return wanted


def _replicas(obj: m.Manifest) -> int:
    """How many pods of the object run at the same time."""
    if obj["kind"] == "Job":
        return int(obj["spec"].get("parallelism", 1))
    return int(obj["spec"].get("replicas", 1)) if obj["kind"] != "Pod" else 1


@pytest.mark.parametrize("folder", sorted(SAMPLE_DIRS))
def test_every_sample_file_is_in_its_kustomization_and_says_what_to_expect(folder: str) -> None:
    directory = SAMPLE_DIRS[folder]
    listed = yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))
    files = {p.name for p in directory.glob("*.yaml") if p.name != "kustomization.yaml"}
    assert set(listed["resources"]) == files
    for name in files - {"namespace.yaml"}:
        text = (directory / name).read_text(encoding="utf-8")
        assert "What you should see" in text, f"{folder}/{name} does not say what the user sees"


@pytest.mark.parametrize("folder", ["samples", "samples/large-profiles"])
def test_local_samples_ask_for_demo_gpu_profiles_and_existing_classes(folder: str) -> None:
    objects = m.render(SAMPLE_DIRS[folder])
    classes = _classes()
    templates = {
        (t["metadata"]["namespace"], t["metadata"]["name"]): t
        for t in m.find(objects, "ResourceClaimTemplate")
    }
    if folder != "samples":  # large-profiles relies on the namespace of the main set
        templates.update(
            {
                (t["metadata"]["namespace"], t["metadata"]["name"]): t
                for t in m.find(m.render(m.SAMPLES), "ResourceClaimTemplate")
            }
        )
    for template in templates.values():
        for request in template["spec"]["spec"]["devices"]["requests"]:
            assert request["exactly"]["deviceClassName"] in classes
    for obj in objects:
        for pod_spec in m.pod_specs(obj):
            namespace = obj["metadata"]["namespace"]
            for profile in _classic_requests(pod_spec):
                assert profile in DEMO_GPU.profile_names, profile
            claim_names = set()
            for claim in pod_spec.get("resourceClaims", []):
                assert (namespace, claim["resourceClaimTemplateName"]) in templates
                claim_names.add(claim["name"])
            used = {
                c["name"] for ct in _containers(pod_spec) for c in ct["resources"].get("claims", [])
            }
            assert used == claim_names, obj["metadata"]["name"]


def _demo_profile(template: m.Manifest) -> list[str]:
    """The demo-GPU profile of each slice a template asks for (per-profile class or CEL on profile)."""
    profiles = []
    env = celpy.Environment()
    for request in template["spec"]["spec"]["devices"]["requests"]:
        exact = request["exactly"]
        matching = []
        for profile in DEMO_GPU.profile_names:
            if exact["deviceClassName"] not in {
                names.DEVICE_CLASS_ANY,
                names.profile_device_class(profile),
            }:
                continue
            device = json_to_cel(
                {
                    "driver": names.DRIVER_NAME,
                    "attributes": {names.DRIVER_NAME: {"profile": profile}},
                }
            )
            selectors = [s["cel"]["expression"] for s in exact.get("selectors", [])]
            if all(env.program(env.compile(s)).evaluate({"device": device}) for s in selectors):
                matching.append(profile)
        assert len(matching) == 1, f"{template['metadata']['name']} is ambiguous: {matching}"
        profiles.extend(matching * int(exact.get("count", 1)))
    return profiles


def test_core_samples_fit_the_demo_cluster_together() -> None:
    """Necessary condition checked here: the slices asked at the same time fit the 4 demo GPUs' memory
    and compute slices. (The end-to-end suite places them for real.)"""
    objects = m.render(m.SAMPLES)
    templates = {
        (t["metadata"]["namespace"], t["metadata"]["name"]): t
        for t in m.find(objects, "ResourceClaimTemplate")
    }
    wanted: list[str] = []
    for obj in objects:
        for pod_spec in m.pod_specs(obj):
            per_pod = [p for p, n in _classic_requests(pod_spec).items() for _ in range(n)]
            for claim in pod_spec.get("resourceClaims", []):
                template = templates[
                    (obj["metadata"]["namespace"], claim["resourceClaimTemplateName"])
                ]
                per_pod.extend(_demo_profile(template))
            wanted.extend(per_pod * _replicas(obj))
    memory = sum(DEMO_GPU.profile(p).memory_slices for p in wanted)
    compute = sum(DEMO_GPU.profile(p).compute_slices for p in wanted)
    assert memory <= DEMO_GPUS * DEMO_GPU.memory_slices
    assert compute <= DEMO_GPUS * DEMO_GPU.compute_slices
    assert (memory, compute) == (24, 22), "update the figures in samples/kustomization.yaml"


@pytest.mark.parametrize("folder", sorted(SAMPLE_DIRS))
def test_images_are_pinned_and_known(folder: str) -> None:
    for obj in m.render(SAMPLE_DIRS[folder]):
        for pod_spec in m.pod_specs(obj):
            for container in _containers(pod_spec):
                assert container["image"] in PINNED_IMAGES, container["image"]


@pytest.mark.parametrize("folder", sorted(SAMPLE_DIRS))
def test_samples_live_in_their_own_namespaces_which_the_webhook_serves(folder: str) -> None:
    objects = m.render(SAMPLE_DIRS[folder])
    declared = {n["metadata"]["name"] for n in m.find(objects, "Namespace")}
    if folder == "samples/large-profiles":
        declared = {n["metadata"]["name"] for n in m.find(m.render(m.SAMPLES), "Namespace")}
    for obj in objects:
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] in {"Namespace", "ClusterQueue", "ResourceFlavor"}:
            assert namespace is None
            continue
        assert namespace in declared, f"{obj['kind']}/{obj['metadata']['name']}"
        assert namespace not in {"kube-system", names.SYSTEM_NAMESPACE}


@pytest.mark.parametrize("folder", sorted(SAMPLE_DIRS))
def test_every_sample_claim_and_template_reaches_the_claim_finalizer_webhook(folder: str) -> None:
    """Claims the samples create (directly, or through kube-controller-manager from a template)
    name our classes, so each gets the delete-protection finalizer at creation."""
    specs = [
        obj["spec"] if obj["kind"] == "ResourceClaim" else obj["spec"]["spec"]
        for obj in m.render(SAMPLE_DIRS[folder])
        if obj["kind"] in ("ResourceClaim", "ResourceClaimTemplate")
    ]
    for spec in specs:
        assert _reached_webhooks(spec, resource="resourceclaims") == [
            "claim-finalizer.instaslice.dev"
        ]
    if folder == "samples":
        assert specs, "the core samples create claims"


@pytest.mark.parametrize("folder", sorted(SAMPLE_DIRS))
def test_webhook_match_condition_selects_exactly_the_pods_that_need_slices(folder: str) -> None:
    checked = 0
    for obj in m.render(SAMPLE_DIRS[folder]):
        for pod_spec in m.pod_specs(obj):
            needs = bool(pod_spec.get("resourceClaims")) or bool(_classic_requests(pod_spec))
            assert needs, f"{obj['metadata']['name']} asks for no slice"
            # Exactly one webhook: classic pods the fail-closed one, claim-only pods the other.
            expected = (
                "pod-gate.instaslice.dev"
                if _classic_requests(pod_spec)
                else "claim-gate.instaslice.dev"
            )
            assert _reached_webhooks(pod_spec) == [expected]
            checked += 1
    assert checked > 0


@pytest.mark.parametrize(
    "pod_spec",
    [
        {"containers": [{"name": "c", "image": "busybox"}]},
        {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        {"containers": [{"name": "c", "resources": {}}], "resourceClaims": []},
    ],
    ids=["plain", "whole-gpu", "empty-claims"],
)
def test_webhook_match_condition_skips_pods_without_slices(pod_spec: dict[str, Any]) -> None:
    assert _reached_webhooks(pod_spec) == []


@pytest.mark.parametrize(
    "pod_spec",
    [
        {
            "containers": [{"name": "c"}],
            "initContainers": [
                {"name": "i", "resources": {"limits": {"nvidia.com/mig-1g.5gb": "1"}}}
            ],
        },
        {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/mig-2g.10gb": "1"}}}]},
    ],
    ids=["init-container", "requests-only"],
)
def test_webhook_match_condition_sees_init_containers_and_requests(
    pod_spec: dict[str, Any],
) -> None:
    assert _reached_webhooks(pod_spec) == ["pod-gate.instaslice.dev"]


def test_seed_test_pod_is_the_cuda_vectoradd_pod_on_a_1g_5gb_slice() -> None:
    pod = m.one(m.render(m.SAMPLES), "Pod", "cuda-vectoradd")
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda11.7.1-ubuntu20.04"
    assert container["resources"]["limits"]["nvidia.com/mig-1g.5gb"] == 1
    assert "/cuda-samples/vectorAdd" in container["args"][0]


def test_three_slices_on_one_gpu_are_constrained_to_one_parent() -> None:
    template = m.one(m.render(m.SAMPLES), "ResourceClaimTemplate", "three-1g-5gb-one-gpu")
    devices = template["spec"]["spec"]["devices"]
    (request,) = devices["requests"]
    assert request["exactly"]["count"] == 3
    (constraint,) = devices["constraints"]
    assert constraint["matchAttribute"] == f"{names.DRIVER_NAME}/{names.ATTRIBUTE_PARENT_UUID}"


def test_quota_uses_the_dra_and_classic_keys_of_existing_classes() -> None:
    (quota,) = m.find(m.render(m.SAMPLES), "ResourceQuota")
    hard = quota["spec"]["hard"]
    suffix = ".deviceclass.resource.k8s.io/devices"
    dra_keys = {k.removesuffix(suffix) for k in hard if k.endswith(suffix)}
    classic = {k for k in hard if k.startswith("requests." + names.CLASSIC_RESOURCE_PREFIX)}
    assert dra_keys
    assert dra_keys <= _classes()
    assert classic


def test_quota_sample_counts_the_same_in_controller_and_scheduler_mode() -> None:
    """In scheduler mode a claim of a class with extendedResourceName also counts under
    requests.nvidia.com/mig-* (docs/design.md F17): the quota sample's DRA claims use classes that carry
    none there, so its classic key counts the classic replicas only, in either mode."""
    objects = m.render(m.SAMPLES)
    (quota,) = m.find(objects, "ResourceQuota")
    namespace = quota["metadata"]["namespace"]
    scheduler_classes = {
        c["metadata"]["name"]: c["spec"]
        for c in m.find(m.render(m.DEPLOY / "overlays" / "scheduler-native"), "DeviceClass")
    }
    templates = [
        t
        for t in m.find(objects, "ResourceClaimTemplate")
        if t["metadata"]["namespace"] == namespace
    ]
    assert templates
    for template in templates:
        for request in template["spec"]["spec"]["devices"]["requests"]:
            spec = scheduler_classes[request["exactly"]["deviceClassName"]]
            assert "extendedResourceName" not in spec, template["metadata"]["name"]
    (deployment,) = [
        d for d in m.find(objects, "Deployment") if d["metadata"]["namespace"] == namespace
    ]
    hard = quota["spec"]["hard"]
    assert int(hard["requests.nvidia.com/mig-1g.5gb"]) == deployment["spec"]["replicas"]
    assert (
        int(hard["mig-1g.5gb.instaslice.dev.deviceclass.resource.k8s.io/devices"])
        == deployment["spec"]["replicas"]
    )
