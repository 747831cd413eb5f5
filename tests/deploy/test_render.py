"""Every kustomization renders, and every object in it is a valid object of the kind it claims."""

from __future__ import annotations

import pytest

from tests.deploy import manifests as m

# Every kustomization a user can apply (components are included through the render.sh cases).
KUSTOMIZATIONS = {
    "deploy/base": m.DEPLOY / "base",
    "deploy/overlays/emulated": m.DEPLOY / "overlays" / "emulated",
    "deploy/overlays/gpu": m.DEPLOY / "overlays" / "gpu",
    "deploy/overlays/scheduler-native": m.DEPLOY / "overlays" / "scheduler-native",
    "deploy/overlays/scheduler-native-emulated": m.DEPLOY
    / "overlays"
    / "scheduler-native-emulated",
    "samples": m.SAMPLES,
    "samples/large-profiles": m.SAMPLES / "large-profiles",
    "samples/integrations": m.SAMPLES / "integrations",
}
RENDER_SCRIPT_CASES = {
    "gpu+cert-manager": ("gpu", {"COMPONENTS": "cert-manager"}),
    "gpu+monitoring": ("gpu", {"COMPONENTS": "monitoring"}),
    "emulated+extended-resource-names": ("emulated", {"COMPONENTS": "extended-resource-names"}),
    "gpu+scheduler-mode+extended-resource-names": (
        "gpu",
        {"COMPONENTS": "extended-resource-names classic-shim-off scheduler-mode"},
    ),
    "scheduler-native-emulated+4xH100": (
        "scheduler-native-emulated",
        {"COMPONENTS": "", "EMULATED_GPUS": "4xH100-80GB"},
    ),
    "emulated+both+4xH100": (
        "emulated",
        {"COMPONENTS": "cert-manager extended-resource-names", "EMULATED_GPUS": "4xH100-80GB"},
    ),
}


def test_every_kustomization_in_the_repository_is_covered() -> None:
    found = {
        str(path.parent.relative_to(m.REPO_ROOT))
        for root in (m.DEPLOY, m.SAMPLES)
        for path in root.rglob("kustomization.yaml")
        if "kind: Component" not in path.read_text(encoding="utf-8")
        and not path.parent.name.startswith(".render.")
    }
    assert found == set(KUSTOMIZATIONS)


def test_every_component_is_rendered_by_a_case() -> None:
    components = {p.parent.name for p in (m.DEPLOY / "components").glob("*/kustomization.yaml")}
    used = {c for _, env in RENDER_SCRIPT_CASES.values() for c in env["COMPONENTS"].split()}
    assert components == used


@pytest.mark.parametrize(
    "case", sorted([*KUSTOMIZATIONS, *(f"render.sh {n}" for n in RENDER_SCRIPT_CASES)])
)
def test_objects_are_valid_objects_of_their_kind(case: str) -> None:
    objects = _render(case)
    assert objects, f"{case} renders nothing"
    errors = []
    for obj in objects:
        kind = obj["kind"]
        if kind in m.ADDON_KINDS:
            if obj["apiVersion"] != m.ADDON_KINDS[kind]:
                errors.append(f"{kind}: apiVersion {obj['apiVersion']}")
            continue
        errors.extend(m.schema_errors(obj))
    assert errors == []


@pytest.mark.parametrize("case", sorted(KUSTOMIZATIONS))
def test_no_object_is_rendered_twice(case: str) -> None:
    keys = [
        (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in _render(case)
    ]
    assert len(keys) == len(set(keys))


def test_the_schema_check_catches_typos_missing_fields_and_bad_quantities() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {"limits": {"nvidia.com/mig-1g.5gb": "one"}},
                    "volumeMount": [],
                }
            ]
        },
    }
    errors = m.schema_errors(pod)
    assert any("volumeMount: unknown field" in e for e in errors), errors
    assert any("'one' is not a quantity" in e for e in errors), errors
    no_containers = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}}
    assert m.schema_errors(no_containers) != []
    wrong_version = {**no_containers, "apiVersion": "v2", "spec": {"containers": []}}
    assert any("apiVersion" in e for e in m.schema_errors(wrong_version))


def _render(case: str) -> list[m.Manifest]:
    if case in KUSTOMIZATIONS:
        return m.render(KUSTOMIZATIONS[case])
    overlay, env = RENDER_SCRIPT_CASES[case.removeprefix("render.sh ")]
    return m.render_script(overlay, env)
