"""The committed stubs match the .proto files, and the staleness check really notices drift."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from protos import generate

REPO_ROOT = generate.REPO_ROOT


def test_committed_stubs_are_not_stale() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "protos.generate", "--check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr + result.stdout


def test_every_proto_has_its_four_stubs_committed() -> None:
    protos = generate.proto_files()
    assert protos == [
        "protos/deviceplugin/v1beta1/api.proto",
        "protos/dra/v1/api.proto",
        "protos/dra/v1beta1/api.proto",
        "protos/drahealth/v1alpha1/api.proto",
        "protos/pluginregistration/api.proto",
        "protos/podresources/v1/api.proto",
        "tests/autoscale/protos/externalgrpc/externalgrpc.proto",
        "tests/autoscale/protos/k8s/api/core/v1/generated.proto",
        "tests/autoscale/protos/k8s/apimachinery/pkg/api/resource/generated.proto",
        "tests/autoscale/protos/k8s/apimachinery/pkg/apis/meta/v1/generated.proto",
    ]
    for proto in protos:
        stem = proto.removesuffix(".proto")
        for suffix in generate.GENERATED_SUFFIXES:
            assert (REPO_ROOT / f"{stem}{suffix}").is_file(), f"{stem}{suffix}"


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    """A copy of every proto folder (sources and committed stubs) under a throw-away repository
    root."""
    for root in generate.PROTO_ROOTS:
        shutil.copytree(
            REPO_ROOT / root,
            tmp_path / root,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_copy_of_the_tree_starts_clean(tree_copy: Path) -> None:
    assert generate.stale_files(repo_root=tree_copy) == []


def test_edited_proto_makes_its_message_stubs_stale(tree_copy: Path) -> None:
    _edit(
        tree_copy / "protos/dra/v1/api.proto",
        "string name = 3;",
        "string name = 3;\n  int64 x = 4;",
    )

    stale = generate.stale_files(repo_root=tree_copy)

    assert [str(entry) for entry in stale] == [
        "protos/dra/v1/api_pb2.py (differs)",
        "protos/dra/v1/api_pb2.pyi (differs)",
    ]


def test_missing_and_orphaned_stubs_are_reported(tree_copy: Path) -> None:
    (tree_copy / "protos/pluginregistration/api_pb2_grpc.py").unlink()
    orphan = tree_copy / "protos/dra/v1alpha4/api_pb2.py"
    orphan.parent.mkdir()
    orphan.write_text("# left behind\n", encoding="utf-8")

    stale = generate.stale_files(repo_root=tree_copy)

    assert [str(entry) for entry in stale] == [
        "protos/pluginregistration/api_pb2_grpc.py (missing)",
        "protos/dra/v1alpha4/api_pb2.py (orphaned)",
    ]


def test_hand_edit_of_a_stub_is_reported(tree_copy: Path) -> None:
    stub = tree_copy / "protos/podresources/v1/api_pb2_grpc.py"
    stub.write_text(stub.read_text(encoding="utf-8") + "# edited by hand\n", encoding="utf-8")

    assert [str(e) for e in generate.stale_files(repo_root=tree_copy)] == [
        "protos/podresources/v1/api_pb2_grpc.py (differs)"
    ]


def test_another_generator_version_makes_stubs_stale(tree_copy: Path) -> None:
    """The stubs are what the locked grpcio-tools writes, version stamp included."""
    service_stub = tree_copy / "protos/dra/v1/api_pb2_grpc.py"
    text, versions = re.subn(
        r"^GRPC_GENERATED_VERSION = '[^']*'$",
        "GRPC_GENERATED_VERSION = '0.0.1'",
        service_stub.read_text(encoding="utf-8"),
        flags=re.MULTILINE,
    )
    assert versions == 1
    service_stub.write_text(text, encoding="utf-8")

    assert [str(e) for e in generate.stale_files(repo_root=tree_copy)] == [
        "protos/dra/v1/api_pb2_grpc.py (differs)"
    ]


def _locked_version(package: str) -> str:
    lock = (REPO_ROOT / "requirements/dev.lock").read_text(encoding="utf-8")
    found = re.search(rf"^{re.escape(package)}==(\S+)", lock, flags=re.MULTILINE)
    assert found, f"{package} is not pinned in requirements/dev.lock"
    return found.group(1)


def test_stubs_come_from_the_locked_grpcio_tools() -> None:
    locked = _locked_version("grpcio-tools")
    installed = importlib.metadata.version("grpcio-tools")
    assert installed == locked, (
        f"grpcio-tools {installed} is installed, the lock pins {locked}: run `make install`"
    )
    stubs = (
        path for root in generate.PROTO_ROOTS for path in (REPO_ROOT / root).rglob("*_pb2_grpc.py")
    )
    for stub in sorted(stubs):
        stamp = re.search(r"^GRPC_GENERATED_VERSION = '([^']*)'$", stub.read_text(), re.MULTILINE)
        assert stamp, stub
        assert stamp.group(1) == locked, f"{stub}: run `make protos`"


def test_write_stubs_restores_missing_and_removes_orphaned(tree_copy: Path) -> None:
    (tree_copy / "protos/dra/v1beta1/api_pb2_grpc.pyi").unlink()
    orphan = tree_copy / "protos/dra/api_pb2.py"
    orphan.write_text("# left behind\n", encoding="utf-8")

    changed = generate.write_stubs(repo_root=tree_copy)

    assert changed == ["protos/dra/v1beta1/api_pb2_grpc.pyi", "protos/dra/api_pb2.py"]
    assert not orphan.exists()
    assert generate.stale_files(repo_root=tree_copy) == []
