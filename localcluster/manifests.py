"""Manifests as a user applies them: ``kubectl kustomize <dir>`` (or the files its
``kustomization.yaml`` lists, when kubectl is not installed), then create-or-update through the API
in the order given, and delete in reverse order.

Only the kinds the local API server serves are known here; any other object (a ``ResourceQuota``,
a KServe ``InferenceService``) is reported as skipped, never silently dropped.
"""

from __future__ import annotations

import copy
import logging
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from driver.cluster.port import (
    DEVICE_CLASSES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    ClusterApi,
    JsonObject,
    Resource,
)
from driver.errors import AlreadyExistsError, ApiNotFoundError, ConfigError, ConflictError

log = logging.getLogger(__name__)

NAMESPACES = Resource(
    group="", version="v1", plural="namespaces", kind="Namespace", namespaced=False
)
MUTATING_WEBHOOK_CONFIGURATIONS = Resource(
    group="admissionregistration.k8s.io",
    version="v1",
    plural="mutatingwebhookconfigurations",
    kind="MutatingWebhookConfiguration",
    namespaced=False,
)
DEPLOYMENTS = Resource(
    group="apps", version="v1", plural="deployments", kind="Deployment", namespaced=True
)
STATEFULSETS = Resource(
    group="apps", version="v1", plural="statefulsets", kind="StatefulSet", namespaced=True
)
REPLICASETS = Resource(
    group="apps", version="v1", plural="replicasets", kind="ReplicaSet", namespaced=True
)
JOBS = Resource(group="batch", version="v1", plural="jobs", kind="Job", namespaced=True)

KNOWN: tuple[Resource, ...] = (
    NAMESPACES,
    PODS,
    Resource(group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True),
    Resource(group="", version="v1", plural="secrets", kind="Secret", namespaced=True),
    Resource(group="", version="v1", plural="services", kind="Service", namespaced=True),
    Resource(
        group="", version="v1", plural="serviceaccounts", kind="ServiceAccount", namespaced=True
    ),
    RESOURCE_CLAIMS,
    RESOURCE_CLAIM_TEMPLATES,
    DEVICE_CLASSES,
    MUTATING_WEBHOOK_CONFIGURATIONS,
    DEPLOYMENTS,
    STATEFULSETS,
    REPLICASETS,
    Resource(group="apps", version="v1", plural="daemonsets", kind="DaemonSet", namespaced=True),
    JOBS,
)
_BY_KIND = {(r.api_version, r.kind): r for r in KNOWN}


def resource_for(obj: JsonObject) -> Resource | None:
    """The REST resource of ``obj``'s ``apiVersion``/``kind``, if the local API server serves it."""
    return _BY_KIND.get((str(obj.get("apiVersion", "")), str(obj.get("kind", ""))))


def describe(obj: JsonObject) -> str:
    """``Kind namespace/name`` (or ``Kind name``), as kubectl prints it."""
    meta = obj.get("metadata") or {}
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj.get('kind', '?')} {where}{meta.get('name', '?')}"


def load_yaml_documents(text: str, *, source: str) -> list[JsonObject]:
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}") from exc
    objects: list[JsonObject] = []
    for document in documents:
        if document is None:
            continue
        if not isinstance(document, dict) or "kind" not in document:
            raise ConfigError(f"{source}: every YAML document must be a Kubernetes object")
        if document["kind"] == "List":
            objects += [item for item in document.get("items") or [] if isinstance(item, dict)]
        else:
            objects.append(document)
    return objects


def load_file(path: Path) -> list[JsonObject]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    return load_yaml_documents(text, source=str(path))


def render_kustomization(directory: Path, *, kubectl: str | None = None) -> list[JsonObject]:
    """What ``kubectl apply -k directory`` would apply, in kustomize's output order.

    With kubectl on the PATH (or given) it renders with ``kubectl kustomize``; without it, the
    files listed under ``resources:`` are read in order (our samples use nothing else; any other
    kustomize feature is refused rather than ignored).
    """
    binary = kubectl or shutil.which("kubectl")
    if binary is not None:
        result = subprocess.run(
            [binary, "kustomize", str(directory)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        if result.returncode == 0:
            return load_yaml_documents(result.stdout, source=f"kubectl kustomize {directory}")
        log.warning("kubectl kustomize %s failed (%s); reading the files", directory, result.stderr)
    return read_kustomization(directory)


_PLAIN_KEYS = frozenset({"apiVersion", "kind", "resources"})


def read_kustomization(directory: Path) -> list[JsonObject]:
    """The objects of the files ``directory/kustomization.yaml`` lists, in kustomize's order."""
    path = directory / "kustomization.yaml"
    try:
        kustomization = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if not isinstance(kustomization, dict):
        raise ConfigError(f"{path} must hold one Kustomization")
    extra = sorted(set(kustomization) - _PLAIN_KEYS)
    if extra:
        raise ConfigError(
            f"{path} uses {', '.join(extra)}; rendering it needs kubectl (kubectl kustomize)"
        )
    objects: list[JsonObject] = []
    for entry in kustomization.get("resources") or []:
        target = directory / str(entry)
        objects += read_kustomization(target) if target.is_dir() else load_file(target)
    return _kustomize_order(objects)


# kustomize's legacy sort: namespaces and cluster-wide definitions first, workloads after.
_ORDER_FIRST = (
    "Namespace",
    "ResourceQuota",
    "StorageClass",
    "CustomResourceDefinition",
    "ServiceAccount",
    "PodSecurityPolicy",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "ConfigMap",
    "Secret",
    "Endpoints",
    "Service",
    "LimitRange",
    "PriorityClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "Deployment",
    "StatefulSet",
    "CronJob",
    "PodDisruptionBudget",
)
_ORDER_LAST = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def _kustomize_order(objects: Sequence[JsonObject]) -> list[JsonObject]:
    def rank(obj: JsonObject) -> int:
        kind = str(obj.get("kind", ""))
        if kind in _ORDER_FIRST:
            return _ORDER_FIRST.index(kind)
        if kind in _ORDER_LAST:
            return len(_ORDER_FIRST) + 1 + _ORDER_LAST.index(kind)
        return len(_ORDER_FIRST)

    def key(obj: JsonObject) -> tuple[int, str, str, str]:
        meta = obj.get("metadata") or {}
        return (
            rank(obj),
            str(obj.get("kind")),
            str(meta.get("namespace", "")),
            str(meta.get("name", "")),
        )

    return sorted(objects, key=key)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one object: ``created``, ``configured``, ``unchanged``, ``deleted``,
    ``not found``, or ``skipped (<why>)``."""

    object: JsonObject
    action: str

    def __str__(self) -> str:
        """``deployment.apps/mig-deployment created``, as ``kubectl apply`` prints it."""
        kind = str(self.object.get("kind", "?")).lower()
        group = str(self.object.get("apiVersion", "")).rpartition("/")[0]
        name = (self.object.get("metadata") or {}).get("name", "?")
        return f"{kind}{'.' + group if group else ''}/{name} {self.action}"


def apply_object(api: ClusterApi, obj: JsonObject) -> Outcome:
    """Create ``obj``, or replace the spec of the existing one (as ``kubectl apply`` would for
    objects it created)."""
    resource = resource_for(obj)
    if resource is None:
        return Outcome(obj, "skipped (kind not served by the local API server)")
    body = copy.deepcopy(obj)
    body.setdefault("metadata", {})
    namespace = body["metadata"].get("namespace")
    if resource.namespaced and not namespace:
        namespace = body["metadata"]["namespace"] = "default"
    try:
        api.create(resource, body, namespace=namespace if resource.namespaced else None)
        return Outcome(obj, "created")
    except AlreadyExistsError:
        pass
    for _ in range(3):
        current = api.get(
            resource,
            name=body["metadata"]["name"],
            namespace=namespace if resource.namespaced else None,
        )
        merged = _merged(current, body)
        if merged == current:
            return Outcome(obj, "unchanged")
        try:
            api.update(resource, merged)
            return Outcome(obj, "configured")
        except ConflictError:
            continue
    raise ConflictError(f"{describe(obj)} kept changing while being applied")


def _merged(current: JsonObject, desired: JsonObject) -> JsonObject:
    """``desired`` over ``current`` (maps merged key by key, lists replaced): what the server
    defaulted and ``desired`` does not mention stays, as with ``kubectl apply``."""
    merged = copy.deepcopy(current)
    for key, value in desired.items():
        if key == "status":
            continue
        merged[key] = _merge(merged.get(key), value)
    return merged


def _merge(current: object, desired: object) -> object:
    if isinstance(current, dict) and isinstance(desired, dict):
        out = dict(current)
        for key, value in desired.items():
            out[key] = _merge(current.get(key), value)
        return out
    if isinstance(current, list) and isinstance(desired, list) and len(current) == len(desired):
        return [_merge(c, d) for c, d in zip(current, desired, strict=True)]
    return copy.deepcopy(desired)


def delete_object(api: ClusterApi, obj: JsonObject) -> Outcome:
    """Delete with background propagation (``kubectl delete``'s default)."""
    resource = resource_for(obj)
    if resource is None:
        return Outcome(obj, "skipped (kind not served by the local API server)")
    meta = obj.get("metadata") or {}
    try:
        api.delete(
            resource,
            name=str(meta.get("name")),
            namespace=(meta.get("namespace") or "default") if resource.namespaced else None,
            propagation_policy="Background",
        )
    except ApiNotFoundError:
        return Outcome(obj, "not found")
    return Outcome(obj, "deleted")


def apply_all(api: ClusterApi, objects: Iterable[JsonObject]) -> list[Outcome]:
    return [apply_object(api, obj) for obj in objects]


def delete_all(
    api: ClusterApi, objects: Sequence[JsonObject], *, keep: Iterable[str] = ("Namespace",)
) -> list[Outcome]:
    """Delete in reverse order; kinds in ``keep`` stay (deleting a namespace would also take what
    the samples created in it, which the demo wants to watch go one by one)."""
    kept = set(keep)
    return [delete_object(api, obj) for obj in reversed(objects) if obj.get("kind") not in kept]
