"""The RBAC evaluator (``tests/deploy/rbac.py``) on small hand-made role sets and on the shipped roles."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.rbac import Authorizer, Grant, Request, shipped

SYSTEM_NAMESPACE = "instaslice-system"
RESOURCE = "resource.k8s.io"

# --- the evaluator on hand-made roles ---------------------------------------------------------


def _rule(groups: list[str], resources: list[str], verbs: list[str], **extra: Any) -> Any:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs, **extra}


def _role(kind: str, name: str, rules: list[Any], namespace: str | None = None) -> Any:
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {"kind": kind, "metadata": metadata, "rules": rules}


def _binding(
    kind: str, role_kind: str, role: str, subject: Any, namespace: str | None = None
) -> Any:
    metadata: dict[str, Any] = {"name": f"{role}-binding"}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "kind": kind,
        "metadata": metadata,
        "roleRef": {"kind": role_kind, "name": role},
        "subjects": [subject],
    }


SA = {"kind": "ServiceAccount", "name": "sa", "namespace": "sys"}

HAND_MADE = [
    _role(
        "ClusterRole",
        "cluster",
        [
            _rule([""], ["pods"], ["get", "list"]),
            _rule([""], ["*/status"], ["patch"]),
            _rule(["apps"], ["*"], ["watch"]),
            _rule(["x.io"], ["widgets"], ["get", "update"], resourceNames=["only-me"]),
            _rule([RESOURCE], ["resourceclaims/status"], ["update"]),
            _rule([RESOURCE], ["resourceclaims/binding"], ["update"]),
            _rule([RESOURCE], ["resourceslices/status"], ["update"]),
        ],
    ),
    _binding("ClusterRoleBinding", "ClusterRole", "cluster", SA),
    _role("ClusterRole", "secrets-reader", [_rule([""], ["secrets"], ["get"])]),
    # A ClusterRole bound by a RoleBinding grants only inside the binding's namespace.
    _binding("RoleBinding", "ClusterRole", "secrets-reader", SA, namespace="sys"),
    _role("Role", "leases", [_rule(["coordination.k8s.io"], ["leases"], ["*"])], namespace="sys"),
    _binding("RoleBinding", "Role", "leases", SA, namespace="sys"),
    _role("ClusterRole", "everyone", [_rule([""], ["configmaps"], ["list"])]),
    _binding(
        "ClusterRoleBinding",
        "ClusterRole",
        "everyone",
        {"kind": "Group", "name": "system:serviceaccounts:sys"},
    ),
    _role("ClusterRole", "other", [_rule(["*"], ["*"], ["*"])]),
    _binding(
        "ClusterRoleBinding",
        "ClusterRole",
        "other",
        {"kind": "ServiceAccount", "name": "sa", "namespace": "elsewhere"},
    ),
]

DECISIONS = [
    ("get pod", Request("get", "", "pods", "", "ns", "p"), True),
    ("list pods of all namespaces", Request("list", "", "pods"), True),
    ("delete pod", Request("delete", "", "pods", "", "ns", "p"), False),
    ("patch pod status via */status", Request("patch", "", "pods", "status", "ns", "p"), True),
    ("patch pod itself", Request("patch", "", "pods", "", "ns", "p"), False),
    ("update pod status: verb", Request("update", "", "pods", "status", "ns", "p"), False),
    ("watch any apps resource", Request("watch", "apps", "deployments", "", "ns"), True),
    ("* covers subresources too", Request("watch", "apps", "deployments", "scale", "ns"), True),
    ("named widget", Request("get", "x.io", "widgets", "", "", "only-me"), True),
    ("other widget", Request("get", "x.io", "widgets", "", "", "another"), False),
    ("resourceNames never allow unnamed", Request("get", "x.io", "widgets"), False),
    ("group must match", Request("get", "y.io", "widgets", "", "", "only-me"), False),
    ("secret in the binding namespace", Request("get", "", "secrets", "", "sys", "s"), True),
    ("secret elsewhere", Request("get", "", "secrets", "", "default", "s"), False),
    ("lease in the role namespace, any verb", Request("delete", "coordination.k8s.io", "leases", "", "sys", "l"), True),
    ("lease elsewhere", Request("get", "coordination.k8s.io", "leases", "", "default", "l"), False),
    ("group subject", Request("list", "", "configmaps", "", "ns"), True),
    ("same name, other namespace: not us", Request("get", "", "nodes", "", "", "n"), False),
    ("claim status needs binding too: granted", Request("update", RESOURCE, "resourceclaims", "status", "ns", "c"), True),
    ("claim status patch: neither granted", Request("patch", RESOURCE, "resourceclaims", "status", "ns", "c"), False),
    ("slice status: no synthetic check", Request("update", RESOURCE, "resourceslices", "status", "", "s"), True),
]  # fmt: skip


@pytest.fixture(scope="module")
def hand_made() -> Authorizer:
    return Authorizer.for_service_account(HAND_MADE, name="sa", namespace="sys")


@pytest.mark.parametrize(
    ("request_", "allowed"), [d[1:] for d in DECISIONS], ids=[d[0] for d in DECISIONS]
)
def test_evaluator_decides_as_rbac_does(
    hand_made: Authorizer, request_: Request, allowed: bool
) -> None:
    assert hand_made.allows(request_) is allowed


def test_a_claim_status_write_without_the_binding_grant_names_the_missing_check() -> None:
    objects = [
        _role("ClusterRole", "r", [_rule([RESOURCE], ["resourceclaims/status"], ["update"])]),
        _binding("ClusterRoleBinding", "ClusterRole", "r", SA),
    ]
    authorizer = Authorizer.for_service_account(objects, name="sa", namespace="sys")
    write = Request("update", RESOURCE, "resourceclaims", "status", "ns", "c")
    assert authorizer.denied(write) == [
        Request("update", RESOURCE, "resourceclaims", "binding", "ns", "c")
    ]
    read = Request("get", RESOURCE, "resourceclaims", "status", "ns", "c")
    assert authorizer.checks(read) == [read]


def test_used_by_names_every_grant_behind_an_allowed_request(hand_made: Authorizer) -> None:
    write = Request("update", RESOURCE, "resourceclaims", "status", "ns", "c")
    assert hand_made.used_by(write) == {
        Grant(None, RESOURCE, "resourceclaims/status", "update", None),
        Grant(None, RESOURCE, "resourceclaims/binding", "update", None),
    }
    assert hand_made.used_by(Request("delete", "", "pods", "", "ns", "p")) == set()


def test_non_resource_urls_are_the_public_discovery_ones(hand_made: Authorizer) -> None:
    assert hand_made.allows_non_resource("get", "/apis/resource.k8s.io/v1")
    assert hand_made.allows_non_resource("get", "/healthz")
    assert not hand_made.allows_non_resource("get", "/metrics")


def test_a_binding_to_a_missing_role_is_an_error() -> None:
    objects = [_binding("ClusterRoleBinding", "ClusterRole", "absent", SA)]
    with pytest.raises(ValueError, match="absent"):
        Authorizer.for_service_account(objects, name="sa", namespace="sys")


# --- the evaluator on the shipped roles -------------------------------------------------------


SHIPPED = [
    ("instaslice-kubelet-plugin", Request("create", RESOURCE, "resourceslices"), True),
    ("instaslice-kubelet-plugin", Request("create", "", "pods", "", "ns"), False),
    ("instaslice-controller", Request("watch", RESOURCE, "resourceclaims"), True),
    (
        "instaslice-controller",
        Request("get", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", name="instaslice-pod-gate"),
        True,
    ),
    (
        "instaslice-controller",
        Request("get", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", name="someone-elses"),
        False,
    ),
    ("instaslice-controller", Request("get", "coordination.k8s.io", "leases", "", SYSTEM_NAMESPACE, "l"), True),
    ("instaslice-controller", Request("get", "coordination.k8s.io", "leases", "", "default", "l"), False),
    ("instaslice-controller", Request("get", "", "secrets", "", "default", "s"), False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("service_account", "request_", "allowed"),
    SHIPPED,
    ids=[f"{sa}: {r}" for sa, r, _ in SHIPPED],
)
def test_shipped_roles_decide(service_account: str, request_: Request, allowed: bool) -> None:
    assert shipped(service_account).allows(request_) is allowed
