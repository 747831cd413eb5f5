"""The dependency locks agree with pyproject.toml and with each other, and pin with hashes."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO_ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
LOCKS = ("product.lock", "dev.lock", "build.lock")
_PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^ ;\\]+)")


def _pins(lock: str) -> dict[str, str]:
    """Package → pinned version; each pin must carry at least one hash."""
    text = (REPO_ROOT / "requirements" / lock).read_text(encoding="utf-8")
    pins: dict[str, str] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        found = _PIN.match(block)
        if found is None:
            continue
        assert "--hash=sha256:" in block, f"{lock}: {found.group(1)} has no hash"
        pins[canonicalize_name(found.group(1))] = found.group(2)
    assert pins, f"{lock} pins nothing"
    return pins


def _satisfied(requirements: list[str], pins: dict[str, str], lock: str) -> None:
    for line in requirements:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is not in requirements/{lock}: run `make lock`"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"requirements/{lock} pins {name}=={pins[name]}, pyproject.toml asks {requirement}"
        )


def test_product_lock_holds_every_dependency_of_the_project() -> None:
    _satisfied(PYPROJECT["project"]["dependencies"], _pins("product.lock"), "product.lock")


def test_dev_lock_holds_the_dev_tools_and_pip() -> None:
    pins = _pins("dev.lock")
    _satisfied(PYPROJECT["project"]["optional-dependencies"]["dev"], pins, "dev.lock")
    assert "pip" in pins, "the virtualenv's pip is installed from the lock too"


@pytest.mark.parametrize("lock", ["product.lock", "build.lock"])
def test_every_pin_agrees_with_the_dev_lock(lock: str) -> None:
    """The tests run on exactly the versions the image ships (and builds with)."""
    dev = _pins("dev.lock")
    differ = {
        name: (version, dev.get(name))
        for name, version in _pins(lock).items()
        if dev.get(name) != version
    }
    assert not differ, f"{lock} and dev.lock disagree (name: ({lock}, dev.lock)): {differ}"


def test_installs_use_the_locks_with_hashes() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    assert "--require-hashes -r requirements/dev.lock" in makefile
    dockerfile = (REPO_ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert "--require-hashes --no-deps -r requirements/product.lock" in dockerfile
    assert "--require-hashes --no-deps -r requirements/build.lock" in dockerfile
    ci = (REPO_ROOT / ".ci/run").read_text(encoding="utf-8")
    assert "pip install" not in ci, ".ci/run installs through `make install` only"


def test_dev_lock_holds_the_plots_extra_and_the_product_lock_leaves_it_out() -> None:
    """``make install`` gives ``instaslice simulate --plot`` its matplotlib; the images, built from
    product.lock, never carry it."""
    plots = PYPROJECT["project"]["optional-dependencies"]["plots"]
    _satisfied(plots, _pins("dev.lock"), "dev.lock")
    product = _pins("product.lock")
    shipped = [
        Requirement(line).name
        for line in plots
        if canonicalize_name(Requirement(line).name) in product
    ]
    assert not shipped, f"product.lock (the images) pins {shipped}, which only --plot needs"
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    assert "--extra dev --extra plots" in makefile, (
        "`make lock` resolves the plots extra into dev.lock"
    )
