"""Render the kustomizations with ``kubectl kustomize`` and check objects against the API's own models.

The ``kubernetes`` client's generated models carry, per kind, the JSON field names
(``attribute_map``), the field types (``openapi_types``) and the required fields (their setters
refuse ``None``). ``schema_errors`` walks a manifest with them: an unknown field anywhere (a typo
the API server would drop or refuse), a missing required field or a malformed quantity is reported
with its path. Kinds the client has no model for (cert-manager, KServe, Kueue) are checked by the
tests that use them.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import pytest
import yaml
from kubernetes import client
from kubernetes.utils import parse_quantity as _parse_quantity

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"
SAMPLES = REPO_ROOT / "samples"

Manifest = dict[str, Any]

parse_quantity = cast(Callable[[object], Decimal], _parse_quantity)
"""``kubernetes.utils.parse_quantity``, typed: a Kubernetes quantity (``"1"``, ``4Gi``) as a Decimal."""

# kind -> (apiVersion we ship, model class in the kubernetes client)
BUILTIN_KINDS: Mapping[str, tuple[str, str]] = {
    "Namespace": ("v1", "V1Namespace"),
    "ServiceAccount": ("v1", "V1ServiceAccount"),
    "Service": ("v1", "V1Service"),
    "ConfigMap": ("v1", "V1ConfigMap"),
    "Pod": ("v1", "V1Pod"),
    "ResourceQuota": ("v1", "V1ResourceQuota"),
    "ClusterRole": ("rbac.authorization.k8s.io/v1", "V1ClusterRole"),
    "ClusterRoleBinding": ("rbac.authorization.k8s.io/v1", "V1ClusterRoleBinding"),
    "Role": ("rbac.authorization.k8s.io/v1", "V1Role"),
    "RoleBinding": ("rbac.authorization.k8s.io/v1", "V1RoleBinding"),
    "Deployment": ("apps/v1", "V1Deployment"),
    "DaemonSet": ("apps/v1", "V1DaemonSet"),
    "StatefulSet": ("apps/v1", "V1StatefulSet"),
    "Job": ("batch/v1", "V1Job"),
    "PodDisruptionBudget": ("policy/v1", "V1PodDisruptionBudget"),
    "MutatingWebhookConfiguration": (
        "admissionregistration.k8s.io/v1",
        "V1MutatingWebhookConfiguration",
    ),
    "DeviceClass": ("resource.k8s.io/v1", "V1DeviceClass"),
    "ResourceClaimTemplate": ("resource.k8s.io/v1", "V1ResourceClaimTemplate"),
}

# Kinds of add-ons (no model in the client): kind -> apiVersion we ship.
ADDON_KINDS: Mapping[str, str] = {
    "Issuer": "cert-manager.io/v1",
    "Certificate": "cert-manager.io/v1",
    "InferenceService": "serving.kserve.io/v1beta1",
    "ResourceFlavor": "kueue.x-k8s.io/v1beta2",
    "ClusterQueue": "kueue.x-k8s.io/v1beta2",
    "LocalQueue": "kueue.x-k8s.io/v1beta2",
    "ServiceMonitor": "monitoring.coreos.com/v1",
    "PrometheusRule": "monitoring.coreos.com/v1",
}

_PRIMITIVES = {"str", "int", "float", "bool", "date", "datetime", "object"}
# The client spells container types ``List[X]`` / ``Dict[str, X]`` (older: ``list[X]`` / ``dict(str, X)``).
_LIST = re.compile(r"^[Ll]ist\[(?P<item>.+)\]$")
_DICT = re.compile(r"^(?:dict\((?:[^,]+), (?P<old>.+)\)|Dict\[(?:[^,]+), (?P<new>.+)\])$")
# Fields whose string values are Kubernetes quantities (resource amounts, quota).
_QUANTITY_PARENTS = {"limits", "requests", "hard", "capacity"}


def kubectl() -> str:
    """Path of kubectl, or skip the calling test with the reason."""
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl is not installed: the kustomizations cannot be rendered here")
    return path


@functools.cache
def _render_cached(directory: str) -> tuple[str, ...]:
    result = subprocess.run(
        [kubectl(), "kustomize", directory],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"kubectl kustomize {directory} failed:\n{result.stderr}")
    return (result.stdout,)


def render(directory: Path) -> list[Manifest]:
    """The objects ``kubectl kustomize <directory>`` produces (fresh copies for each caller)."""
    (text,) = _render_cached(str(directory))
    return parse(text)


def render_script(overlay: str, env: Mapping[str, str]) -> list[Manifest]:
    """The objects ``deploy/render.sh <overlay>`` produces with ``env`` (IMG, COMPONENTS, ...)."""
    result = run_render_script(overlay, env)
    assert result.returncode == 0, result.stderr
    return parse(result.stdout)


def run_render_script(overlay: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    kubectl_path = kubectl()
    return subprocess.run(
        ["sh", str(DEPLOY / "render.sh"), overlay],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": str(Path(kubectl_path).parent) + ":/usr/bin:/bin", **env},
    )


def parse(text: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def find(objects: list[Manifest], kind: str, name: str | None = None) -> list[Manifest]:
    return [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def one(objects: list[Manifest], kind: str, name: str) -> Manifest:
    matches = find(objects, kind, name)
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def pod_specs(obj: Manifest) -> Iterator[Manifest]:
    """The pod spec of a Pod or of a workload's pod template."""
    if obj["kind"] == "Pod":
        yield obj["spec"]
    elif obj["kind"] in {"Deployment", "DaemonSet", "StatefulSet", "Job"}:
        yield obj["spec"]["template"]["spec"]


def schema_errors(obj: Manifest) -> list[str]:
    """Why ``obj`` is not a valid object of the built-in kind it claims to be (empty: it is)."""
    kind = str(obj.get("kind"))
    if kind not in BUILTIN_KINDS:
        return [f"{kind!r} is not a built-in kind this test knows"]
    api_version, model = BUILTIN_KINDS[kind]
    errors = []
    if obj.get("apiVersion") != api_version:
        errors.append(f"apiVersion {obj.get('apiVersion')!r}, expected {api_version!r}")
    errors.extend(field_errors(obj, model, path=kind))
    if not errors:
        errors.extend(_required_field_errors(obj, model))
    return errors


def field_errors(data: Any, type_name: str, *, path: str, field: str = "") -> list[str]:
    """Unknown fields and malformed quantities in ``data`` read as the client type ``type_name``.

    ``field`` is the JSON name under which ``data`` sits (``limits``, ``hard``, ...).
    """
    if data is None:
        return []
    if match := _LIST.match(type_name):
        if not isinstance(data, list):
            return [f"{path}: expected a list, got {type(data).__name__}"]
        errors: list[str] = []
        for index, item in enumerate(data):
            errors.extend(field_errors(item, match["item"], path=f"{path}[{index}]"))
        return errors
    if match := _DICT.match(type_name):
        if not isinstance(data, dict):
            return [f"{path}: expected a map, got {type(data).__name__}"]
        value_type = match["old"] or match["new"]
        errors = []
        for key, value in data.items():
            errors.extend(
                _quantity_errors(value, path=f"{path}.{key}", quantity=field in _QUANTITY_PARENTS)
                if value_type in _PRIMITIVES
                else field_errors(value, value_type, path=f"{path}.{key}")
            )
        return errors
    if type_name in _PRIMITIVES:
        return []
    model = getattr(client, type_name)
    if not isinstance(data, dict):
        return [f"{path}: expected an object ({type_name}), got {type(data).__name__}"]
    by_json_name = {json: attr for attr, json in model.attribute_map.items()}
    errors = []
    for key, value in data.items():
        attr = by_json_name.get(key)
        if attr is None:
            errors.append(f"{path}.{key}: unknown field of {type_name}")
            continue
        errors.extend(
            field_errors(value, model.openapi_types[attr], path=f"{path}.{key}", field=key)
        )
    return errors


def _quantity_errors(value: Any, *, path: str, quantity: bool) -> list[str]:
    if not quantity:
        return []
    try:
        parse_quantity(value)
    except ValueError as exc:
        return [f"{path}: {value!r} is not a quantity ({exc})"]
    return []


def _required_field_errors(obj: Manifest, model: str) -> list[str]:
    """Build the model from the manifest: the model refuses a missing required field."""
    api: Any = client.ApiClient()
    try:
        # The client's own JSON -> model path (name-mangled private method of ApiClient).
        api._ApiClient__deserialize(_quantities_as_strings(obj), model)
    except ValueError as exc:
        return [f"{obj['kind']}/{obj['metadata'].get('name')}: {exc}"]
    finally:
        api.close()
    return []


def _quantities_as_strings(data: Any, *, field: str = "") -> Any:
    """YAML ``1`` and ``"1"`` are the same quantity to the API server; the client models want text.

    ``field`` is the name under which ``data`` sits; the values of a quantity map become strings.
    """
    if isinstance(data, dict):
        if field in _QUANTITY_PARENTS:
            return {k: _number_as_string(v) for k, v in data.items()}
        return {k: _quantities_as_strings(v, field=str(k)) for k, v in data.items()}
    if isinstance(data, list):
        return [_quantities_as_strings(item) for item in data]
    return data


def _number_as_string(value: Any) -> Any:
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def monitoring_generator() -> ModuleType:
    """``deploy/components/monitoring/generate.py`` as a module (its panels, queries, files)."""
    path = DEPLOY / "components" / "monitoring" / "generate.py"
    spec = importlib.util.spec_from_file_location("monitoring_generate", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module
