"""The kinds the local API server serves, and the discovery documents built from them.

One table drives URL routing, storage keys, field-selector support and ``/api``, ``/apis`` discovery,
so a kind is added in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

JsonObj = dict[str, Any]

SERVER_VERSION: JsonObj = {
    "major": "1",
    "minor": "36",
    "gitVersion": "v1.36.0-localcluster",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.25",
    "compiler": "gc",
    "platform": "linux/amd64",
}

_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
_POD_FIELDS = frozenset(
    {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    }
)
_EVENT_FIELDS = frozenset(
    {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    }
)
_NEW_EVENT_FIELDS = frozenset(
    {
        "regarding.kind",
        "regarding.namespace",
        "regarding.name",
        "regarding.uid",
        "regarding.apiVersion",
        "reason",
        "reportingController",
        "type",
    }
)


@dataclass(frozen=True, slots=True)
class ResourceType:
    """One served resource (``pods``, ``resourceclaims.resource.k8s.io``, …)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    subresources: tuple[str, ...] = ()
    short_names: tuple[str, ...] = ()
    tracks_generation: bool = True
    field_labels: frozenset[str] = frozenset()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def supports_field(self, label: str) -> bool:
        if label in ("metadata.name", "metadata.namespace"):
            return True
        return label in self.field_labels


def _r(
    gv: str,
    plural: str,
    kind: str,
    *,
    namespaced: bool = True,
    sub: tuple[str, ...] = (),
    short: tuple[str, ...] = (),
    generation: bool = True,
    fields: frozenset[str] = frozenset(),
) -> ResourceType:
    group, _, version = gv.rpartition("/")
    return ResourceType(group, version, plural, kind, namespaced, sub, short, generation, fields)


RESOURCES: tuple[ResourceType, ...] = (
    _r(
        "v1",
        "namespaces",
        "Namespace",
        namespaced=False,
        sub=("status",),
        short=("ns",),
        generation=False,
        fields=frozenset({"status.phase"}),
    ),
    _r(
        "v1",
        "nodes",
        "Node",
        namespaced=False,
        sub=("status",),
        short=("no",),
        generation=False,
        fields=frozenset({"spec.unschedulable"}),
    ),
    _r(
        "v1",
        "pods",
        "Pod",
        sub=("status", "binding", "eviction"),
        short=("po",),
        fields=_POD_FIELDS,
    ),
    _r("v1", "events", "Event", short=("ev",), generation=False, fields=_EVENT_FIELDS),
    _r("v1", "secrets", "Secret", generation=False, fields=frozenset({"type"})),
    _r("v1", "configmaps", "ConfigMap", short=("cm",), generation=False),
    _r("v1", "services", "Service", sub=("status",), short=("svc",), generation=False),
    _r("v1", "serviceaccounts", "ServiceAccount", short=("sa",), generation=False),
    _r("resource.k8s.io/v1", "resourceclaims", "ResourceClaim", sub=("status",)),
    _r("resource.k8s.io/v1", "resourceclaimtemplates", "ResourceClaimTemplate"),
    _r(
        "resource.k8s.io/v1",
        "resourceslices",
        "ResourceSlice",
        namespaced=False,
        fields=frozenset({"spec.nodeName", "spec.driver"}),
    ),
    _r("resource.k8s.io/v1", "deviceclasses", "DeviceClass", namespaced=False),
    _r("coordination.k8s.io/v1", "leases", "Lease", generation=False),
    _r(
        "events.k8s.io/v1",
        "events",
        "Event",
        short=("ev",),
        generation=False,
        fields=_NEW_EVENT_FIELDS,
    ),
    _r(
        "admissionregistration.k8s.io/v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        namespaced=False,
        generation=False,
    ),
    _r("apps/v1", "deployments", "Deployment", sub=("status",), short=("deploy",)),
    _r("apps/v1", "statefulsets", "StatefulSet", sub=("status",), short=("sts",)),
    _r("apps/v1", "replicasets", "ReplicaSet", sub=("status",), short=("rs",)),
    _r("apps/v1", "daemonsets", "DaemonSet", sub=("status",), short=("ds",)),
    _r("batch/v1", "jobs", "Job", sub=("status",)),
    _r("scheduling.k8s.io/v1", "priorityclasses", "PriorityClass", namespaced=False, short=("pc",)),
    _r("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget", sub=("status",), short=("pdb",)),
)

BINDINGS = _r("v1", "bindings", "Binding", generation=False)
"""Create-only alias of ``pods/binding``; never stored."""

_BY_PATH: dict[tuple[str, str, str], ResourceType] = {
    (r.group, r.version, r.plural): r for r in (*RESOURCES, BINDINGS)
}

NAMESPACES = _BY_PATH[("", "v1", "namespaces")]
PODS = _BY_PATH[("", "v1", "pods")]
RESOURCE_CLAIMS = _BY_PATH[("resource.k8s.io", "v1", "resourceclaims")]
PRIORITY_CLASSES = _BY_PATH[("scheduling.k8s.io", "v1", "priorityclasses")]
POD_DISRUPTION_BUDGETS = _BY_PATH[("policy", "v1", "poddisruptionbudgets")]
DEPLOYMENTS = _BY_PATH[("apps", "v1", "deployments")]
REPLICA_SETS = _BY_PATH[("apps", "v1", "replicasets")]
STATEFUL_SETS = _BY_PATH[("apps", "v1", "statefulsets")]
MUTATING_WEBHOOKS = _BY_PATH[
    ("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations")
]


def lookup(group: str, version: str, plural: str) -> ResourceType | None:
    return _BY_PATH.get((group, version, plural))


def _groups() -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for r in RESOURCES:
        if r.group:
            versions = groups.setdefault(r.group, [])
            if r.version not in versions:
                versions.append(r.version)
    return groups


def api_versions(server_address: str) -> JsonObj:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def _group_doc(group: str, versions: list[str]) -> JsonObj:
    listed = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": listed, "preferredVersion": listed[0]}


def api_group_list() -> JsonObj:
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group_doc(g, vs) for g, vs in _groups().items()],
    }


def api_group(group: str) -> JsonObj | None:
    versions = _groups().get(group)
    if versions is None:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_doc(group, versions)}


def api_resource_list(group: str, version: str) -> JsonObj | None:
    served = [r for r in RESOURCES if r.group == group and r.version == version]
    if not served:
        return None
    entries: list[JsonObj] = []
    for r in served:
        entries.append(
            {
                "name": r.plural,
                "singularName": r.kind.lower(),
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": _VERBS,
                **({"shortNames": list(r.short_names)} if r.short_names else {}),
            }
        )
        for sub in r.subresources:
            verbs = ["create"] if sub in ("binding", "eviction") else ["get", "patch", "update"]
            kind = {"binding": "Binding", "eviction": "Eviction"}.get(sub, r.kind)
            entries.append(
                {
                    "name": f"{r.plural}/{sub}",
                    "singularName": "",
                    "namespaced": r.namespaced,
                    "kind": kind,
                    "verbs": verbs,
                }
            )
    if not group:
        entries.append(
            {
                "name": "bindings",
                "singularName": "binding",
                "namespaced": True,
                "kind": "Binding",
                "verbs": ["create"],
            }
        )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": entries,
    }
