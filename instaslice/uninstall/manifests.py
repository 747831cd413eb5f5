"""What an uninstall deletes, and in which order: a pure reading of the rendered manifests.

The manifests are what ``make manifests`` prints for the overlay that was deployed (any overlay
works: objects another one made are deleted if they exist). The order is what keeps every pod
served until it has ended (docs/deploy.md "Uninstall"):

1. ``classes``: the DeviceClasses. Nothing can be allocated any more, by the controller or by
   kube-scheduler: pods that a workload controller recreates while the others drain wait
   instead of taking a slice.
2. (the pods holding slices end, served by the still-running kubelet plugins)
3. ``plugins``: the kubelet-plugin DaemonSet, once no pod holds a slice; its pods are waited for.
4. ``webhooks``: the webhook configurations, before the controller that serves them, so that
   no pod creation is refused meanwhile.
5. ``rest``: everything else but namespaces (controller, Services, budgets, RBAC...).
6. ``namespaces``: last, waited for (they take what is left in them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from driver.cluster.port import JsonObject, Resource, name_of, namespace_of
from driver.errors import ConfigError


def _resource(api_version: str, kind: str, plural: str, *, namespaced: bool) -> Resource:
    group, _, version = api_version.rpartition("/")
    return Resource(group=group, version=version, plural=plural, kind=kind, namespaced=namespaced)


KINDS: dict[tuple[str, str], Resource] = {
    (r.api_version, r.kind): r
    for r in (
        _resource("v1", "Namespace", "namespaces", namespaced=False),
        _resource("v1", "ServiceAccount", "serviceaccounts", namespaced=True),
        _resource("v1", "Service", "services", namespaced=True),
        _resource("v1", "ConfigMap", "configmaps", namespaced=True),
        _resource("v1", "Secret", "secrets", namespaced=True),
        _resource("apps/v1", "Deployment", "deployments", namespaced=True),
        _resource("apps/v1", "DaemonSet", "daemonsets", namespaced=True),
        _resource("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets", namespaced=True),
        _resource("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", namespaced=False),
        _resource(
            "rbac.authorization.k8s.io/v1",
            "ClusterRoleBinding",
            "clusterrolebindings",
            namespaced=False,
        ),
        _resource("rbac.authorization.k8s.io/v1", "Role", "roles", namespaced=True),
        _resource("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", namespaced=True),
        _resource(
            "admissionregistration.k8s.io/v1",
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
            namespaced=False,
        ),
        _resource(
            "admissionregistration.k8s.io/v1",
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
            namespaced=False,
        ),
        _resource("resource.k8s.io/v1", "DeviceClass", "deviceclasses", namespaced=False),
        _resource("cert-manager.io/v1", "Certificate", "certificates", namespaced=True),
        _resource("cert-manager.io/v1", "Issuer", "issuers", namespaced=True),
        _resource("monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors", namespaced=True),
        _resource("monitoring.coreos.com/v1", "PrometheusRule", "prometheusrules", namespaced=True),
    )
}
"""Every kind the overlays and components of ``deploy/`` render (a test keeps this complete)."""

_WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


@dataclass(frozen=True, slots=True)
class Target:
    """One object to delete."""

    resource: Resource
    name: str
    namespace: str | None

    def describe(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.resource.kind} {where}{self.name}"


@dataclass(frozen=True, slots=True)
class DeletionPlan:
    classes: tuple[Target, ...]
    plugins: tuple[Target, ...]
    webhooks: tuple[Target, ...]
    rest: tuple[Target, ...]
    namespaces: tuple[Target, ...]

    @property
    def steps(self) -> tuple[tuple[Target, ...], ...]:
        return (self.classes, self.plugins, self.webhooks, self.rest, self.namespaces)


def deletion_plan(objects: Iterable[JsonObject]) -> DeletionPlan:
    """The rendered objects sorted into the uninstall's steps; ``ConfigError`` for a kind this
    module does not know (deleting it blindly could remove the wrong thing, or nothing), and for
    manifests that are not an installation of InstaSlice (``check_installation``)."""
    plan = _sorted(objects)
    check_installation(plan)
    return plan


def check_installation(plan: DeletionPlan) -> None:
    """Every overlay renders the kubelet plugin's DaemonSet and our DeviceClasses; manifests
    without them — empty ones, from a render that failed, or another project's — are refused:
    the uninstall deletes every ResourceSlice of our driver, which only the removal of the
    plugins it names may justify."""
    if not any(plan.steps):
        raise ConfigError(
            "the manifests are empty (did the render fail? `make manifests OVERLAY=...` prints "
            "them); nothing was changed"
        )
    missing = [
        what
        for what, step in (
            ("the kubelet plugin's DaemonSet", plan.plugins),
            ("a DeviceClass", plan.classes),
        )
        if not step
    ]
    if missing:
        raise ConfigError(
            f"the manifests hold no {' and no '.join(missing)}: they are not an InstaSlice "
            "installation (`make manifests OVERLAY=...` prints one); nothing was changed"
        )


def _sorted(objects: Iterable[JsonObject]) -> DeletionPlan:
    groups: dict[str, list[Target]] = {
        "classes": [],
        "plugins": [],
        "webhooks": [],
        "rest": [],
        "namespaces": [],
    }
    for obj in objects:
        key = (str(obj.get("apiVersion") or ""), str(obj.get("kind") or ""))
        resource = KINDS.get(key)
        if resource is None:
            raise ConfigError(
                f"the manifests hold a {key[1]} ({key[0]}) the uninstall does not know"
            )
        target = Target(
            resource=resource,
            name=name_of(obj),
            namespace=(namespace_of(obj) or None) if resource.namespaced else None,
        )
        if resource.namespaced and target.namespace is None:
            raise ConfigError(f"{target.describe()} in the manifests names no namespace")
        groups[_step(resource)].append(target)
    return DeletionPlan(**{step: tuple(targets) for step, targets in groups.items()})


def _step(resource: Resource) -> str:
    if resource.kind == "DeviceClass":
        return "classes"
    if resource.kind == "DaemonSet":
        return "plugins"
    if resource.kind in _WEBHOOK_KINDS:
        return "webhooks"
    if resource.kind == "Namespace":
        return "namespaces"
    return "rest"
