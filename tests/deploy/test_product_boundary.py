"""The product ships without its test emulator: the wheel (what the images install) holds no
``localcluster``, ``bench`` or ``tests`` module, and the daemons and the ``instaslice`` command
import none of them; without ``localcluster`` the demo says in one line where it runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
NOT_SHIPPED = ("localcluster", "bench", "tests")
PRODUCT = sorted(
    p.rstrip("*")
    for p in tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]["packages"]["find"]["include"]
)
ENTRY_POINTS = ("controller.__main__", "kubeletplugin.__main__", "instaslice.cli")

# Run in a fresh interpreter: import the entry points, build the CLI's parser, and report which
# modules of the checkout's non-product packages got imported.
_IMPORTS = f"""
import importlib, sys
for name in {ENTRY_POINTS!r}:
    importlib.import_module(name)
import instaslice.cli
instaslice.cli.build_parser()
print(sorted(m for m in sys.modules if m.split(".")[0] in {NOT_SHIPPED!r}))
"""

# localcluster made unimportable, as in an installed wheel.
_WITHOUT_LOCALCLUSTER = """
import sys

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "localcluster":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
import instaslice.cli
sys.exit(instaslice.cli.main(sys.argv[1:]))
"""


def _python(code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_no_product_entry_point_imports_the_emulator_bench_or_tests() -> None:
    done = _python(_IMPORTS, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_instaslice_demo_without_localcluster_says_where_the_demo_runs_in_one_line() -> None:
    done = _python(_WITHOUT_LOCALCLUSTER, "demo", "--fast", cwd=REPO_ROOT)
    assert done.returncode == 1  # nothing wrong with the arguments: 2 is for those
    assert done.stderr.count("\n") == 1
    assert "make demo" in done.stderr
    assert "localcluster" in done.stderr
    status = _python(_WITHOUT_LOCALCLUSTER, "status", "--help", cwd=REPO_ROOT)
    assert status.returncode == 0, status.stderr  # the other commands do not need it


def test_instaslice_demo_from_a_checkout_hands_its_arguments_to_the_demo() -> None:
    done = _python(
        "import instaslice.cli, sys; sys.exit(instaslice.cli.main(sys.argv[1:]))",
        "demo",
        "--help",
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: instaslice demo")
    assert "--nodes" in done.stdout


@pytest.mark.slow
def test_the_wheel_holds_the_product_packages_only(tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(
        REPO_ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
        ),
    )
    out = tmp_path / "dist"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(out),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = out.glob("instaslice-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top_level == set(PRODUCT)
    assert not top_level & set(NOT_SHIPPED)
    for package in PRODUCT:
        assert f"{package}/__init__.py" in names
    assert "protos/dra/v1/api_pb2.py" in names
    # the test cloud provider's stubs (cluster-autoscaler's API, Kubernetes' Node) stay behind
    assert not [n for n in names if n.startswith(("protos/externalgrpc/", "protos/k8s/"))]
