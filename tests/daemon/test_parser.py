"""A daemon's parser: ``--version`` from the installed package, and every refusal one line on
stderr with exit status 2 — no usage dump above it."""

from __future__ import annotations

import io
import tomllib
from pathlib import Path

import pytest

from driver.daemon.parser import DaemonParser, package_version, refusal, refuse

REPO_ROOT = Path(__file__).resolve().parents[2]


def _parser() -> DaemonParser:
    parser = DaemonParser(prog="instaslice-test", description="a daemon under test")
    parser.add_argument("--workers", type=int, default=1)
    return parser


def test_the_version_is_the_installed_distribution_s() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert package_version() == project["version"]


def test_a_distribution_that_is_not_installed_says_so() -> None:
    assert package_version("instaslice-not-installed") == (
        "unknown (the instaslice-not-installed package is not installed)"
    )


def test_version_prints_name_and_version_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["--version"])
    assert exc.value.code == 0
    out, err = capsys.readouterr()
    assert (out, err) == (f"instaslice-test {package_version()}\n", "")


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--bogus"], "instaslice-test: error: unrecognized arguments: --bogus; see --help\n"),
        (
            ["--workers", "x"],
            "instaslice-test: error: argument --workers: invalid int value: 'x'; see --help\n",
        ),
        (
            ["--workers"],
            "instaslice-test: error: argument --workers: expected one argument; see --help\n",
        ),
    ],
    ids=["unknown-flag", "bad-value", "missing-value"],
)
def test_a_bad_flag_is_one_line_on_stderr_with_status_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(argv)
    assert exc.value.code == 2
    assert capsys.readouterr() == ("", line)


def test_a_refusal_is_one_line_even_for_a_multi_line_message() -> None:
    assert refusal("d", "first\n  second\n") == "d: error: first second\n"
    stream = io.StringIO()
    assert refuse("d", "cannot read\nthe file", stream=stream) == 2
    assert stream.getvalue() == "d: error: cannot read the file\n"
