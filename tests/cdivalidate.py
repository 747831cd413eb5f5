"""The CDI library itself (``tags.cncf.io/container-device-interface`` v1.1.0, what containerd and
CRI-O use), through the ``cdi-validate`` tool ``shared/realstack/build-control-plane.sh`` builds.

Tests that use it skip, saying why, where the tool is absent (CI); our own model tests run
everywhere. ``CDI_VALIDATE`` names another binary.
"""

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

CDI_VALIDATE = Path(os.environ.get("CDI_VALIDATE", "/tmp/cdi-validate/bin/cdi-validate"))


def cdi_validate() -> Path:
    """The tool's path; skips the calling test when it is not there."""
    if not os.access(CDI_VALIDATE, os.X_OK):
        pytest.skip(
            f"{CDI_VALIDATE} (CDI library v1.1.0 validator, built by "
            "shared/realstack/build-control-plane.sh) is not installed here"
        )
    return CDI_VALIDATE


def validate_spec_file(path: Path) -> str:
    """``cdi-validate --spec``: the library's ``ReadSpec``; its ``OK: …`` line, or fail the test."""
    done = subprocess.run(
        [str(cdi_validate()), "--spec", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"CDI library refuses {path}: {done.stdout}{done.stderr}"
    return done.stdout.strip()


def inject(directory: Path, device_ids: list[str]) -> dict[str, Any]:
    """Load ``directory`` into a CDI cache and inject ``device_ids`` into an empty OCI spec:
    ``env``, ``linuxDevices``, ``mounts``, ``hooks`` as the library leaves them."""
    done = subprocess.run(
        [str(cdi_validate()), str(directory), *device_ids],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"CDI injection failed: {done.stderr}{done.stdout}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result
