"""The commands a newcomer copies run as written: every ``e.g. make …`` that ``make help`` prints and
every ``make demo DEMO_ARGS=…`` of the README's Quick start, each through ``make`` itself, with the
virtualenv's install step taken as done. ``make demo`` with its defaults is ``test_demo``'s.

Each example is a whole demo (about 20 s): they run side by side, and the test is marked slow."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALLED = ".venv/.installed"
"""The Makefile's ``$(INSTALLED)``: taken as up to date (``make -o``), so no example reinstalls."""
HELP_EXAMPLE = re.compile(r'e\.g\. (make [a-z][a-z0-9-]*(?: [A-Z_]+=(?:"[^"]*"|[^\s")]+))*)')
README_DEMO_EXAMPLE = re.compile(r'^(make demo DEMO_ARGS="[^"]*")', re.MULTILINE)
RUN_TIMEOUT_S = 300


def _make() -> str:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    return make


def _environment() -> dict[str, str]:
    """Ours, without what a ``make test`` around us would hand a nested make."""
    inherited = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "VENV")
    return {k: v for k, v in os.environ.items() if k not in inherited}


def help_examples() -> list[str]:
    result = subprocess.run(
        [_make(), "--no-print-directory", "help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        env=_environment(),
    )
    return HELP_EXAMPLE.findall(result.stdout)


def readme_examples() -> list[str]:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    quick_start = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return README_DEMO_EXAMPLE.findall(quick_start)


def test_the_examples_are_found_and_are_demos() -> None:
    """What the slow test runs: ``make help``'s examples and the README's, found by their form."""
    in_help, in_readme = help_examples(), readme_examples()
    assert in_help, "make help shows no `e.g. make …` example"
    assert in_readme, "the README's Quick start shows no `make demo DEMO_ARGS=…` example"
    for example in in_help + in_readme:
        assert shlex.split(example)[:2] == ["make", "demo"], example


@pytest.mark.slow
def test_every_example_runs_as_written() -> None:
    examples = list(dict.fromkeys(help_examples() + readme_examples()))
    started = {
        example: subprocess.Popen(
            [_make(), "-s", "-o", INSTALLED, f"PY={sys.executable}", *shlex.split(example)[1:]],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**_environment(), "PYTHONUNBUFFERED": "1"},
            start_new_session=True,  # one process group per example, stopped as one below
        )
        for example in examples
    }
    outputs: dict[str, tuple[int, str]] = {}
    try:
        for example, process in started.items():
            text, _ = process.communicate(timeout=RUN_TIMEOUT_S)
            outputs[example] = (process.returncode, text)
    finally:
        for process in started.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)  # the demo stops its daemons on SIGTERM
                process.communicate(timeout=60)
        for _, text in outputs.values():
            if kept := re.search(r"daemon logs kept in (\S+)", text):
                shutil.rmtree(kept.group(1), ignore_errors=True)
    for example, (code, text) in outputs.items():
        assert code == 0, f"{example} exited {code}:\n{text[-4000:]}"
        assert "== After the delete: no slice left" in text, f"{example}:\n{text[-4000:]}"
