"""The DeviceClasses are generated from the MIG catalog, cover every profile, and select the right
devices when their CEL selectors are evaluated on devices shaped like the ones the plugin publishes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import celpy
import pytest
import yaml
from celpy.adapter import json_to_cel
from celpy.celtypes import Value

from api import names
from driver.mig.catalog import CATALOG
from tests.deploy import manifests as m

GENERATOR = m.DEPLOY / "generate_deviceclasses.py"
ALL_PROFILES = sorted({p for model in CATALOG.values() for p in model.profile_names})


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_deviceclasses", GENERATOR)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _classes() -> dict[str, dict[str, Any]]:
    text = (m.DEPLOY / "base" / "deviceclasses.yaml").read_text(encoding="utf-8")
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(text) if d}


def _device(*, driver: str = names.DRIVER_NAME, profile: str | None = None) -> Value:
    attributes = {} if profile is None else {driver: {names.ATTRIBUTE_PROFILE: profile}}
    return json_to_cel({"driver": driver, "attributes": attributes, "capacity": {}})


def _selects(device_class: dict[str, Any], device: Value) -> bool:
    env = celpy.Environment()
    return all(
        bool(env.program(env.compile(s["cel"]["expression"])).evaluate({"device": device}))
        for s in device_class["spec"]["selectors"]
    )


def test_committed_files_are_what_the_catalog_gives() -> None:
    for path, text in _generator().rendered_files().items():
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale: run make deviceclasses"


def test_check_mode_passes_on_the_committed_tree() -> None:
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
    )
    assert result.returncode == 0, result.stderr


def test_check_mode_notices_a_stale_file(tmp_path: Path) -> None:
    generator = _generator()
    stale = tmp_path / "deviceclasses.yaml"
    stale.write_text("# edited by hand\n", encoding="utf-8")
    setattr(generator, "BASE_FILE", stale)  # noqa: B010 - module loaded from a file path
    setattr(generator, "PATCH_FILE", tmp_path / "patches.yaml")  # noqa: B010
    assert generator.main(["--check"]) == 1
    assert stale.read_text(encoding="utf-8") == "# edited by hand\n"
    assert generator.main([]) == 0
    assert generator.main(["--check"]) == 0


def test_one_class_for_any_slice_and_one_per_catalog_profile() -> None:
    expected = {names.DEVICE_CLASS_ANY} | {names.profile_device_class(p) for p in ALL_PROFILES}
    assert set(_classes()) == expected


def test_no_class_sets_an_extended_resource_name_by_default() -> None:
    # docs/design.md F7: the shim and the controller own classic requests; kube-scheduler must not race.
    for device_class in _classes().values():
        assert "extendedResourceName" not in device_class["spec"]


@pytest.mark.parametrize("profile", ALL_PROFILES, ids=ALL_PROFILES)
def test_profile_class_selects_exactly_its_profile(profile: str) -> None:
    device_class = _classes()[names.profile_device_class(profile)]
    assert _selects(device_class, _device(profile=profile))
    for other in ALL_PROFILES:
        if other != profile:
            assert not _selects(device_class, _device(profile=other)), other
    # Another driver's device with the same profile name is not ours.
    assert not _selects(device_class, _device(driver="gpu.nvidia.com", profile=profile))


def test_any_slice_class_selects_every_device_of_our_driver_only() -> None:
    device_class = _classes()[names.DEVICE_CLASS_ANY]
    assert all(_selects(device_class, _device(profile=p)) for p in ALL_PROFILES)
    assert not _selects(device_class, _device(driver="gpu.nvidia.com", profile="1g.5gb"))


def test_opt_in_component_names_the_classic_resource_of_each_profile() -> None:
    objects = m.render_script("emulated", {"COMPONENTS": "extended-resource-names"})
    by_name = {d["metadata"]["name"]: d["spec"] for d in m.find(objects, "DeviceClass")}
    assert "extendedResourceName" not in by_name[names.DEVICE_CLASS_ANY]
    for profile in ALL_PROFILES:
        spec = by_name[names.profile_device_class(profile)]
        assert spec["extendedResourceName"] == names.classic_resource_name(profile)
        assert spec["selectors"], "the patch must keep the selectors"


def test_base_renders_the_generated_classes() -> None:
    rendered = {d["metadata"]["name"] for d in m.find(m.render(m.DEPLOY / "base"), "DeviceClass")}
    assert rendered == set(_classes())
