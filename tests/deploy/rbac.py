"""A pure RBAC authorizer over rendered manifests: would this ServiceAccount be allowed this request?

It follows kube-apiserver's RBAC authorizer (``plugin/pkg/auth/authorizer/rbac``): a
ClusterRoleBinding grants its ClusterRole's rules everywhere; a RoleBinding grants the rules of
its Role — or of a ClusterRole — only inside the binding's namespace; a rule matches when its
``verbs``, ``apiGroups`` and ``resources`` cover the request (``*`` for any; ``*/status`` for a
subresource of any resource) and, if it names ``resourceNames``, the request names one of them
(so a rule restricted by name never allows ``create``, ``list`` or ``watch`` without a name).
Subjects match the ServiceAccount itself, its ``system:serviceaccount:<ns>:<name>`` user name, or
the groups every ServiceAccount is in.

Besides the plain check, Kubernetes >= 1.36 (``DRAResourceClaimGranularStatusAuthorization``, beta,
on by default) authorizes a write of a ResourceClaim's ``status.allocation`` or
``status.reservedFor`` a second time, against the synthetic subresource ``resourceclaims/binding``
(same verb). Our components' status writes change one of those two fields (allocate,
deallocate, move a reservation), so :meth:`Authorizer.checks` asks for both — except the kubelet
plugin's write of ``status.devices`` (MIG UUIDs), which kube checks against ``resourceclaims/driver``
(``associated-node:update``) instead; the audit cannot tell the two apart, so that grant is explained
in ``test_rbac_audit`` rather than checked here.

Non-resource URLs (discovery, ``/healthz``, ``/version``) are allowed to every authenticated user by
the default ``system:discovery`` / ``system:public-info-viewer`` bindings.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Manifest = dict[str, Any]

SHIPPED_NAMESPACE = "instaslice-system"
SERVICE_ACCOUNT_GROUPS = ("system:serviceaccounts", "system:authenticated")
PUBLIC_NON_RESOURCE_URLS = (
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/healthz",
    "/livez",
    "/readyz",
    "/version",
    "/version/",
    "/openapi",
    "/openapi/*",
)
# (group, resource, subresource) whose writes also need another (resource path) with the same verb.
SYNTHETIC_CHECKS: Mapping[tuple[str, str, str], str] = {
    ("resource.k8s.io", "resourceclaims", "status"): "resourceclaims/binding",
}
_WRITE_VERBS = frozenset({"update", "patch"})


@dataclass(frozen=True, slots=True, order=True)
class Request:
    """A resource request as RBAC sees it; ``namespace`` is empty for cluster-scoped objects and
    for requests across all namespaces; ``name`` is empty for create, list and watch of all."""

    verb: str
    api_group: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def resource_path(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    def __str__(self) -> str:
        where = "/".join(p for p in (self.namespace, self.name) if p) or "(all)"
        return f"{self.verb} {self.api_group or 'core'}/{self.resource_path} {where}"


@dataclass(frozen=True, slots=True, order=True)
class Grant:
    """One cell of a rule, expanded: where it applies (``namespace`` None = cluster-wide), the
    group, resource path (``pods/status``), verb, and resource name (None = any)."""

    namespace: str | None
    api_group: str
    resource: str
    verb: str
    name: str | None

    def covers(self, request: Request) -> bool:
        return (
            (self.namespace is None or self.namespace == request.namespace)
            and self.api_group in ("*", request.api_group)
            and _resource_matches(self.resource, request)
            and self.verb in ("*", request.verb)
            and (self.name is None or self.name == request.name)
        )

    def __str__(self) -> str:
        scope = f"in {self.namespace}" if self.namespace is not None else "cluster-wide"
        named = f" named {self.name}" if self.name is not None else ""
        return f"{self.verb} {self.api_group or 'core'}/{self.resource}{named} ({scope})"


def _resource_matches(rule_resource: str, request: Request) -> bool:
    if rule_resource in ("*", request.resource_path):
        return True
    return bool(request.subresource) and rule_resource == f"*/{request.subresource}"


@dataclass(frozen=True, slots=True)
class Authorizer:
    """The grants of one ServiceAccount, from the roles bound to it in ``objects``."""

    service_account: str
    namespace: str
    grants: frozenset[Grant]
    non_resource_urls: tuple[str, ...]

    @classmethod
    def for_service_account(
        cls, objects: Iterable[Manifest], *, name: str, namespace: str
    ) -> Authorizer:
        objects = list(objects)
        grants: set[Grant] = set()
        urls: list[str] = list(PUBLIC_NON_RESOURCE_URLS)
        for binding in objects:
            kind = binding.get("kind")
            if kind not in ("ClusterRoleBinding", "RoleBinding"):
                continue
            if not any(
                _subject_matches(s, name=name, namespace=namespace)
                for s in binding.get("subjects") or []
            ):
                continue
            scope = binding["metadata"].get("namespace") if kind == "RoleBinding" else None
            role = _role(objects, binding["roleRef"], binding_namespace=scope)
            for rule in role.get("rules") or []:
                if scope is None:
                    urls.extend(rule.get("nonResourceURLs") or [])
                grants.update(_expand(rule, scope))
        return cls(name, namespace, frozenset(grants), tuple(urls))

    def checks(self, request: Request) -> list[Request]:
        """Every authorization check the API server makes for ``request`` (see module doc)."""
        extra = SYNTHETIC_CHECKS.get((request.api_group, request.resource, request.subresource))
        if extra is None or request.verb not in _WRITE_VERBS:
            return [request]
        resource, _, subresource = extra.partition("/")
        synthetic = Request(
            request.verb,
            request.api_group,
            resource,
            subresource,
            request.namespace,
            request.name,
        )
        return [request, synthetic]

    def denied(self, request: Request) -> list[Request]:
        """The checks of ``request`` no grant covers (empty: allowed)."""
        return [c for c in self.checks(request) if not any(g.covers(c) for g in self.grants)]

    def allows(self, request: Request) -> bool:
        return not self.denied(request)

    def allows_non_resource(self, verb: str, path: str) -> bool:
        del verb  # the default public URLs allow get; our components only read them
        return any(fnmatch.fnmatchcase(path, pattern) for pattern in self.non_resource_urls)

    def used_by(self, request: Request) -> set[Grant]:
        """The grants that take part in allowing ``request`` (all that cover any of its checks)."""
        return {g for c in self.checks(request) for g in self.grants if g.covers(c)}


def _subject_matches(subject: Mapping[str, Any], *, name: str, namespace: str) -> bool:
    kind, subject_name = subject.get("kind"), subject.get("name")
    if kind == "ServiceAccount":
        return bool(subject_name == name and subject.get("namespace") == namespace)
    if kind == "User":
        return bool(subject_name == f"system:serviceaccount:{namespace}:{name}")
    if kind == "Group":
        return subject_name in (*SERVICE_ACCOUNT_GROUPS, f"system:serviceaccounts:{namespace}")
    return False


def _role(
    objects: list[Manifest], ref: Mapping[str, Any], *, binding_namespace: str | None
) -> Manifest:
    kind, name = ref["kind"], ref["name"]
    if kind == "Role" and binding_namespace is None:
        raise ValueError(f"a ClusterRoleBinding cannot refer to Role {name}")
    for obj in objects:
        if obj.get("kind") != kind or obj["metadata"]["name"] != name:
            continue
        if kind == "Role" and obj["metadata"].get("namespace") != binding_namespace:
            continue
        return obj
    raise ValueError(f"binding refers to {kind} {name}, which the manifests do not hold")


def _expand(rule: Mapping[str, Any], namespace: str | None) -> set[Grant]:
    names: list[str | None] = list(rule.get("resourceNames") or [None])
    return {
        Grant(namespace, group, resource, verb, resource_name)
        for group in rule.get("apiGroups") or []
        for resource in rule.get("resources") or []
        for verb in rule.get("verbs") or []
        for resource_name in names
    }


def shipped(service_account: str, *, overlay: str = "emulated") -> Authorizer:
    """The authorizer of one of our ServiceAccounts in the rendered ``deploy/overlays/<overlay>``."""
    from tests.deploy import manifests  # noqa: PLC0415 - kubectl only for callers of this helper

    objects = manifests.render(manifests.DEPLOY / "overlays" / overlay)
    return Authorizer.for_service_account(
        objects, name=service_account, namespace=SHIPPED_NAMESPACE
    )
