"""The wire bodies' ``TypedDict``s catch a misspelled key or a wrong value where a body is built.

Each snippet is type-checked by mypy with the project's own configuration (``--strict``), all of
them in one run with its cache under a temporary folder: the correctly spelled bodies pass, and
each mistake is reported on its snippet.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mypy import api as mypy_api

REPO_ROOT = Path(__file__).resolve().parents[2]

SPELLED_RIGHT = """
from api import wire

owner: wire.OwnerReference = {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}
claim: wire.ResourceClaim = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "c", "namespace": "ns", "ownerReferences": [owner]},
    "spec": {"devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": "d"}}]}},
}
lease: wire.Lease = {"apiVersion": "coordination.k8s.io/v1", "spec": {"leaseDurationSeconds": 15}}
gate: wire.JsonPatchOperation = {"op": "add", "path": "/spec/schedulingGates", "value": []}
attribute: wire.DeviceAttribute = {"int": 3}
"""

MISTAKES = {
    "ownerReference for ownerReferences": (
        'meta: wire.ObjectMeta = {"name": "c", "ownerReference": []}',
        'Extra key "ownerReference" for TypedDict "ObjectMeta"',
    ),
    "apiversion for apiVersion": (
        'lease: wire.Lease = {"apiversion": "coordination.k8s.io/v1"}',
        'Extra key "apiversion" for TypedDict "Lease"',
    ),
    "a required key left out": (
        'owner: wire.OwnerReference = {"apiVersion": "v1", "kind": "Pod", "name": "p"}',
        'Missing key "uid" for TypedDict "OwnerReference"',
    ),
    "a string where the API wants an integer": (
        'spec: wire.LeaseSpec = {"leaseDurationSeconds": "15"}',
        'TypedDict item "leaseDurationSeconds" has type "int"',
    ),
    "a JSON patch operation that does not exist": (
        'op: wire.JsonPatchOperation = {"op": "upsert", "path": "/metadata/labels"}',
        'TypedDict item "op" has type',
    ),
    "a misspelled key deep in a claim": (
        'claim: wire.ResourceClaim = {"spec": {"devices": {"requests": [{"name": "mig", '
        '"exactly": {"deviceClassname": "d"}}]}}}',
        'Extra key "deviceClassname" for TypedDict "ExactDeviceRequest"',
    ),
}


def _file_name(case: str) -> str:
    return "snippet_" + "".join(c if c.isalnum() else "_" for c in case) + ".py"


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """File name → what mypy reported on it, from one run over every snippet."""
    folder = tmp_path_factory.mktemp("wire_snippets")
    sources = {"spelled right": SPELLED_RIGHT}
    sources.update(
        {case: f"from api import wire\n\n{line}\n" for case, (line, _) in MISTAKES.items()}
    )
    paths = []
    for case, source in sources.items():
        path = folder / _file_name(case)
        path.write_text(source, encoding="utf-8")
        paths.append(str(path))
    stdout, stderr, _ = mypy_api.run(
        [
            "--config-file",
            str(REPO_ROOT / "pyproject.toml"),
            "--cache-dir",
            str(folder / ".mypy_cache"),
            "--no-error-summary",
            *paths,
        ]
    )
    assert not stderr, stderr
    found: dict[str, str] = {_file_name(case): "" for case in sources}
    for line in stdout.splitlines():
        name = Path(line.split(":", 1)[0]).name
        found[name] = found.get(name, "") + line + "\n"
    return found


def test_correctly_spelled_bodies_pass(reports: dict[str, str]) -> None:
    assert reports[_file_name("spelled right")] == ""


@pytest.mark.parametrize(
    ("case", "expected"), [(c, e) for c, (_, e) in MISTAKES.items()], ids=list(MISTAKES)
)
def test_a_mistake_in_a_body_fails_the_type_check(
    reports: dict[str, str], case: str, expected: str
) -> None:
    assert expected in reports[_file_name(case)]
