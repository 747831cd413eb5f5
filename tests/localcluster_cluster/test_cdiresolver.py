"""What a container runtime makes of CDI names: unknown names fail, env is appended per device and
the last setting of a variable wins (docs/design.md F9)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localcluster.cluster.cdiresolver import CdiResolutionError, CdiResolver


def _spec(directory: Path, name: str, devices: dict[str, str], common: str | None = None) -> None:
    spec: dict[str, object] = {
        "cdiVersion": "0.6.0",
        "kind": "instaslice.dev/mig",
        "devices": [
            {"name": d, "containerEdits": {"env": [f"NVIDIA_VISIBLE_DEVICES={v}"]}}
            for d, v in devices.items()
        ],
    }
    if common is not None:
        spec["containerEdits"] = {"env": [common]}
    (directory / f"{name}.json").write_text(json.dumps(spec))


def test_last_device_setting_a_variable_wins(tmp_path: Path) -> None:
    _spec(tmp_path, "a", {"claim-a": "MIG-A"}, common="COMMON=1")
    _spec(tmp_path, "b", {"claim-b": "MIG-B"})
    resolver = CdiResolver([tmp_path])
    assert resolver.environment(["instaslice.dev/mig=claim-a", "instaslice.dev/mig=claim-b"]) == [
        "COMMON=1",
        "NVIDIA_VISIBLE_DEVICES=MIG-A",
        "NVIDIA_VISIBLE_DEVICES=MIG-B",
    ]


def test_unknown_device_fails(tmp_path: Path) -> None:
    _spec(tmp_path, "a", {"claim-a": "MIG-A"})
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(CdiResolutionError, match=r"instaslice\.dev/mig=gone"):
        CdiResolver([tmp_path]).environment(
            ["instaslice.dev/mig=claim-a", "instaslice.dev/mig=gone"]
        )
