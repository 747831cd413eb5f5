"""The CDI spec model enforces the CDI library's loading rules, so a spec we build always loads."""

import json
from typing import Any

import pytest
from pydantic import ValidationError

from api.cdi import (
    CdiDevice,
    CdiSpec,
    ContainerEdits,
    DeviceNode,
    Hook,
    Mount,
    minimum_required_version,
    qualified_device_name,
    spec_from_json,
    spec_to_json,
    split_kind,
)
from api.errors import ValidationFailed

ENV = ContainerEdits(env=("A=1",))


def _spec(
    *, kind: str = "instaslice.dev/mig", version: str = "0.5.0", names: tuple[str, ...] = ("dev-a",)
) -> CdiSpec:
    return CdiSpec(
        cdi_version=version,
        kind=kind,
        devices=tuple(CdiDevice(name=name, container_edits=ENV) for name in names),
    )


@pytest.mark.parametrize(
    "kind",
    ["instaslice.dev/mig", "a/b", "nvidia.com/gpu", "k8s.gpu.nvidia.com/claim", "v_1/c-2"],
    ids=["ours", "short", "nvidia", "dotted-class", "underscore"],
)
def test_good_kinds(kind: str) -> None:
    vendor, klass = split_kind(kind)
    assert f"{vendor}/{klass}" == kind


@pytest.mark.parametrize(
    ("kind", "fragment"),
    [
        ("", "both parts non-empty"),
        ("instaslice.dev", "both parts non-empty"),
        ("/mig", "both parts non-empty"),
        ("instaslice.dev/", "both parts non-empty"),
        ("1vendor/mig", "vendor '1vendor' must start with a letter"),
        ("vendor-/mig", "vendor 'vendor-'"),
        ("vendor/mig-", "class 'mig-'"),
        ("ven dor/mig", "vendor 'ven dor'"),
        ("vendor/m/ig", "class 'm/ig'"),
    ],
    ids=[
        "empty",
        "no-slash",
        "no-vendor",
        "no-class",
        "digit-first",
        "vendor-dash-end",
        "class-dash-end",
        "space",
        "two-slashes",
    ],
)
def test_bad_kinds_are_refused_with_the_rule(kind: str, fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        _spec(kind=kind)
    message = str(info.value)
    assert fragment in message


@pytest.mark.parametrize(
    "name",
    ["-dev", "dev-", "de v", "dev/x", "dev=x", "", "dev_"],
    ids=["dash-first", "dash-last", "space", "slash", "equals", "empty", "underscore-last"],
)
def test_bad_device_names_are_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="must start and end with a letter or digit"):
        CdiDevice(name=name, container_edits=ENV)


@pytest.mark.parametrize(
    "name", ["a", "0b5c-gpu-0-1g-5gb-3", "a.b:c_d-e"], ids=["one-char", "uid-first", "all-chars"]
)
def test_good_device_names(name: str) -> None:
    assert CdiDevice(name=name, container_edits=ENV).name == name


def test_unknown_cdi_version_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"cdiVersion '0\.9\.0' is not a CDI version"):
        _spec(version="0.9.0")


def test_a_version_lower_than_the_contents_need_is_refused() -> None:
    with pytest.raises(
        ValidationError,
        match=r"cdiVersion 0\.3\.0 is too low for this spec: its contents need 0\.5\.0",
    ):
        _spec(version="0.3.0", names=("0abc",))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (_spec(names=("abc",)), "0.3.0"),
        (_spec(names=("0abc",)), "0.5.0"),
        (_spec(kind="vendor/cl.ass", version="0.6.0"), "0.6.0"),
        (
            CdiSpec(
                cdi_version="0.5.0",
                kind="a/b",
                devices=(
                    CdiDevice(
                        name="x",
                        container_edits=ContainerEdits(
                            device_nodes=(DeviceNode(path="/dev/x", host_path="/dev/y"),)
                        ),
                    ),
                ),
            ),
            "0.5.0",
        ),
        (
            CdiSpec(
                cdi_version="0.5.0",
                kind="a/b",
                devices=(
                    CdiDevice(
                        name="x",
                        container_edits=ContainerEdits(
                            mounts=(Mount(host_path="/a", container_path="/b", type="bind"),)
                        ),
                    ),
                ),
            ),
            "0.4.0",
        ),
    ],
    ids=["letters", "digit-first-name", "dot-in-class", "host-path", "mount-type"],
)
def test_minimum_required_version(spec: CdiSpec, expected: str) -> None:
    assert minimum_required_version(spec) == expected


def test_device_edits_must_not_be_empty() -> None:
    with pytest.raises(ValidationError, match="has empty containerEdits"):
        CdiDevice(name="x", container_edits=ContainerEdits())


def test_a_spec_needs_a_device_and_unique_names() -> None:
    with pytest.raises(ValidationError, match="at least one device"):
        _spec(names=())
    with pytest.raises(ValidationError, match=r"repeated: \['a'\]"):
        _spec(names=("a", "b", "a"))


@pytest.mark.parametrize("entry", ["NOEQUALS", "=value"], ids=["no-equals", "no-name"])
def test_env_entries_need_a_name_and_equals(entry: str) -> None:
    with pytest.raises(ValidationError, match="must look like NAME=value"):
        ContainerEdits(env=(entry,))


def test_device_node_rules() -> None:
    with pytest.raises(ValidationError, match="may only use the letters r, w and m"):
        DeviceNode(path="/dev/x", permissions="rwx")
    with pytest.raises(ValidationError, match="path must not be empty"):
        DeviceNode(path="")
    with pytest.raises(ValidationError, match="Input should be 'b', 'c', 'u' or 'p'"):
        DeviceNode(path="/dev/x", type="x")  # type: ignore[arg-type]


def test_hook_and_mount_rules() -> None:
    with pytest.raises(ValidationError, match="hook name 'preStart' is not one of"):
        Hook(hook_name="preStart", path="/bin/true")
    with pytest.raises(ValidationError, match="needs a non-empty path"):
        Hook(hook_name="createContainer", path="")
    with pytest.raises(ValidationError, match="non-empty hostPath and containerPath"):
        Mount(host_path="", container_path="/x")


def test_serialisation_uses_schema_names_and_leaves_out_unset_fields() -> None:
    spec = CdiSpec(
        cdi_version="0.5.0",
        kind="a/b",
        devices=(
            CdiDevice(
                name="x",
                container_edits=ContainerEdits(
                    env=("A=1",),
                    device_nodes=(
                        DeviceNode(path="/dev/x", type="c", major=1, minor=2, file_mode=0o444),
                    ),
                    hooks=(
                        Hook(hook_name="createContainer", path="/bin/hook", args=("hook", "x")),
                    ),
                    mounts=(Mount(host_path="/h", container_path="/c", options=("ro",)),),
                ),
            ),
        ),
    )
    doc = json.loads(spec_to_json(spec))
    assert doc == {
        "cdiVersion": "0.5.0",
        "kind": "a/b",
        "devices": [
            {
                "name": "x",
                "containerEdits": {
                    "env": ["A=1"],
                    "deviceNodes": [
                        {"path": "/dev/x", "type": "c", "major": 1, "minor": 2, "fileMode": 0o444}
                    ],
                    "mounts": [{"hostPath": "/h", "containerPath": "/c", "options": ["ro"]}],
                    "hooks": [
                        {"hookName": "createContainer", "path": "/bin/hook", "args": ["hook", "x"]}
                    ],
                },
            }
        ],
    }
    assert spec_from_json(spec_to_json(spec)) == spec


def _doc(**edits: Any) -> dict[str, Any]:
    return {
        "cdiVersion": "0.5.0",
        "kind": "a/b",
        "devices": [{"name": "x", "containerEdits": {"env": ["A=1"], **edits}}],
    }


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({**_doc(), "annotations": {"a": "b"}}, "unknown field 'annotations' in CDI spec"),
        (_doc(foo=1), "unknown field 'devices.0.containerEdits.foo' in CDI spec"),
        (
            _doc(device_nodes=[]),
            "unknown field 'devices.0.containerEdits.device_nodes' in CDI spec",
        ),
        ({"kind": "a/b", "devices": []}, "missing required field 'cdiVersion' in CDI spec"),
        (
            {**_doc(), "cdiVersion": "2.0.0"},
            "CDI spec: cdiVersion '2.0.0' is not a CDI version",
        ),
    ],
    ids=[
        "annotations-not-ours",
        "unknown-nested",
        "snake-case-name",
        "missing-version",
        "bad-version",
    ],
)
def test_loading_reports_each_problem_readably(doc: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValidationFailed) as info:
        spec_from_json(json.dumps(doc).encode())
    assert any(problem.startswith(expected) for problem in info.value.problems), info.value.problems


def test_qualified_device_name() -> None:
    assert (
        qualified_device_name("instaslice.dev/mig", "uid-gpu-0") == "instaslice.dev/mig=uid-gpu-0"
    )
    with pytest.raises(ValueError, match="naming rules"):
        qualified_device_name("instaslice.dev/mig", "bad-")
    with pytest.raises(ValueError, match="vendor/class"):
        qualified_device_name("mig", "ok")
