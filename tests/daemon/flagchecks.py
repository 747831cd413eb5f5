"""What every daemon's tests check alike: a numeric flag's bounds, and a process's answers to
``--version`` and to a configuration it refuses (one line on stderr, exit status 2)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from driver.daemon.parser import package_version

ROOT = Path(__file__).resolve().parents[2]


def run_module(module: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``python -m <module> <argv>`` from the repository root, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", module, *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def assert_version(done: subprocess.CompletedProcess[str], *, prog: str) -> None:
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{prog} {package_version()}\n", "")


def assert_refused_in_one_line(
    done: subprocess.CompletedProcess[str], *, prog: str, line: str
) -> None:
    """Exit status 2 and one line on stderr that starts ``<prog>: error: <line>``."""
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"{prog}: error: {line}"), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stdout == ""


class NumericFlag(NamedTuple):
    """A numeric flag, its lowest and highest value, and a value just beyond each."""

    flag: str
    low: str
    high: str
    below: str
    above: str


def assert_bounded(
    parser: argparse.ArgumentParser,
    parse: Callable[[list[str]], object],
    numeric: NumericFlag,
    *,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The flag takes both its bounds, its help states them, and ``parse`` refuses each value
    beyond them in one line naming the flag."""
    flag, low, high, below, above = numeric
    (action,) = [a for a in parser._actions if flag in a.option_strings]
    assert callable(action.type)
    assert [action.type(low), action.type(high)] == [float(low), float(high)]
    assert f"({low} to {high};" in (action.help or "")
    for value in (below, above):
        with pytest.raises(SystemExit) as exc:
            parse([flag, value])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {flag}: must be " in err
        assert err.count("\n") == 1
