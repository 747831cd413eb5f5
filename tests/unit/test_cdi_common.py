"""Common CDI edits: where they come from (toolkit spec, nvidia-ctk, file, none), what is kept, and
that every variant — emulated/none, file, toolkit-derived — loads and injects as the runtime does.

Each variant is checked by our strict model and the schema stand-in of ``test_cdi``, and by the
CDI library itself through ``cdi-validate`` where that tool is installed (skipped otherwise).
"""

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from api.cdi import spec_from_json, spec_to_json
from driver.cdi import DeviceMajors, build_claim_spec, claim_cdi_device_id, write_spec
from driver.cdi_common import (
    COMMON_CDI_DEVICE_ID,
    NO_COMMON_EDITS,
    CommonEdits,
    CommonEditsChoice,
    build_common_spec,
    common_spec_path,
    host_control_nodes,
    parse_common_edits_flag,
    resolve_common_edits,
    write_common_spec,
)
from driver.errors import CdiError, ConfigError
from tests.cdivalidate import inject, validate_spec_file
from tests.unit.test_cdi import CLAIM_A, CLAIM_B, _slices, cdi_load_errors

# What `nvidia-ctk cdi generate` (toolkit 1.17, nvml mode) writes, trimmed to one GPU: spec-wide
# edits shared by every device, per-device nodes. hostPath as its driver-root transform writes it
# (pointing at /dev/null here, so injection on a machine without a GPU finds a character device).
TOOLKIT_SPEC = """---
cdiVersion: 0.5.0
containerEdits:
  deviceNodes:
  - path: /dev/nvidia-modeset
    hostPath: /dev/null
  - path: /dev/nvidia-uvm
    hostPath: /dev/null
  - path: /dev/nvidia-uvm-tools
    hostPath: /dev/null
  - path: /dev/nvidiactl
    hostPath: /dev/null
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  - NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu
  hooks:
  - args: [nvidia-cdi-hook, create-symlinks, --link,
           libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so]
    hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
  - args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]
    hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
  mounts:
  - containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    options: [ro, nosuid, nodev, bind]
  - containerPath: /usr/bin/nvidia-smi
    hostPath: /usr/bin/nvidia-smi
    options: [ro, nosuid, nodev, bind]
devices:
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
  name: "0"
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
  name: all
kind: nvidia.com/gpu
"""

FILE_SPEC = {
    "cdiVersion": "0.6.0",
    "kind": "example.com/driver",
    "containerEdits": {
        "env": ["LD_LIBRARY_PATH=/opt/nvidia/lib"],
        "deviceNodes": [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}],
        "mounts": [
            {
                "hostPath": "/opt/nvidia/lib",
                "containerPath": "/opt/nvidia/lib",
                "options": ["ro", "bind"],
            }
        ],
        "additionalGids": [44],
    },
    "devices": [{"name": "x", "containerEdits": {"env": ["X=1"]}}],
}


def _no_ctk(_: str) -> str | None:
    return None


def _toolkit_dir(tmp_path: Path, text: str = TOOLKIT_SPEC) -> Path:
    directory = tmp_path / "etc-cdi"
    directory.mkdir()
    (directory / "nvidia.yaml").write_text(text)
    return directory


def _dev_root(tmp_path: Path) -> Path:
    """A /dev stand-in whose nvidiactl and nvidia-uvm are character devices (links to /dev/null)."""
    root = tmp_path / "dev"
    root.mkdir()
    for name in ("nvidiactl", "nvidia-uvm"):
        (root / name).symlink_to("/dev/null")
    (root / "nvidia-uvm-tools").write_text("a regular file is no device node")
    return root


def _toolkit(tmp_path: Path) -> CommonEdits:
    return resolve_common_edits(
        CommonEditsChoice(mode="toolkit"),
        emulated=False,
        toolkit_spec_dirs=[tmp_path / "missing", _toolkit_dir(tmp_path)],
        find_nvidia_ctk=_no_ctk,
        dev_root=tmp_path / "no-dev",
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("auto", CommonEditsChoice(mode="auto")),
        ("toolkit", CommonEditsChoice(mode="toolkit")),
        ("none", CommonEditsChoice(mode="none")),
        (
            "file:/etc/cdi/nvidia.yaml",
            CommonEditsChoice(mode="file", path=Path("/etc/cdi/nvidia.yaml")),
        ),
    ],
    ids=["auto", "toolkit", "none", "file"],
)
def test_flag_values(value: str, expected: CommonEditsChoice) -> None:
    assert parse_common_edits_flag(value) == expected
    assert str(expected) == value


@pytest.mark.parametrize(
    "value", ["", "legacy", "file:", "FILE:/x"], ids=["empty", "unknown", "no-path", "case"]
)
def test_bad_flag_values_say_what_is_accepted(value: str) -> None:
    with pytest.raises(ValueError, match=r"--cdi-common-edits"):
        parse_common_edits_flag(value)


def test_none_and_emulated_auto_write_no_common_spec(tmp_path: Path) -> None:
    toolkit_dirs = [_toolkit_dir(tmp_path)]  # present, yet not used
    for choice, emulated in (
        (CommonEditsChoice(mode="none"), False),
        (CommonEditsChoice(mode="auto"), True),
    ):
        common = resolve_common_edits(choice, emulated=emulated, toolkit_spec_dirs=toolkit_dirs)
        assert common == NO_COMMON_EDITS
        assert common.cdi_device_ids == ()
        assert write_common_spec(tmp_path / "cdi", common) is None
    assert not (tmp_path / "cdi").exists()


def test_auto_without_toolkit_warns_and_shares_nothing(tmp_path: Path) -> None:
    common = resolve_common_edits(
        CommonEditsChoice(mode="auto"),
        emulated=False,
        toolkit_spec_dirs=[tmp_path],
        find_nvidia_ctk=_no_ctk,
    )
    assert common.edits is None
    assert common.cdi_device_ids == ()
    assert common.warning is not None
    assert "/dev/nvidiactl" in common.warning
    assert "legacy mode" in common.warning


def test_explicit_toolkit_without_toolkit_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no NVIDIA Container Toolkit CDI spec .* no nvidia-ctk"):
        resolve_common_edits(
            CommonEditsChoice(mode="toolkit"),
            emulated=False,
            toolkit_spec_dirs=[tmp_path],
            find_nvidia_ctk=_no_ctk,
        )


def test_toolkit_spec_edits_are_reused_without_its_visibility_variable(tmp_path: Path) -> None:
    common = _toolkit(tmp_path)
    assert common.mode == "toolkit"
    assert str(tmp_path / "etc-cdi" / "nvidia.yaml") in common.source
    edits = common.edits
    assert edits is not None
    assert edits.env == ("NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu",)
    assert [n.path for n in edits.device_nodes or ()] == [
        "/dev/nvidia-modeset",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidiactl",
    ]
    assert [h.args[1] for h in edits.hooks or () if h.args] == ["create-symlinks", "update-ldcache"]
    assert [m.container_path for m in edits.mounts or ()] == [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
        "/usr/bin/nvidia-smi",
    ]
    assert common.cdi_device_ids == (COMMON_CDI_DEVICE_ID,) == ("instaslice.dev/mig=common",)


def test_toolkit_spec_among_other_vendors_specs_and_broken_files(tmp_path: Path) -> None:
    directory = _toolkit_dir(tmp_path)
    (directory / "a-broken.yaml").write_text("{not: [yaml")
    (directory / "b-other.json").write_text(json.dumps(FILE_SPEC))
    (directory / "instaslice.dev-mig.json").write_text(
        json.dumps({**FILE_SPEC, "kind": "instaslice.dev/mig"})
    )
    common = resolve_common_edits(
        CommonEditsChoice(mode="auto"),
        emulated=False,
        toolkit_spec_dirs=[directory],
        find_nvidia_ctk=_no_ctk,
    )
    assert common.source.endswith("nvidia.yaml")


def test_without_a_spec_the_toolkit_generates_one(tmp_path: Path) -> None:
    ran: list[Sequence[str]] = []

    def run(argv: Sequence[str]) -> bytes:
        ran.append(argv)
        return TOOLKIT_SPEC.encode()

    common = resolve_common_edits(
        CommonEditsChoice(mode="auto"),
        emulated=False,
        toolkit_spec_dirs=[tmp_path],
        find_nvidia_ctk=lambda name: f"/usr/bin/{name}",
        run=run,
        dev_root=tmp_path / "no-dev",
    )
    assert ran == [["/usr/bin/nvidia-ctk", "cdi", "generate", "--format=json"]]
    assert common.mode == "toolkit"
    assert "nvidia-ctk cdi generate" in common.source
    assert common.edits == _toolkit(tmp_path).edits


def test_a_failing_nvidia_ctk_is_reported(tmp_path: Path) -> None:
    def run(argv: Sequence[str]) -> bytes:
        raise CdiError(f"{' '.join(argv)} exited with status 1: could not load NVML")

    with pytest.raises(CdiError, match="could not load NVML"):
        resolve_common_edits(
            CommonEditsChoice(mode="auto"),
            emulated=False,
            toolkit_spec_dirs=[tmp_path],
            find_nvidia_ctk=lambda name: name,
            run=run,
        )


def test_file_edits_keep_their_fields_and_gain_the_host_control_nodes(tmp_path: Path) -> None:
    path = tmp_path / "driver.json"
    path.write_text(json.dumps(FILE_SPEC))
    common = resolve_common_edits(
        CommonEditsChoice(mode="file", path=path), emulated=False, dev_root=_dev_root(tmp_path)
    )
    assert common.mode == "file"
    edits = common.edits
    assert edits is not None
    assert edits.additional_gids == (44,)
    nodes = {n.path: n for n in edits.device_nodes or ()}
    # The file's own nvidiactl is kept; the host's nvidia-uvm is added with its numbers
    # (/dev/null's here); nvidia-uvm-tools, not a device on this host, is not.
    assert set(nodes) == {"/dev/nvidiactl", "/dev/nvidia-uvm"}
    assert (nodes["/dev/nvidiactl"].major, nodes["/dev/nvidiactl"].minor) == (195, 255)
    null = os.stat("/dev/null").st_rdev
    assert (
        nodes["/dev/nvidia-uvm"].type,
        nodes["/dev/nvidia-uvm"].major,
        nodes["/dev/nvidia-uvm"].minor,
    ) == (
        "c",
        os.major(null),
        os.minor(null),
    )


def test_host_control_nodes_are_character_devices_only(tmp_path: Path) -> None:
    assert [n.path for n in host_control_nodes(_dev_root(tmp_path))] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
    ]
    assert host_control_nodes(tmp_path / "nothing") == ()


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "cannot read CDI spec file"),
        ("[1, 2]", "expected a mapping"),
        ("{: :", "not a JSON or YAML CDI spec"),
        (json.dumps({**FILE_SPEC, "containerEdits": {}}), "no spec-wide containerEdits"),
        (
            json.dumps({**FILE_SPEC, "containerEdits": {"env": ["A=1"], "netDevices": []}}),
            "netDevices",
        ),
        (
            json.dumps({**FILE_SPEC, "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}}),
            "empty once NVIDIA_VISIBLE_DEVICES is dropped",
        ),
        (
            json.dumps(
                {**FILE_SPEC, "containerEdits": {"hooks": [{"hookName": "sometime", "path": "/x"}]}}
            ),
            "sometime",
        ),
    ],
    ids=[
        "missing",
        "not-a-mapping",
        "bad-yaml",
        "no-edits",
        "unknown-field",
        "only-visibility",
        "bad-hook",
    ],
)
def test_unusable_files_are_config_errors_naming_the_file(
    tmp_path: Path, content: str | None, fragment: str
) -> None:
    path = tmp_path / "spec.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=fragment) as caught:
        resolve_common_edits(
            CommonEditsChoice(mode="file", path=path), emulated=False, dev_root=tmp_path
        )
    assert str(path) in str(caught.value)


def test_emulated_mode_refuses_host_device_nodes_it_cannot_have(tmp_path: Path) -> None:
    toolkit = tmp_path / "nvidia.yaml"
    toolkit.write_text(TOOLKIT_SPEC)
    with pytest.raises(ConfigError, match=r"/dev/nvidia-modeset.*emulated GPUs"):
        resolve_common_edits(CommonEditsChoice(mode="file", path=toolkit), emulated=True)
    numbered = tmp_path / "numbered.json"
    numbered.write_text(json.dumps(FILE_SPEC))
    common = resolve_common_edits(
        CommonEditsChoice(mode="file", path=numbered), emulated=True, dev_root=_dev_root(tmp_path)
    )
    # No host node is added in emulated mode (docs/design.md F10): only the file's numbered one.
    assert [n.path for n in common.edits.device_nodes or ()] == ["/dev/nvidiactl"]  # type: ignore[union-attr]


def test_common_spec_holds_the_edits_spec_wide_and_one_idempotent_device(tmp_path: Path) -> None:
    common = _toolkit(tmp_path)
    spec = build_common_spec(common)
    assert spec.kind == "instaslice.dev/mig"
    assert spec.cdi_version == "0.5.0"
    assert spec.container_edits == common.edits
    (device,) = spec.devices
    assert device.name == "common"
    assert device.container_edits.env == ("INSTASLICE_CDI_COMMON=toolkit",)
    path = write_common_spec(tmp_path / "cdi", common)
    assert (
        path == common_spec_path(tmp_path / "cdi") == tmp_path / "cdi" / "instaslice.dev-mig.json"
    )
    doc = json.loads(path.read_bytes())
    assert cdi_load_errors(doc) == []
    assert spec_from_json(path.read_bytes()) == spec


def test_additional_gids_raise_the_common_spec_version(tmp_path: Path) -> None:
    path = tmp_path / "driver.json"
    path.write_text(json.dumps(FILE_SPEC))
    common = resolve_common_edits(
        CommonEditsChoice(mode="file", path=path), emulated=False, dev_root=tmp_path
    )
    spec = build_common_spec(common)
    assert spec.cdi_version == "0.7.0"
    assert cdi_load_errors(json.loads(spec_to_json(spec))) == []


def test_no_common_spec_without_edits() -> None:
    with pytest.raises(ConfigError, match="no common CDI edits"):
        build_common_spec(NO_COMMON_EDITS)


# -- what the runtime makes of it: the CDI library itself (skipped where cdi-validate is absent) --


def _variant_dir(tmp_path: Path, variant: str) -> tuple[Path, CommonEdits, bool]:
    cdi_root = tmp_path / "cdi"
    if variant == "emulated-none":
        return cdi_root, NO_COMMON_EDITS, True
    if variant == "real-none":
        return cdi_root, NO_COMMON_EDITS, False
    if variant == "file":
        path = tmp_path / "driver.json"
        path.write_text(json.dumps(FILE_SPEC))
        return (
            cdi_root,
            resolve_common_edits(
                CommonEditsChoice(mode="file", path=path),
                emulated=False,
                dev_root=_dev_root(tmp_path),
            ),
            False,
        )
    return cdi_root, _toolkit(tmp_path), False


@pytest.mark.parametrize("variant", ["emulated-none", "real-none", "file", "toolkit"])
def test_every_variant_loads_and_injects_in_the_cdi_library(tmp_path: Path, variant: str) -> None:
    cdi_root, common, emulated = _variant_dir(tmp_path, variant)
    majors = None if emulated else DeviceMajors(gpu=195, caps=236)
    claims = {
        CLAIM_A: build_claim_spec(
            claim_uid=CLAIM_A, slices=_slices(3), emulated=emulated, majors=majors
        ),
        CLAIM_B: build_claim_spec(
            claim_uid=CLAIM_B, slices=_slices(4)[3:], emulated=emulated, majors=majors
        ),
    }
    paths = [write_spec(cdi_root, spec, claim_uid=uid) for uid, spec in claims.items()]
    common_path = write_common_spec(cdi_root, common)
    for path in [*paths, *([common_path] if common_path else [])]:
        assert cdi_load_errors(json.loads(path.read_bytes())) == []
        assert validate_spec_file(path).startswith("OK:")
    # A container holding both claims (four slices), ids as the kubelet passes them: each
    # slice's own id followed by the common one.
    ids = [
        i
        for uid, spec in claims.items()
        for device in spec.devices
        for i in (
            claim_cdi_device_id(uid, device.name.removeprefix(f"{uid}-")),
            *common.cdi_device_ids,
        )
    ]
    injected = inject(cdi_root, ids)
    _check_injection(injected, claims=claims, common=common, emulated=emulated)


def _check_injection(
    injected: dict[str, Any], *, claims: dict[str, Any], common: CommonEdits, emulated: bool
) -> None:
    env = injected["env"]
    slice_vars = sorted(e.partition("=")[2] for e in env if e.startswith("INSTASLICE_MIG_UUID_"))
    assert len(slice_vars) == 4
    # Fact 9: the visibility variable is some claim's complete list, never a single slice of it
    # (two claims in one container: the last claim's list wins, the documented limit).
    visible = [e.partition("=")[2] for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES=")][-1]
    assert visible in {
        ",".join(
            e.partition("=")[2]
            for device in spec.devices
            for e in device.container_edits.env or ()
            if e.startswith("INSTASLICE_MIG_UUID_")
        )
        for spec in claims.values()
    }
    assert visible.count(",") in (0, 2)
    nodes = [d["path"] for d in injected["linuxDevices"]]
    assert "/dev/nvidia0" in nodes
    if emulated:
        # the real paths, made from the host's /dev/null (char 1:3) by the CDI library
        assert {(d["type"], d["major"], d["minor"]) for d in injected["linuxDevices"]} == {
            ("c", 1, 3)
        }
        assert "INSTASLICE_EMULATED=true" in env
    else:
        assert "INSTASLICE_EMULATED=true" not in env
    assert len(nodes) == len(set(nodes)), "a device node injected twice"
    if common.edits is None:
        assert not injected.get("mounts")
        assert not injected.get("hooks")
        return
    assert [e for e in env if e.startswith("INSTASLICE_CDI_COMMON=")] != []
    assert "NVIDIA_VISIBLE_DEVICES=void" not in env
    assert {n.path for n in common.edits.device_nodes or ()} <= set(nodes)
    mounts = [m["destination"] for m in injected.get("mounts") or []]
    assert sorted(mounts) == sorted(m.container_path for m in common.edits.mounts or ())
    hooks = (injected.get("hooks") or {}).get("createContainer") or []
    # Applied once for the container, although four slices of two claims named the common device.
    assert len(hooks) == len(common.edits.hooks or ())
