"""``samples/test-pod.yaml`` proves the GPU: its script, run by bash with a stand-in ``nvidia-smi``,
passes only when the container sees exactly its one MIG slice, and skips the GPU part only for a
slice the plugin wrote as emulated."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy import manifests as m

UUID = "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"
OTHER = "MIG-0a1b2c3d-0000-5000-8000-000000000001"
GPU_LINE = "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)"


def _mig_line(uuid: str, device: int = 0) -> str:
    return f"  MIG 1g.5gb     Device  {device}: (UUID: {uuid})"


def _script() -> str:
    pod = m.one(m.render(m.SAMPLES), "Pod", "cuda-vectoradd")
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["/bin/bash", "-c"]
    return str(container["args"][0])


def _run(tmp_path: Path, env: dict[str, str], listing: str | None) -> tuple[int, str]:
    """Run the script with ``nvidia-smi -L`` printing ``listing`` (None: no nvidia-smi at all),
    a vectorAdd that passes, and a ``sleep`` that returns at once."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if listing is not None:
        (tmp_path / "listing").write_text(listing + "\n")
        (bin_dir / "nvidia-smi").write_text(f'#!/bin/sh\n[ "$1" = -L ] && cat {tmp_path}/listing\n')
    (bin_dir / "sleep").write_text("#!/bin/sh\necho slept\n")
    vector_add = tmp_path / "vectorAdd"
    vector_add.write_text("#!/bin/sh\necho 'Test PASSED'\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    vector_add.chmod(0o755)
    for name in ("cat", "grep", "printf"):
        found = shutil.which(name)
        assert found is not None
        (bin_dir / Path(found).name).symlink_to(found)
    script = _script().replace("/cuda-samples/vectorAdd", str(vector_add))
    done = subprocess.run(
        [shutil.which("bash") or "/bin/bash", "-c", script],
        env={"PATH": str(bin_dir), **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("env", "listing", "passes", "says"),
    [
        ({"NVIDIA_VISIBLE_DEVICES": UUID}, f"{GPU_LINE}\n{_mig_line(UUID)}", True, "Test PASSED"),
        ({"NVIDIA_VISIBLE_DEVICES": UUID, "INSTASLICE_EMULATED": "true"}, None, True, "emulated"),
        ({}, f"{GPU_LINE}\n{_mig_line(UUID)}", False, "no slice was injected"),
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, f"{GPU_LINE}\n{_mig_line(UUID)}", False, "not one MIG"),
        ({"NVIDIA_VISIBLE_DEVICES": f"{UUID},{OTHER}"}, GPU_LINE, False, "more than one device"),
        ({"NVIDIA_VISIBLE_DEVICES": UUID}, None, False, "no usable GPU"),
        ({"NVIDIA_VISIBLE_DEVICES": UUID}, GPU_LINE, False, "lists 0 MIG devices"),
        ({"NVIDIA_VISIBLE_DEVICES": UUID}, f"{GPU_LINE}\n{_mig_line(OTHER)}", False, "exactly"),
        (
            {"NVIDIA_VISIBLE_DEVICES": UUID},
            f"{GPU_LINE}\n{_mig_line(UUID)}\n{_mig_line(OTHER, 1)}",
            False,
            "lists 2 MIG devices",
        ),
        # Only the plugin's marker skips the GPU checks; a missing /dev/nvidiactl does not.
        ({"NVIDIA_VISIBLE_DEVICES": UUID, "INSTASLICE_EMULATED": "1"}, None, False, "no usable"),
    ],
    ids=[
        "its-slice",
        "emulated",
        "no-slice",
        "all-gpus",
        "two-slices",
        "no-nvidia-smi",
        "no-mig-device",
        "another-slice",
        "an-extra-slice",
        "marker-must-be-the-plugins",
    ],
)
def test_the_test_pod_fails_unless_it_sees_exactly_its_slice(
    tmp_path: Path, env: dict[str, str], listing: str | None, passes: bool, says: str
) -> None:
    status, output = _run(tmp_path, env, listing)
    assert (status == 0) is passes, output
    assert says in output
    assert ("FAIL:" in output) is not passes
    if passes:
        assert output.rstrip().endswith("slept")
