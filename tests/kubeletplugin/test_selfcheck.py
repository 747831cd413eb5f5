"""``instaslice-kubelet-plugin check``: one line per check, exit 1 on a failure; read-only unless
``--create-one``, which creates and destroys the smallest free slice through the prepare path."""

import io
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from driver.cdi_common import NO_COMMON_EDITS, CommonEdits, CommonEditsChoice, resolve_common_edits
from driver.errors import BackendError
from driver.gpu.backend import MigModeBackend
from driver.gpu.emulated import EmulatedGpuBackend
from driver.gpu.fake_nvml import FakeNvml
from driver.gpu.nvml import NvmlGpuBackend
from driver.mig.catalog import gpu_model
from kubeletplugin.node.setup import build_backend, resolve_cdi_common
from kubeletplugin.selfcheck import CheckEnvironment, main
from kubeletplugin.settings import Settings
from tests.gpumodels import uncatalogued_model
from tests.unit.test_cdi_common import FILE_SPEC


def _flags(tmp_path: Path, *more: str) -> list[str]:
    return [
        "--node-name",
        "node-c",
        "--gpu-backend",
        "emulated",
        "--emulated-gpus",
        "A100-40GB,H100-80GB",
        "--state-dir",
        str(tmp_path / "state"),
        "--cdi-root",
        str(tmp_path / "cdi"),
        *more,
    ]


def _env(tmp_path: Path, **changes: object) -> CheckEnvironment:
    values: dict[str, object] = {
        "build_backend": build_backend,
        "resolve_common": resolve_cdi_common,
        "toolkit_runtime_config": tmp_path / "no-toolkit" / "config.toml",
        **changes,
    }
    return CheckEnvironment(**values)  # type: ignore[arg-type]


def _check(argv: list[str], env: CheckEnvironment) -> tuple[int, list[str]]:
    out = io.StringIO()
    status = main(argv, env=env, out=out)
    return status, out.getvalue().splitlines()


def _line(lines: list[str], name: str) -> str:
    found = [line for line in lines if line[6:].startswith(f"{name}:")]
    assert len(found) == 1, (name, lines)
    return found[0]


def test_read_only_check_of_an_emulated_node_passes_and_touches_nothing(tmp_path: Path) -> None:
    status, lines = _check(_flags(tmp_path), _env(tmp_path))
    assert status == 0, lines
    assert _line(lines, "backend").startswith("PASS")
    assert "A100-SXM4-40GB" in _line(lines, "gpu 0")
    assert _line(lines, "profiles 1") == "PASS  profiles 1: 7 profiles, as the catalog's H100-80GB"
    assert _line(lines, "toolkit runtime").startswith("SKIP")
    assert _line(lines, "cdi directory").startswith("PASS")
    assert not any("create one slice" in line for line in lines)
    assert lines[-1] == "self-check passed: 0 failed, 0 warnings"
    assert list((tmp_path / "cdi").iterdir()) == []


def test_create_one_makes_and_destroys_the_smallest_free_slice(tmp_path: Path) -> None:
    state = tmp_path / "state" / "emulated-gpus.json"
    state.parent.mkdir()
    taken = EmulatedGpuBackend(node_name="node-c", spec="A100-40GB,H100-80GB", state_file=state)
    taken.create_slice(gpu_index=0, profile="1g.5gb", start=0)
    status, lines = _check([*_flags(tmp_path), "--create-one"], _env(tmp_path))
    assert status == 0, lines
    created = _line(lines, "create one slice")
    assert created.startswith(
        "PASS  create one slice: created 1g.5gb at placement start 1 on GPU 0"
    )
    spec_line = _line(lines, "slice cdi spec")
    assert spec_line.startswith("PASS")
    assert "instaslice.dev/mig=instaslice-self-check-" in spec_line
    assert _line(lines, "destroy the slice").startswith("PASS")
    # Only the instance that was there before remains; no spec is left behind.
    assert [(i.profile, i.placement.start) for i in taken.instances()] == [("1g.5gb", 0)]
    assert list((tmp_path / "cdi").iterdir()) == []


def test_create_one_names_the_common_device_when_there_are_common_edits(tmp_path: Path) -> None:
    spec = tmp_path / "driver.json"
    spec.write_text(json.dumps(FILE_SPEC))
    argv = [*_flags(tmp_path), "--create-one", "--cdi-common-edits", f"file:{spec}"]
    status, lines = _check(argv, _env(tmp_path))
    assert status == 0, lines
    assert _line(lines, "cdi common edits") == (
        f"PASS  cdi common edits: CDI spec file {spec}: 1 device nodes, 1 mounts, 0 hooks"
    )
    assert "instaslice.dev/mig=common" in _line(lines, "slice cdi spec")


def test_a_full_gpu_set_fails_create_one(tmp_path: Path) -> None:
    state = tmp_path / "state" / "emulated-gpus.json"
    state.parent.mkdir()
    full = EmulatedGpuBackend(node_name="node-c", spec="A100-40GB", state_file=state)
    full.create_slice(gpu_index=0, profile="7g.40gb", start=0)
    argv = [*_flags(tmp_path), "--create-one", "--emulated-gpus", "A100-40GB"]
    status, lines = _check(argv, _env(tmp_path))
    assert status == 1
    assert _line(lines, "create one slice") == (
        "FAIL  create one slice: no MIG-enabled GPU has a free placement"
    )
    assert lines[-1].startswith("self-check FAILED: 1 failed")


def test_an_unwritable_cdi_directory_fails_and_skips_create_one(tmp_path: Path) -> None:
    (tmp_path / "cdi").write_text("a file where the directory should be")
    status, lines = _check([*_flags(tmp_path), "--create-one"], _env(tmp_path))
    assert status == 1
    assert _line(lines, "cdi directory").startswith("FAIL  cdi directory:")
    assert _line(lines, "create one slice").startswith("SKIP")


def test_a_backend_that_does_not_start_fails_the_check(tmp_path: Path) -> None:
    def no_nvml(_: Settings) -> MigModeBackend:
        raise BackendError("NVML nvmlInit failed: NVML Shared Library Not Found (code 12)")

    status, lines = _check(_flags(tmp_path), _env(tmp_path, build_backend=no_nvml))
    assert status == 1
    assert _line(lines, "backend") == (
        "FAIL  backend: emulated GPU backend does not start: NVML nvmlInit failed: "
        "NVML Shared Library Not Found (code 12)"
    )
    # The checks that need no GPU still run.
    assert _line(lines, "cdi directory").startswith("PASS")


def _nvml_env(tmp_path: Path, fake: FakeNvml, **changes: object) -> CheckEnvironment:
    return _env(tmp_path, build_backend=lambda _: NvmlGpuBackend(nvml=fake), **changes)


def test_nvml_gpus_outside_the_catalog_and_differing_profiles_are_reported(tmp_path: Path) -> None:
    a100 = gpu_model("A100-40GB")
    trimmed = replace(a100, profiles=a100.profiles[:-1])
    fake = FakeNvml(gpus=[uncatalogued_model(), trimmed, a100], mig_enabled=[True, True, False])
    status, lines = _check(_flags(tmp_path), _nvml_env(tmp_path, fake))
    assert status == 0, lines
    assert _line(lines, "profiles 0").startswith(
        "PASS  profiles 0: 3 profiles from NVML (1g.24gb, 2g.48gb, 4g.96gb); "
        "NVIDIA Example GPU 96GB is not in the catalog"
    )
    assert "DeviceClass mig.instaslice.dev" in _line(lines, "profiles 0")
    assert _line(lines, "profiles 1") == (
        "WARN  profiles 1: NVML's profiles differ from the catalog's A100-40GB "
        "(7g.40gb: only in the catalog); NVML's are published"
    )
    assert _line(lines, "gpu 2").startswith("WARN")
    assert "nvidia-smi -i 2 -mig 1, or --mig-mode when-idle" in _line(lines, "gpu 2")


@pytest.mark.parametrize(("mig_mode", "status"), [("never", 1), ("when-idle", 0)])
def test_no_mig_gpu_at_all_fails_unless_the_plugin_would_enable_mig(
    tmp_path: Path, mig_mode: str, status: int
) -> None:
    fake = FakeNvml(gpus="2xA100-40GB", mig_enabled=False)
    got, lines = _check([*_flags(tmp_path), "--mig-mode", mig_mode], _nvml_env(tmp_path, fake))
    assert got == status
    assert "no GPU has MIG mode on" in _line(lines, "mig")
    assert "nvmlDeviceSetMigMode" not in fake.calls  # the check only reads


@pytest.mark.parametrize(
    ("config", "status", "fragment"),
    [
        ('[nvidia-container-runtime]\nmode = "cdi"\n', "PASS", "CDI mode"),
        ('[nvidia-container-runtime]\nmode = "legacy"\n', "PASS", "legacy mode"),
        ("accept-nvidia-visible-devices-as-volume-mounts = true\n", "PASS", "auto mode"),
        ("[nvidia-container-runtime\n", "WARN", "cannot read"),
    ],
    ids=["cdi", "legacy", "default-auto", "broken"],
)
def test_the_toolkit_runtime_mode_is_reported(
    tmp_path: Path, config: str, status: str, fragment: str
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(config)
    _, lines = _check(_flags(tmp_path), _env(tmp_path, toolkit_runtime_config=path))
    line = _line(lines, "toolkit runtime")
    assert line.startswith(status)
    assert fragment in line


def test_common_edits_missing_toolkit_warns_and_a_bad_file_fails(tmp_path: Path) -> None:
    def auto_without_toolkit(_: Settings) -> CommonEdits:
        return resolve_common_edits(
            CommonEditsChoice(mode="auto"),
            emulated=False,
            toolkit_spec_dirs=[tmp_path],
            find_nvidia_ctk=lambda _: None,
        )

    status, lines = _check(_flags(tmp_path), _env(tmp_path, resolve_common=auto_without_toolkit))
    assert status == 0
    assert _line(lines, "cdi common edits").startswith(
        "WARN  cdi common edits: no NVIDIA Container"
    )
    argv = [*_flags(tmp_path), "--cdi-common-edits", f"file:{tmp_path / 'missing.yaml'}"]
    status, lines = _check(argv, _env(tmp_path))
    assert status == 1
    assert "cannot read CDI spec file" in _line(lines, "cdi common edits")
    assert NO_COMMON_EDITS.cdi_device_ids == ()


def test_the_console_script_runs_check_as_a_subcommand(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kubeletplugin", "check", *_flags(tmp_path), "--create-one"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS  destroy the slice:" in done.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "kubeletplugin", "check", *_flags(tmp_path), "--mig-mode", "always"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2
    assert "mig_mode" in bad.stderr or "--mig-mode" in bad.stderr
