"""The pod webhook's decision: which pods get our gate, which MIG requests are refused."""

import base64
import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.names import DELETE_PROTECTION_FINALIZER, SCHEDULING_GATE, profile_device_class
from controller.metrics import admission_decision
from controller.webhook.admission import (
    AdmissionContext,
    MalformedReviewError,
    decide,
    device_classes_of_claim_spec,
    review_pod,
)
from driver.errors import ClusterError
from localcluster.admission import match_conditions_hold
from localcluster.patch import json_patch

OUR_CLASSES = frozenset(
    {"mig.instaslice.dev", profile_device_class("1g.5gb"), profile_device_class("2g.10gb")}
)
OUR_CLASSES_LIST = sorted(OUR_CLASSES)
A100_40GB = {
    "1g.5gb": 7,
    "1g.5gb+me": 1,
    "1g.10gb": 4,
    "2g.10gb": 3,
    "3g.20gb": 2,
    "4g.20gb": 1,
    "7g.40gb": 1,
}


@dataclass
class FakeContext:
    claims: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    templates: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    capacity: dict[str, int] = field(default_factory=lambda: dict(A100_40GB))
    extra_profiles: frozenset[str] = frozenset({"1g.24gb"})  # cataloged, no GPU publishes it now
    fail_lookups: bool = False

    def claim_device_classes(self, *, namespace: str, name: str) -> Sequence[str] | None:
        if self.fail_lookups:
            raise ClusterError("informer not synced")
        return self.claims.get((namespace, name))

    def template_device_classes(self, *, namespace: str, name: str) -> Sequence[str] | None:
        if self.fail_lookups:
            raise ClusterError("informer not synced")
        return self.templates.get((namespace, name))

    def our_device_classes(self) -> frozenset[str]:
        return OUR_CLASSES

    def known_profiles(self) -> frozenset[str]:
        return frozenset(self.capacity) | self.extra_profiles

    def max_slices_per_gpu(self, profile: str) -> int:
        return self.capacity.get(profile, 0)


def default_context() -> FakeContext:
    return FakeContext(
        claims={
            ("team-a", "shared-slice"): [profile_device_class("2g.10gb")],
            ("team-a", "fallback-claim"): ["gpu.nvidia.com", "mig.instaslice.dev"],
            ("team-a", "nic-claim"): ["nic.example.com"],
        },
        templates={
            ("team-a", "one-1g"): [profile_device_class("1g.5gb")],
            ("team-a", "nvidia-gpu"): ["gpu.nvidia.com"],
        },
    )


def pod(
    *,
    limits: dict[str, Any] | None = None,
    requests: dict[str, Any] | None = None,
    init_limits: dict[str, Any] | None = None,
    claims: list[dict[str, str]] | None = None,
    gates: list[str] | None = None,
    node_name: str | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "cuda", "resources": resources}]
    }
    if init_limits is not None:
        spec["initContainers"] = [
            {"name": "warmup", "image": "cuda", "resources": {"limits": init_limits}}
        ]
    if claims is not None:
        spec["resourceClaims"] = claims
    if gates is not None:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    if node_name is not None:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a"},
        "spec": spec,
    }


def review(
    obj: dict[str, Any], *, namespace: str = "team-a", operation: str = "CREATE"
) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": operation,
            "object": obj,
        },
    }


MIG_1G = "nvidia.com/mig-1g.5gb"

GATE_CASES = [
    ("classic-limit", pod(limits={MIG_1G: "1"}), None),
    ("classic-limit-int", pod(limits={MIG_1G: 2}), None),
    (
        "classic-requests-equal-limits",
        pod(limits={MIG_1G: "3"}, requests={MIG_1G: "3", "cpu": "1"}),
        None,
    ),
    ("classic-init-container", pod(init_limits={"nvidia.com/mig-2g.10gb": "1"}), None),
    ("classic-me-profile", pod(limits={"nvidia.com/mig-1g.5gb-me": "1"}), None),
    ("classic-full-gpu-count", pod(limits={MIG_1G: "7"}), None),
    ("classic-known-profile-no-gpu-now", pod(limits={"nvidia.com/mig-1g.24gb": "9"}), None),
    (
        "kueue-gate-kept",
        pod(limits={MIG_1G: "1"}, gates=["kueue.x-k8s.io/admission"]),
        "kueue.x-k8s.io/admission",
    ),
    (
        "template-of-our-class",
        pod(claims=[{"name": "mig", "resourceClaimTemplateName": "one-1g"}]),
        None,
    ),
    (
        "claim-of-our-class",
        pod(claims=[{"name": "mig", "resourceClaimName": "shared-slice"}]),
        None,
    ),
    (
        "claim-first-available",
        pod(claims=[{"name": "mig", "resourceClaimName": "fallback-claim"}]),
        None,
    ),
    (
        "second-claim-ours",
        pod(
            claims=[
                {"name": "nic", "resourceClaimName": "nic-claim"},
                {"name": "mig", "resourceClaimTemplateName": "one-1g"},
            ]
        ),
        None,
    ),
    (
        "template-not-yet-created",
        pod(claims=[{"name": "mig", "resourceClaimTemplateName": "later"}]),
        None,
    ),
]


def apply_patch(obj: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """The two JSONPatch forms the webhook emits, applied like kube-apiserver would."""
    result = copy.deepcopy(obj)
    for op in patch:
        assert op["op"] == "add"
        if op["path"] == "/spec/schedulingGates":
            assert "schedulingGates" not in result["spec"]
            result["spec"]["schedulingGates"] = op["value"]
        else:
            assert op["path"] == "/spec/schedulingGates/-"
            result["spec"]["schedulingGates"].append(op["value"])
    return result


@pytest.mark.parametrize(
    ("obj", "foreign_gate"), [c[1:] for c in GATE_CASES], ids=[c[0] for c in GATE_CASES]
)
def test_pods_needing_our_slices_get_the_gate(
    obj: dict[str, Any], foreign_gate: str | None
) -> None:
    answer = review_pod(review(obj), default_context())
    response = answer["response"]
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    patched = apply_patch(obj, json.loads(base64.b64decode(response["patch"])))
    expected = ([foreign_gate] if foreign_gate else []) + [SCHEDULING_GATE]
    assert [g["name"] for g in patched["spec"]["schedulingGates"]] == expected


def test_unresolved_claim_reference_is_gated_with_a_warning() -> None:
    obj = pod(claims=[{"name": "mig", "resourceClaimTemplateName": "later"}])
    response = review_pod(review(obj), default_context())["response"]
    assert response["allowed"] is True
    assert "ResourceClaimTemplate team-a/later does not exist yet" in response["warnings"][0]


def test_lookup_failures_gate_rather_than_guess() -> None:
    obj = pod(claims=[{"name": "mig", "resourceClaimName": "shared-slice"}])
    decision = decide(review(obj)["request"], FakeContext(fail_lookups=True))
    assert decision.allowed
    assert decision.patch is not None
    assert decision.warnings


NO_OP_CASES = [
    ("plain-pod", pod(limits={"cpu": "1", "memory": "1Gi"}), "team-a", "CREATE"),
    ("no-resources", pod(), "team-a", "CREATE"),
    ("zero-count", pod(limits={MIG_1G: "0"}), "team-a", "CREATE"),
    ("other-extended-resource", pod(limits={"nvidia.com/gpu": "1"}), "team-a", "CREATE"),
    ("already-gated", pod(limits={MIG_1G: "1"}, gates=[SCHEDULING_GATE]), "team-a", "CREATE"),
    ("kube-system", pod(limits={MIG_1G: "1"}), "kube-system", "CREATE"),
    ("kube-public", pod(limits={MIG_1G: "1"}), "kube-public", "CREATE"),
    ("kube-node-lease", pod(limits={MIG_1G: "1"}), "kube-node-lease", "CREATE"),
    ("own-namespace", pod(limits={"nvidia.com/mig-9g.99gb": "1"}), "instaslice-system", "CREATE"),
    ("update", pod(limits={MIG_1G: "1"}), "team-a", "UPDATE"),
    ("node-name-set", pod(limits={MIG_1G: "1"}, node_name="node-1"), "team-a", "CREATE"),
    (
        "template-of-other-driver",
        pod(claims=[{"name": "gpu", "resourceClaimTemplateName": "nvidia-gpu"}]),
        "team-a",
        "CREATE",
    ),
    (
        "claim-of-other-driver",
        pod(claims=[{"name": "nic", "resourceClaimName": "nic-claim"}]),
        "team-a",
        "CREATE",
    ),
    ("claim-reference-without-name", pod(claims=[{"name": "odd"}]), "team-a", "CREATE"),
]


@pytest.mark.parametrize(
    ("obj", "namespace", "operation"), [c[1:] for c in NO_OP_CASES], ids=[c[0] for c in NO_OP_CASES]
)
def test_other_pods_are_allowed_unchanged(
    obj: dict[str, Any], namespace: str, operation: str
) -> None:
    response = review_pod(review(obj, namespace=namespace, operation=operation), default_context())[
        "response"
    ]
    assert response == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


DENY_CASES = [
    (
        "unknown-profile",
        pod(limits={"nvidia.com/mig-9g.99gb": "1"}),
        "nvidia.com/mig-9g.99gb is an unknown MIG profile",
    ),
    (
        "unknown-profile-init",
        pod(init_limits={"nvidia.com/mig-9g.99gb": "1"}),
        "container 'warmup'",
    ),
    (
        "impossible-count",
        pod(limits={MIG_1G: "8"}),
        "nvidia.com/mig-1g.5gb: 8 slices can never fit",
    ),
    (
        "impossible-me-count",
        pod(limits={"nvidia.com/mig-1g.5gb-me": "2"}),
        "holds 1 of profile 1g.5gb+me",
    ),
    ("fractional", pod(limits={MIG_1G: "500m"}), "must be a non-negative whole number"),
    ("negative", pod(limits={MIG_1G: "-1"}), "must be a non-negative whole number"),
    ("garbage", pod(limits={MIG_1G: "one"}), "must be a non-negative whole number"),
    (
        "requests-differ",
        pod(limits={MIG_1G: "2"}, requests={MIG_1G: "1"}),
        "requests ('1') must equal limits ('2')",
    ),
    ("requests-without-limits", pod(requests={MIG_1G: "1"}), "requested without a limit"),
    (
        "mixed-valid-and-invalid",
        pod(limits={MIG_1G: "1", "nvidia.com/mig-9g.99gb": "1"}),
        "nvidia.com/mig-9g.99gb is an unknown MIG profile",
    ),
]


@pytest.mark.parametrize(
    ("obj", "fragment"), [c[1:] for c in DENY_CASES], ids=[c[0] for c in DENY_CASES]
)
def test_impossible_mig_requests_are_refused_with_a_reason(
    obj: dict[str, Any], fragment: str
) -> None:
    response = review_pod(review(obj), default_context())["response"]
    assert response["allowed"] is False
    assert "patch" not in response
    assert response["status"]["code"] == 403
    assert fragment in response["status"]["message"]


def test_unknown_profile_message_lists_the_known_ones() -> None:
    decision = decide(
        review(pod(limits={"nvidia.com/mig-9g.99gb": "1"}))["request"], default_context()
    )
    assert "nvidia.com/mig-1g.5gb-me" in decision.message
    assert "nvidia.com/mig-7g.40gb" in decision.message


@pytest.mark.parametrize(
    "body",
    [{}, {"request": None}, {"request": {"object": {}}}, {"request": {"uid": 7}}, []],
    ids=["empty", "null-request", "no-uid", "uid-not-string", "not-a-map"],
)
def test_malformed_reviews_raise(body: Any) -> None:
    with pytest.raises(MalformedReviewError):
        review_pod(body, default_context())


def test_odd_pod_shapes_do_not_crash() -> None:
    odd = pod(limits={MIG_1G: "1"})
    odd["spec"]["containers"].append("not-a-container")
    odd["spec"]["initContainers"] = {"not": "a list"}
    odd["spec"]["resourceClaims"] = "nope"
    assert decide(review(odd)["request"], default_context()).patch is not None
    assert decide(review({"spec": None})["request"], default_context()).allowed


def test_mistyped_fields_read_as_absent() -> None:
    """Admission sees the pod before validation: mistyped fields read as their zero value."""
    odd = pod(limits={MIG_1G: "1"})
    odd["spec"]["schedulingGates"] = {"name": SCHEDULING_GATE}  # not a list: not gated by us
    odd["spec"]["initContainers"] = [
        {"name": "a", "resources": "none"},
        {"resources": {"limits": []}},
    ]
    odd["spec"]["resourceClaims"] = [{"name": "x", "resourceClaimName": {"not": "a name"}}]
    decision = decide(review(odd)["request"], default_context())
    assert decision.allowed
    assert decision.patch == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": SCHEDULING_GATE}]}
    ]
    assert not decision.warnings


def test_device_classes_of_claim_spec_reads_every_shape() -> None:
    spec = {
        "devices": {
            "requests": [
                {"name": "a", "exactly": {"deviceClassName": "mig.instaslice.dev", "count": 2}},
                {
                    "name": "b",
                    "firstAvailable": [
                        {"name": "x", "deviceClassName": "gpu.nvidia.com"},
                        {"name": "y", "deviceClassName": "c2"},
                    ],
                },
                {"name": "beta", "deviceClassName": "old-style"},
                "garbage",
            ]
        }
    }
    assert device_classes_of_claim_spec(spec) == [
        "mig.instaslice.dev",
        "gpu.nvidia.com",
        "c2",
        "old-style",
    ]
    assert device_classes_of_claim_spec({}) == []


def _webhooks() -> list[dict[str, Any]]:
    path = Path(__file__).resolve().parents[2] / "deploy" / "base" / "webhook.yaml"
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc.get("kind") == "MutatingWebhookConfiguration":
            return list(doc["webhooks"])
    raise AssertionError("no MutatingWebhookConfiguration in deploy/base/webhook.yaml")


def _reached(obj: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, failurePolicy) of every deployed webhook whose rules take ``obj``'s kind and whose
    matchConditions send us ``obj`` (kube-apiserver evaluates conditions only for matching rules)."""
    resource = {"Pod": "pods", "ResourceClaim": "resourceclaims"}[obj.get("kind", "Pod")]
    return [
        (str(w["name"]), str(w["failurePolicy"]))
        for w in _webhooks()
        if any(resource in rule["resources"] for rule in w["rules"])
        and match_conditions_hold(w, obj, None)
    ]


def test_deployed_match_conditions_send_every_pod_the_webhook_acts_on_to_exactly_one_entry() -> (
    None
):
    """``matchConditions`` decide which pods reach us at all: each pod we would gate or refuse must
    match, or a real cluster would silently skip it. Classic pods reach the fail-closed entry; pods
    whose only MIG requests are claims reach the fail-open one (an outage must not block the pods
    of every DRA driver), never both."""
    acted_on = [c[1] for c in GATE_CASES] + [c[1] for c in DENY_CASES]
    for obj in acted_on:
        reached = _reached(obj)
        assert len(reached) == 1, (obj, reached)
        classic = any(
            str(r).startswith("nvidia.com/mig-")
            for c in [*obj["spec"].get("initContainers", []), *obj["spec"]["containers"]]
            for amounts in (c.get("resources") or {}).values()
            if isinstance(amounts, dict)
            for r in amounts
        )
        expected = (
            ("pod-gate.instaslice.dev", "Fail")
            if classic
            else ("claim-gate.instaslice.dev", "Ignore")
        )
        assert reached == [expected], obj
    assert _reached(pod(limits={"cpu": "1"})) == []


def test_context_protocol_is_satisfied_by_the_fake() -> None:
    context: AdmissionContext = default_context()
    assert context.max_slices_per_gpu("1g.5gb") == 7


def test_a_claim_naming_a_class_of_our_domain_that_does_not_exist_is_gated() -> None:
    """Found on the real stack: the controller counts such a class as ours (the pod waits for it,
    DeviceClassNotFound), so the webhook must gate the pod too — else kube-scheduler takes it."""
    context = default_context()
    context.claims[("team-a", "future")] = ["mig-9g.99gb.instaslice.dev"]
    obj = pod(claims=[{"name": "mig", "resourceClaimName": "future"}])
    response = review_pod(review(obj), context)["response"]
    patched = apply_patch(obj, json.loads(base64.b64decode(response["patch"])))
    assert [g["name"] for g in patched["spec"]["schedulingGates"]] == [SCHEDULING_GATE]


# --- ResourceClaim CREATE: the delete-protection finalizer (webhook 3) ---


def claim(
    *requests: dict[str, Any], finalizers: list[str] | None = None, namespace: str = "team-a"
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "c", "namespace": namespace}
    if finalizers is not None:
        metadata["finalizers"] = finalizers
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": {"devices": {"requests": list(requests)}},
    }


def claim_review(
    obj: dict[str, Any], *, namespace: str = "team-a", operation: str = "CREATE"
) -> dict[str, Any]:
    answer = review(obj, namespace=namespace, operation=operation)
    answer["request"]["kind"] = {
        "group": "resource.k8s.io",
        "version": "v1",
        "kind": "ResourceClaim",
    }
    answer["request"]["resource"] = {
        "group": "resource.k8s.io",
        "version": "v1",
        "resource": "resourceclaims",
    }
    return answer


def exactly(device_class: str) -> dict[str, Any]:
    return {"name": "gpu", "exactly": {"deviceClassName": device_class}}


def first_available(*device_classes: str) -> dict[str, Any]:
    return {
        "name": "gpu",
        "firstAvailable": [
            {"name": f"s{i}", "deviceClassName": c} for i, c in enumerate(device_classes)
        ],
    }


PROTECTED_CASES = [
    ("exactly-ours", claim(exactly(profile_device_class("1g.5gb"))), []),
    ("any-profile-class", claim(exactly("mig.instaslice.dev")), []),
    ("ours-as-an-alternative", claim(first_available("gpu.nvidia.com", "mig.instaslice.dev")), []),
    ("second-request-ours", claim(exactly("nic.example.com"), exactly(OUR_CLASSES_LIST[0])), []),
    # a class of our domain that does not exist yet is ours (as for pods)
    ("unknown-class-of-our-domain", claim(exactly("mig-9g.99gb.instaslice.dev")), []),
    (
        "other-finalizers-kept",
        claim(exactly(profile_device_class("2g.10gb")), finalizers=["example.com/keep"]),
        ["example.com/keep"],
    ),
]


@pytest.mark.parametrize(
    ("obj", "kept"), [c[1:] for c in PROTECTED_CASES], ids=[c[0] for c in PROTECTED_CASES]
)
def test_new_claims_of_our_classes_get_the_delete_protection_finalizer(
    obj: dict[str, Any], kept: list[str]
) -> None:
    response = review_pod(claim_review(obj), default_context())["response"]
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    # RFC 6902 as kube-apiserver applies it
    patched = json_patch(obj, json.loads(base64.b64decode(response["patch"])))
    assert patched["metadata"]["finalizers"] == [*kept, DELETE_PROTECTION_FINALIZER]
    assert patched["spec"] == obj["spec"]
    assert admission_decision(review_pod(claim_review(obj), default_context())) == "protected"


UNCHANGED_CLAIM_CASES = [
    ("another-driver", claim(exactly("gpu.nvidia.com")), "team-a", "CREATE"),
    ("no-requests", claim(), "team-a", "CREATE"),
    (
        "protected-already",
        claim(exactly(OUR_CLASSES_LIST[0]), finalizers=[DELETE_PROTECTION_FINALIZER]),
        "team-a",
        "CREATE",
    ),
    (
        "system-namespace",
        claim(exactly(OUR_CLASSES_LIST[0]), namespace="kube-system"),
        "kube-system",
        "CREATE",
    ),
    ("update", claim(exactly(OUR_CLASSES_LIST[0])), "team-a", "UPDATE"),
    ("spec-not-an-object", {**claim(), "spec": "nonsense"}, "team-a", "CREATE"),
]


@pytest.mark.parametrize(
    ("obj", "namespace", "operation"),
    [c[1:] for c in UNCHANGED_CLAIM_CASES],
    ids=[c[0] for c in UNCHANGED_CLAIM_CASES],
)
def test_other_claims_are_admitted_unchanged(
    obj: dict[str, Any], namespace: str, operation: str
) -> None:
    answer = review_pod(
        claim_review(obj, namespace=namespace, operation=operation), default_context()
    )
    assert answer["response"] == {"uid": answer["response"]["uid"], "allowed": True}
    assert admission_decision(answer) == "allowed"


def test_deployed_match_conditions_send_new_claims_of_our_domain_to_the_claim_entry_only() -> None:
    """The claim entry's conditions must let through every claim the webhook would protect (by
    name: a class of our domain) and nothing it leaves alone; pods never reach it, claims never
    reach the pod entries."""
    for _, obj, _ in PROTECTED_CASES:
        assert _reached(obj) == [("claim-finalizer.instaslice.dev", "Ignore")], obj
    for _, obj, _, _ in UNCHANGED_CLAIM_CASES[:3]:
        assert _reached(obj) == [], obj
    for obj in [c[1] for c in GATE_CASES]:
        assert ("claim-finalizer.instaslice.dev", "Ignore") not in _reached(obj)
