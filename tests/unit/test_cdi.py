"""CDI specs for claims: visibility under last-wins env, emulated mode, valid files, atomic writes."""

import itertools
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from api.cdi import CdiSpec, spec_to_json
from api.config import RESERVED_ENV_NAMES, RESERVED_ENV_PREFIX
from driver.cdi import (
    CDI_VERSION,
    SLICE_ENV_PREFIX,
    VISIBLE_DEVICES_ENV,
    CdiSlice,
    DeviceMajors,
    build_claim_spec,
    cdi_device_id,
    claim_cdi_device_id,
    list_specs,
    parse_proc_devices,
    read_device_majors,
    read_spec,
    remove_spec,
    remove_stale_temp_specs,
    visibility_env,
    write_spec,
)
from driver.errors import CdiError, ConfigError
from driver.ids import MigUuid

CLAIM_A = "0b5c4e2a-1111-2222-3333-444455556666"
CLAIM_B = "f00dfeed-aaaa-bbbb-cccc-ddddeeeeffff"

# --- a stand-in for the CDI library's strict loader (tags.cncf.io/container-device-interface
# v1.1.0): field sets copied from the CDI JSON schema (schema.json + defs.json), not from our model.
SPEC_FIELDS = {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}
SPEC_REQUIRED = {"cdiVersion", "kind", "devices"}
DEVICE_FIELDS = {"name", "annotations", "containerEdits"}
DEVICE_REQUIRED = {"name", "containerEdits"}
EDITS_FIELDS = {"env", "deviceNodes", "hooks", "mounts", "netDevices", "intelRdt", "additionalGids"}
NODE_FIELDS = {
    "path",
    "hostPath",
    "type",
    "major",
    "minor",
    "fileMode",
    "permissions",
    "uid",
    "gid",
}
MOUNT_FIELDS = {"hostPath", "containerPath", "options", "type"}
HOOK_FIELDS = {"hookName", "path", "args", "env", "timeout"}
VERSIONS = ["0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"]
KIND_PART = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


def cdi_load_errors(doc: Any) -> list[str]:
    errors: list[str] = []

    def fields(obj: Any, allowed: set[str], required: set[str], where: str) -> None:
        if not isinstance(obj, dict):
            errors.append(f"{where}: not an object")
            return
        errors.extend(f"{where}: unknown field {k}" for k in sorted(set(obj) - allowed))
        errors.extend(f"{where}: missing {k}" for k in sorted(required - set(obj)))

    def edits(obj: Any, where: str) -> bool:
        fields(obj, EDITS_FIELDS, set(), where)
        for entry in obj.get("env", []):
            if not isinstance(entry, str) or entry.find("=") <= 0:
                errors.append(f"{where}: bad env {entry!r}")
        for i, node in enumerate(obj.get("deviceNodes", [])):
            fields(node, NODE_FIELDS, {"path"}, f"{where}.deviceNodes[{i}]")
            if node.get("type", "") not in {"", "b", "c", "u", "p"}:
                errors.append(f"{where}: bad node type")
        for i, mount in enumerate(obj.get("mounts", [])):
            fields(mount, MOUNT_FIELDS, {"hostPath", "containerPath"}, f"{where}.mounts[{i}]")
        for i, hook in enumerate(obj.get("hooks", [])):
            fields(hook, HOOK_FIELDS, {"hookName", "path"}, f"{where}.hooks[{i}]")
        return any(obj.get(k) for k in EDITS_FIELDS)

    fields(doc, SPEC_FIELDS, SPEC_REQUIRED, "spec")
    if errors:
        return errors
    vendor, _, klass = doc["kind"].partition("/")
    if not (KIND_PART.match(vendor) and KIND_PART.match(klass)):
        errors.append(f"bad kind {doc['kind']!r}")
    if doc["cdiVersion"] not in VERSIONS:
        errors.append(f"unknown cdiVersion {doc['cdiVersion']!r}")
    names = [d.get("name", "") for d in doc["devices"]]
    if not names or len(set(names)) != len(names):
        errors.append("no devices or repeated names")
    needs_050 = any(n[:1].isdigit() for n in names)
    for i, device in enumerate(doc["devices"]):
        fields(device, DEVICE_FIELDS, DEVICE_REQUIRED, f"devices[{i}]")
        if not DEVICE_NAME.match(device.get("name", "")):
            errors.append(f"bad device name {device.get('name')!r}")
        if not edits(device.get("containerEdits", {}), f"devices[{i}].containerEdits"):
            errors.append(f"devices[{i}]: empty containerEdits")
        needs_050 |= any("hostPath" in n for n in device["containerEdits"].get("deviceNodes", []))
    if "containerEdits" in doc:
        edits(doc["containerEdits"], "spec.containerEdits")
    if needs_050 and VERSIONS.index(doc["cdiVersion"]) < VERSIONS.index("0.5.0"):
        errors.append("cdiVersion too low")
    return errors


def _slices(count: int, *, env: tuple[tuple[str, str], ...] = ()) -> list[CdiSlice]:
    return [
        CdiSlice(
            device=f"gpu-0-1g-5gb-{i}",
            mig_uuid=MigUuid(f"MIG-{i:08x}-aaaa-bbbb-cccc-000000000000"),
            gpu_minor=0,
            gi_cap_minor=10 + 2 * i,
            ci_cap_minor=11 + 2 * i,
            env=env,
        )
        for i in range(count)
    ]


def _inject(specs: list[CdiSpec], order: list[tuple[int, int]]) -> dict[str, str]:
    """Apply device edits the way the CDI library does: in order, a later env entry replaces."""
    env: dict[str, str] = {}
    for spec_index, device_index in order:
        device = specs[spec_index].devices[device_index]
        for entry in device.container_edits.env or ():
            name, _, value = entry.partition("=")
            env[name] = value
    return env


def _slice_vars(env: dict[str, str]) -> set[str]:
    return {value for name, value in env.items() if name.startswith("INSTASLICE_MIG_UUID_")}


def test_three_slices_are_all_visible_whichever_device_the_runtime_applies_last() -> None:
    slices = _slices(3)
    spec = build_claim_spec(claim_uid=CLAIM_A, slices=slices, emulated=False)
    uuids = [s.mig_uuid for s in slices]
    for order in itertools.permutations(range(3)):
        env = _inject([spec], [(0, i) for i in order])
        assert env[VISIBLE_DEVICES_ENV].split(",") == uuids
        assert _slice_vars(env) == set(uuids)


def test_two_claims_in_one_container_keep_every_per_slice_variable() -> None:
    a_slices, b_slices = _slices(2), _slices(2)
    b_slices = [
        CdiSlice(s.device, MigUuid(s.mig_uuid.replace("MIG-", "MIG-b")), 1, 30 + i, 40 + i)
        for i, s in enumerate(b_slices)
    ]
    spec_a = build_claim_spec(claim_uid=CLAIM_A, slices=a_slices, emulated=True)
    spec_b = build_claim_spec(claim_uid=CLAIM_B, slices=b_slices, emulated=True)
    every = {s.mig_uuid for s in a_slices + b_slices}
    for order in itertools.permutations([(0, 0), (0, 1), (1, 0), (1, 1)]):
        env = _inject([spec_a, spec_b], list(order))
        assert _slice_vars(env) == every
        # The documented cross-claim limit: NVIDIA_VISIBLE_DEVICES names the last claim applied.
        last_claim = [a_slices, b_slices][order[-1][0]]
        assert env[VISIBLE_DEVICES_ENV] == ",".join(s.mig_uuid for s in last_claim)


def test_real_mode_grants_parent_gpu_and_both_capability_nodes_with_numbers() -> None:
    spec = build_claim_spec(
        claim_uid=CLAIM_A, slices=_slices(1), emulated=False, majors=DeviceMajors(gpu=195, caps=236)
    )
    nodes = json.loads(spec_to_json(spec))["devices"][0]["containerEdits"]["deviceNodes"]
    assert nodes == [
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
        {"path": "/dev/nvidia-caps/nvidia-cap10", "type": "c", "major": 236, "minor": 10},
        {"path": "/dev/nvidia-caps/nvidia-cap11", "type": "c", "major": 236, "minor": 11},
    ]


def test_real_mode_without_known_majors_names_paths_only() -> None:
    spec = build_claim_spec(claim_uid=CLAIM_A, slices=_slices(1), emulated=False)
    nodes = json.loads(spec_to_json(spec))["devices"][0]["containerEdits"]["deviceNodes"]
    assert nodes == [
        {"path": "/dev/nvidia0"},
        {"path": "/dev/nvidia-caps/nvidia-cap10"},
        {"path": "/dev/nvidia-caps/nvidia-cap11"},
    ]


def test_emulated_mode_names_the_real_paths_on_the_hosts_dev_null() -> None:
    spec = build_claim_spec(
        claim_uid=CLAIM_A, slices=_slices(1), emulated=True, majors=DeviceMajors(gpu=195, caps=236)
    )
    nodes = json.loads(spec_to_json(spec))["devices"][0]["containerEdits"]["deviceNodes"]
    # no numbers: the runtime takes /dev/null's, which every node has (docs/design.md F10)
    assert nodes == [
        {"path": "/dev/nvidia0", "hostPath": "/dev/null"},
        {"path": "/dev/nvidia-caps/nvidia-cap10", "hostPath": "/dev/null"},
        {"path": "/dev/nvidia-caps/nvidia-cap11", "hostPath": "/dev/null"},
    ]
    assert all(device.container_edits.env for device in spec.devices)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"emulated": False, "majors": DeviceMajors(gpu=195, caps=236)},
        {"emulated": False},
        {"emulated": True},
        {"emulated": True, "visible_devices_env": False},
    ],
    ids=["real-with-majors", "real-no-majors", "emulated", "shim-emulated"],
)
def test_every_spec_we_write_loads_under_the_cdi_rules(tmp_path: Path, kwargs: Any) -> None:
    spec = build_claim_spec(
        claim_uid=CLAIM_A, slices=_slices(3, env=(("HF_HOME", "/m"),)), **kwargs
    )
    path = write_spec(tmp_path, spec, claim_uid=CLAIM_A)
    assert cdi_load_errors(json.loads(path.read_bytes())) == []


def test_the_mimic_loader_is_able_to_fail() -> None:
    doc = json.loads(
        spec_to_json(build_claim_spec(claim_uid=CLAIM_A, slices=_slices(1), emulated=True))
    )
    doc["devices"][0]["containerEdits"]["deviceNodes"] = [{"path": "/dev/x", "host_path": "/x"}]
    doc["cdiVersion"] = "0.3.0"
    assert cdi_load_errors(doc) == [
        "devices[0].containerEdits.deviceNodes[0]: unknown field host_path",
        "cdiVersion too low",
    ]


def test_names_ids_and_version() -> None:
    spec = build_claim_spec(claim_uid=CLAIM_A, slices=_slices(2), emulated=True)
    assert spec.kind == "instaslice.dev/mig"
    assert spec.cdi_version == CDI_VERSION == "0.5.0"
    assert [d.name for d in spec.devices] == [
        f"{CLAIM_A}-gpu-0-1g-5gb-0",
        f"{CLAIM_A}-gpu-0-1g-5gb-1",
    ]
    assert claim_cdi_device_id(CLAIM_A, "gpu-0-1g-5gb-1") == (
        f"instaslice.dev/mig={CLAIM_A}-gpu-0-1g-5gb-1"
    )
    assert (
        cdi_device_id(spec.kind, spec.devices[0].name)
        == f"instaslice.dev/mig={spec.devices[0].name}"
    )


def test_the_shim_variant_sets_no_visibility_variable_but_keeps_per_slice_ones() -> None:
    spec = build_claim_spec(
        claim_uid=CLAIM_A, slices=_slices(2), emulated=True, visible_devices_env=False
    )
    env = _inject([spec], [(0, 0), (0, 1)])
    assert VISIBLE_DEVICES_ENV not in env
    assert len(_slice_vars(env)) == 2


def test_user_env_comes_before_ours() -> None:
    spec = build_claim_spec(claim_uid=CLAIM_A, slices=_slices(1, env=(("A", "1"),)), emulated=True)
    env = spec.devices[0].container_edits.env or ()
    assert env[0] == "A=1"
    assert env[1].startswith(f"{VISIBLE_DEVICES_ENV}=")


@pytest.mark.parametrize(
    ("claim_uid", "slices", "fragment"),
    [
        ("../etc", _slices(1), "cannot name a CDI device or file"),
        ("", _slices(1), "cannot name a CDI device or file"),
        (CLAIM_A, [], "no slices to write a CDI spec for"),
        (
            CLAIM_A,
            [CdiSlice("gpu-0-", MigUuid("MIG-1"), 0, 1, 2)],
            "must start and end with a letter or digit",
        ),
        (
            CLAIM_A,
            [
                CdiSlice("gpu-0", MigUuid("MIG-1"), 0, 1, 2),
                CdiSlice("gpu-0", MigUuid("MIG-2"), 0, 3, 4),
            ],
            "CDI device names must be unique",
        ),
    ],
    ids=["path-traversal", "empty-uid", "no-slices", "bad-device-name", "duplicate-device"],
)
def test_bad_input_is_a_config_error(claim_uid: str, slices: list[CdiSlice], fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        build_claim_spec(claim_uid=claim_uid, slices=slices, emulated=True)


def test_write_is_atomic_and_replaces(tmp_path: Path) -> None:
    cdi_root = tmp_path / "cdi"
    first = build_claim_spec(claim_uid=CLAIM_A, slices=_slices(1), emulated=True)
    second = build_claim_spec(claim_uid=CLAIM_A, slices=_slices(2), emulated=True)
    path = write_spec(cdi_root, first, claim_uid=CLAIM_A)
    assert path == cdi_root / f"instaslice.dev-mig_{CLAIM_A}.json"
    assert write_spec(cdi_root, second, claim_uid=CLAIM_A) == path
    assert os.listdir(cdi_root) == [path.name]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert read_spec(cdi_root, CLAIM_A) == second


def test_a_failed_write_is_a_cdi_error_and_leaves_nothing(tmp_path: Path) -> None:
    spec = build_claim_spec(claim_uid=CLAIM_A, slices=_slices(1), emulated=True)
    (tmp_path / "cdi").write_text("not a directory")
    with pytest.raises(CdiError, match="cannot write CDI spec"):
        write_spec(tmp_path / "cdi", spec, claim_uid=CLAIM_A)
    occupied = tmp_path / "occupied"
    (occupied / f"instaslice.dev-mig_{CLAIM_A}.json").mkdir(parents=True)
    with pytest.raises(CdiError, match="cannot write CDI spec"):
        write_spec(occupied, spec, claim_uid=CLAIM_A)
    assert os.listdir(occupied) == [f"instaslice.dev-mig_{CLAIM_A}.json"]


def test_remove_is_idempotent_and_list_finds_only_ours(tmp_path: Path) -> None:
    for uid in (CLAIM_A, CLAIM_B):
        spec = build_claim_spec(claim_uid=uid, slices=_slices(1), emulated=True)
        write_spec(tmp_path, spec, claim_uid=uid)
    (tmp_path / "k8s.gpu.nvidia.com-claim_123.yaml").write_text("---\n")
    (tmp_path / f".instaslice.dev-mig_{CLAIM_A}.json.x1.tmp").write_text("{")
    (tmp_path / "instaslice.dev-mig_bad uid.json").write_text("{}")
    assert list_specs(tmp_path) == [CLAIM_A, CLAIM_B]
    assert remove_spec(tmp_path, CLAIM_A) is True
    assert remove_spec(tmp_path, CLAIM_A) is False
    assert list_specs(tmp_path) == [CLAIM_B]
    assert read_spec(tmp_path, CLAIM_A) is None
    assert list_specs(tmp_path / "absent") == []


def test_stale_temp_files_are_removed(tmp_path: Path) -> None:
    stale = tmp_path / f".instaslice.dev-mig_{CLAIM_A}.json.abc123.tmp"
    stale.write_text("{")
    other = tmp_path / ".someone-else.json.tmp"
    other.write_text("{")
    assert remove_stale_temp_specs(tmp_path) == 1
    assert not stale.exists()
    assert other.exists()
    assert remove_stale_temp_specs(tmp_path / "absent") == 0


def test_an_invalid_spec_file_is_reported(tmp_path: Path) -> None:
    (tmp_path / f"instaslice.dev-mig_{CLAIM_A}.json").write_text('{"cdiVersion": "0.5.0"}')
    with pytest.raises(CdiError, match="missing required field 'kind'"):
        read_spec(tmp_path, CLAIM_A)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Character devices:\n  1 mem\n195 nvidia-frontend\n236 nvidia-caps\n237 nvidia-uvm\n\n"
            "Block devices:\n  8 sd\n",
            DeviceMajors(gpu=195, caps=236),
        ),
        ("Character devices:\n195 nvidia\n240 nvidia-caps\n", DeviceMajors(gpu=195, caps=240)),
        ("Character devices:\n  1 mem\n\nBlock devices:\n195 nvidia\n", DeviceMajors()),
        ("", DeviceMajors()),
    ],
    ids=["proprietary", "open-module-name", "block-only", "empty"],
)
def test_proc_devices_parsing(text: str, expected: DeviceMajors) -> None:
    assert parse_proc_devices(text) == expected


def test_unreadable_proc_devices_means_unknown_majors(tmp_path: Path) -> None:
    assert read_device_majors(tmp_path / "devices") == DeviceMajors()
    (tmp_path / "devices").write_text("Character devices:\n236 nvidia-caps\n")
    assert read_device_majors(tmp_path / "devices") == DeviceMajors(caps=236)


def test_users_cannot_configure_the_variables_that_carry_visibility() -> None:
    assert VISIBLE_DEVICES_ENV in RESERVED_ENV_NAMES
    assert SLICE_ENV_PREFIX.startswith(RESERVED_ENV_PREFIX)


def test_the_shim_visibility_env_lists_every_slice_of_the_container() -> None:
    assert visibility_env(["MIG-a", "MIG-b"]) == {VISIBLE_DEVICES_ENV: "MIG-a,MIG-b"}
