"""The generated .pyi stubs give real types: code using them is checked by `mypy --strict`.

The round-trip test module (a servicer subclass and stub calls) must be clean, and a module that
passes the wrong request type must be rejected; if the stubs degraded to `Any` the second half
would fail.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from protos import generate

REPO_ROOT = generate.REPO_ROOT

_WRONG_REQUEST = """\
import grpc

from protos.dra.v1 import api_pb2, api_pb2_grpc


def call(channel: grpc.Channel) -> None:
    stub = api_pb2_grpc.DRAPluginStub(channel)
    stub.NodePrepareResources(api_pb2.NodeUnprepareResourcesRequest())
"""


def test_mypy_strict_accepts_correct_use_and_rejects_a_wrong_request(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong_request.py"
    wrong.write_text(_WRONG_REQUEST, encoding="utf-8")
    correct = REPO_ROOT / "tests/protos/test_unix_socket_round_trip.py"

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-error-summary",
            f"--cache-dir={tmp_path / 'mypy-cache'}",
            str(correct),
            str(wrong),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1, result.stdout + result.stderr
    assert errors[0].startswith(f"{wrong}:8: error:")
    assert "NodePrepareResourcesRequest" in errors[0]
    assert errors[0].endswith("[arg-type]")
