"""Regenerate the Python stubs of the repository's gRPC APIs from their .proto files.

The .proto files live in two places (``PROTO_ROOTS``): this package, the kubelet APIs the daemons
serve and call; and ``tests/autoscale/protos``, the APIs only the test cloud provider of
``make test-autoscale`` speaks (cluster-autoscaler's externalgrpc, Kubernetes' ``Node``), kept
beside that provider so that the product holds none of them.

The generated modules are committed because the code imports them at run time and CI does not
run protoc; this module is the only way they are produced (`make protos`), and
`python -m protos.generate --check` reports stubs that no longer match their .proto files.

The protoc include root is the repository root, so a file `protos/dra/v1/api.proto` becomes the
module `protos.dra.v1.api_pb2` and the generated imports are absolute imports from there. The
.proto file paths also name the files in the protobuf descriptor pool: being distinct, they let
the two APIs whose proto package is plain `v1beta1` / `v1` live in one process with the others.
"""

from __future__ import annotations

import argparse
import filecmp
import logging
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped]

logger = logging.getLogger(__name__)

PROTOS_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROTOS_DIR.parent
PROTO_ROOTS = ("protos", "tests/autoscale/protos")
"""The folders, relative to the repository root, whose .proto files have committed stubs."""

# Every file name protoc + its plugins write for one `x.proto`; also what counts as generated
# when looking for stubs whose .proto is gone.
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


class GenerationError(RuntimeError):
    """protoc (or one of its plugins) failed."""


@dataclass(frozen=True, slots=True)
class StaleFile:
    """A generated file in the tree that differs from what the .proto files produce now."""

    path: str  # relative to the repository root, with forward slashes
    reason: str  # "differs", "missing" or "orphaned"

    def __str__(self) -> str:
        return f"{self.path} ({self.reason})"


def proto_files(*, repo_root: Path = REPO_ROOT) -> list[str]:
    """The .proto files under ``PROTO_ROOTS``, relative to the include root, sorted."""
    return sorted(
        path.relative_to(repo_root).as_posix()
        for root in PROTO_ROOTS
        for path in (repo_root / root).rglob("*.proto")
    )


def _plugin(name: str) -> str:
    """Path of a protoc plugin installed beside this interpreter (the virtualenv's bin/)."""
    candidate = Path(sys.executable).parent / name
    if candidate.is_file():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise GenerationError(f"{name} not found; install mypy-protobuf (pip install -e '.[dev]')")
    return found


def generate(out_dir: Path, *, repo_root: Path = REPO_ROOT) -> list[str]:
    """Run protoc over every .proto under ``PROTO_ROOTS``, writing the stubs below `out_dir`.

    Returns the generated files, relative to `out_dir` (which mirrors the repository root).
    """
    sources = proto_files(repo_root=repo_root)
    if not sources:
        raise GenerationError(f"no .proto files under {', '.join(PROTO_ROOTS)} in {repo_root}")
    well_known = Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto
    args = [
        "grpc_tools.protoc",
        f"--proto_path={repo_root}",
        f"--proto_path={well_known}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out=quiet:{out_dir}",
        # Threads, not asyncio: sync-only servicer and stub types keep user code simple.
        f"--mypy_grpc_out=quiet,only_sync:{out_dir}",
        *sources,
    ]
    status = protoc.main(args)
    if status != 0:
        raise GenerationError(f"protoc exited with status {status}")
    return sorted(
        path.relative_to(out_dir).as_posix()
        for path in out_dir.rglob("*")
        if path.is_file() and path.name.endswith(GENERATED_SUFFIXES)
    )


def _existing_generated(repo_root: Path) -> set[str]:
    return {
        path.relative_to(repo_root).as_posix()
        for root in PROTO_ROOTS
        for path in (repo_root / root).rglob("*")
        if path.is_file() and path.name.endswith(GENERATED_SUFFIXES)
    }


def stale_files(*, repo_root: Path = REPO_ROOT) -> list[StaleFile]:
    """Generate into a temporary directory and compare with the committed stubs."""
    with tempfile.TemporaryDirectory(prefix="protos-check-") as tmp:
        out_dir = Path(tmp)
        fresh = generate(out_dir, repo_root=repo_root)
        stale: list[StaleFile] = []
        for relative in fresh:
            committed = repo_root / relative
            if not committed.is_file():
                stale.append(StaleFile(relative, "missing"))
            elif not filecmp.cmp(out_dir / relative, committed, shallow=False):
                stale.append(StaleFile(relative, "differs"))
    stale.extend(
        StaleFile(relative, "orphaned")
        for relative in sorted(_existing_generated(repo_root) - set(fresh))
    )
    return stale


def write_stubs(*, repo_root: Path = REPO_ROOT) -> list[str]:
    """Regenerate the stubs in place; remove stubs whose .proto is gone. Returns changed paths."""
    with tempfile.TemporaryDirectory(prefix="protos-gen-") as tmp:
        out_dir = Path(tmp)
        fresh = generate(out_dir, repo_root=repo_root)
        changed: list[str] = []
        for relative in fresh:
            target = repo_root / relative
            source = out_dir / relative
            if target.is_file() and filecmp.cmp(source, target, shallow=False):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            changed.append(relative)
    for relative in sorted(_existing_generated(repo_root) - set(fresh)):
        (repo_root / relative).unlink()
        changed.append(relative)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m protos.generate",
        description="Regenerate the gRPC stubs in protos/ and tests/autoscale/protos/ from their "
        ".proto files.",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="generate into a temporary directory and exit 1 if the committed stubs are stale",
    )
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if options.check:
            stale = stale_files()
            for entry in stale:
                logger.error("stale: %s", entry)
            if stale:
                logger.error("run `make protos` and commit the result")
                return 1
            logger.info("protos: stubs are up to date")
            return 0
        for relative in write_stubs():
            logger.info("wrote %s", relative)
    except GenerationError as exc:
        logger.error("protos: %s", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
