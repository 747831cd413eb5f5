"""Least-privilege RBAC: each component's roles grant exactly the listed verbs, nothing wider.

The expected grants are the precise lists in the comments of deploy/base/rbac-*.yaml.
``test_rbac_audit.py`` checks those lists against the requests the real daemons make.
"""

from __future__ import annotations

import pytest

from tests.deploy import manifests as m

Grant = tuple[str, str, str, str | None]  # (apiGroup, resource, verb, resourceName or None)

SYSTEM_NAMESPACE = "instaslice-system"

PLUGIN_CLUSTER_GRANTS: set[Grant] = {
    *(("resource.k8s.io", "resourceclaims", v, None) for v in ("get", "list", "update")),
    ("resource.k8s.io", "resourceclaims/status", "update", None),
    ("resource.k8s.io", "resourceclaims/binding", "update", None),
    ("resource.k8s.io", "resourceclaims/driver", "associated-node:update", "mig.instaslice.dev"),
    *(
        ("resource.k8s.io", "resourceslices", v, None)
        for v in ("list", "watch", "create", "update", "delete")
    ),
    *(("", "nodes", v, None) for v in ("get", "list", "watch")),
    ("", "nodes/status", "patch", None),
    ("", "pods", "get", None),
    ("", "events", "create", None),
    ("", "events", "patch", None),
}

CONTROLLER_CLUSTER_GRANTS: set[Grant] = {
    *(("", "pods", v, None) for v in ("get", "list", "watch", "patch")),
    ("", "pods/status", "update", None),
    ("", "pods/status", "patch", None),
    *(
        ("resource.k8s.io", "resourceclaims", v, None)
        for v in ("get", "list", "watch", "create", "update")
    ),
    ("resource.k8s.io", "resourceclaims/status", "update", None),
    ("resource.k8s.io", "resourceclaims/binding", "update", None),
    *(
        ("resource.k8s.io", r, v, None)
        for r in ("resourceclaimtemplates", "resourceslices", "deviceclasses")
        for v in ("list", "watch")
    ),
    *(("", "nodes", v, None) for v in ("list", "watch")),
    ("", "pods/eviction", "create", None),
    *(("policy", "poddisruptionbudgets", v, None) for v in ("list", "watch")),
    ("", "events", "create", None),
    ("", "events", "patch", None),
    *(
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", v, "instaslice-pod-gate")
        for v in ("get", "update")
    ),
}

CONTROLLER_NAMESPACE_GRANTS: set[Grant] = {
    *(
        ("coordination.k8s.io", "leases", v, None)
        for v in ("get", "list", "watch", "create", "update")
    ),
    *(("", "secrets", v, None) for v in ("get", "create", "update")),
}

PLUGIN_NAMESPACE_GRANTS: set[Grant] = {
    *(("coordination.k8s.io", "leases", v, None) for v in ("get", "create", "update")),
}


def _grants(role: m.Manifest) -> set[Grant]:
    grants: set[Grant] = set()
    for rule in role["rules"]:
        names: list[str | None] = list(rule.get("resourceNames") or [None])
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in names:
                        grants.add((group, resource, verb, name))
    return grants


def _objects() -> list[m.Manifest]:
    return m.render(m.DEPLOY / "base")


def _bound_roles(objects: list[m.Manifest], service_account: str) -> list[tuple[str, str | None]]:
    """(role kind/name, binding namespace) of every binding naming the service account."""
    bound = []
    for binding in m.find(objects, "ClusterRoleBinding") + m.find(objects, "RoleBinding"):
        for subject in binding["subjects"]:
            if (subject["kind"], subject["name"], subject.get("namespace")) == (
                "ServiceAccount",
                service_account,
                SYSTEM_NAMESPACE,
            ):
                ref = binding["roleRef"]
                bound.append((f"{ref['kind']}/{ref['name']}", binding["metadata"].get("namespace")))
    return sorted(bound, key=str)


def test_kubelet_plugin_grants_are_exactly_claims_slices_nodes_pods_and_events() -> None:
    objects = _objects()
    role = m.one(objects, "ClusterRole", "instaslice-kubelet-plugin")
    assert _grants(role) == PLUGIN_CLUSTER_GRANTS
    assert {resource for _, resource, _, _ in _grants(role)} <= {
        "resourceclaims",
        "resourceclaims/status",
        "resourceclaims/binding",
        "resourceclaims/driver",
        "resourceslices",
        "nodes",
        "nodes/status",
        "pods",
        "events",
    }
    # It reads pods and nodes, never writes them (only patches its Node's status, shim off); it
    # never creates or deletes claims.
    assert {v for _, r, v, _ in _grants(role) if r == "pods"} == {"get"}
    assert {v for _, r, v, _ in _grants(role) if r == "nodes"} == {"get", "list", "watch"}
    assert {v for _, r, v, _ in _grants(role) if r == "nodes/status"} == {"patch"}
    assert {v for _, r, v, _ in _grants(role) if r == "resourceclaims"} == {"get", "list", "update"}
    namespaced = m.one(objects, "Role", "instaslice-kubelet-plugin")
    assert namespaced["metadata"]["namespace"] == SYSTEM_NAMESPACE
    assert _grants(namespaced) == PLUGIN_NAMESPACE_GRANTS, "only its shim's lease"
    assert _bound_roles(objects, "instaslice-kubelet-plugin") == [
        ("ClusterRole/instaslice-kubelet-plugin", None),
        ("Role/instaslice-kubelet-plugin", SYSTEM_NAMESPACE),
    ]


def test_controller_grants_are_exactly_what_allocation_and_gating_need() -> None:
    objects = _objects()
    cluster_role = m.one(objects, "ClusterRole", "instaslice-controller")
    assert _grants(cluster_role) == CONTROLLER_CLUSTER_GRANTS
    role = m.one(objects, "Role", "instaslice-controller")
    assert role["metadata"]["namespace"] == SYSTEM_NAMESPACE
    assert _grants(role) == CONTROLLER_NAMESPACE_GRANTS
    assert _bound_roles(objects, "instaslice-controller") == [
        ("ClusterRole/instaslice-controller", None),
        ("Role/instaslice-controller", SYSTEM_NAMESPACE),
    ]


def test_the_webhook_configuration_the_controller_may_patch_is_the_one_we_ship() -> None:
    objects = _objects()
    (config,) = m.find(objects, "MutatingWebhookConfiguration")
    granted = {
        name
        for _, resource, _, name in CONTROLLER_CLUSTER_GRANTS
        if resource == "mutatingwebhookconfigurations"
    }
    assert granted == {config["metadata"]["name"]}


@pytest.mark.parametrize("kind", ["ClusterRole", "Role"])
def test_no_wildcards_and_no_escalation_verbs(kind: str) -> None:
    for role in m.find(_objects(), kind):
        for group, resource, verb, _ in _grants(role):
            assert "*" not in (group, resource, verb), role["metadata"]["name"]
            assert verb not in {"escalate", "bind", "impersonate", "deletecollection"}


def test_each_pod_runs_as_its_own_service_account() -> None:
    objects = _objects()
    deployment = m.one(objects, "Deployment", "instaslice-controller")
    daemonset = m.one(objects, "DaemonSet", "instaslice-kubelet-plugin")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "instaslice-controller"
    assert (
        daemonset["spec"]["template"]["spec"]["serviceAccountName"] == "instaslice-kubelet-plugin"
    )
    accounts = {sa["metadata"]["name"] for sa in m.find(objects, "ServiceAccount")}
    assert accounts == {"instaslice-controller", "instaslice-kubelet-plugin"}
