"""The argument parser of a daemon: ``--version``, and every refusal in one line.

argparse answers a bad flag with the whole usage (two dozen lines for the controller) above the one
line that matters; in a container's log that line scrolls out of sight. ``DaemonParser`` prints
only that line, on stderr, with exit status 2 — as does ``refuse`` for a configuration found
unusable once the flags are parsed (a file, a directory, a kubeconfig).
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from typing import Final, NoReturn, TextIO

DISTRIBUTION: Final = "instaslice"
"""The distribution (``pyproject.toml``'s ``project.name``) whose version the daemons report."""
EXIT_REFUSED: Final = 2
"""The exit status of a refused configuration, as argparse's own for a bad flag."""


def package_version(distribution: str = DISTRIBUTION) -> str:
    """The installed distribution's version, or words saying it is not installed (a checkout
    run without ``pip install``)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return f"unknown (the {distribution} package is not installed)"


def one_line(text: str) -> str:
    """``text`` on one line: a multi-line message (a library's) joined with spaces."""
    return " ".join(text.split())


def refusal(prog: str, message: str) -> str:
    """The line that refuses a configuration: ``<prog>: error: <message>``."""
    return f"{prog}: error: {one_line(message)}\n"


def refuse(prog: str, message: str, *, stream: TextIO | None = None) -> int:
    """Write ``refusal`` to ``stream`` (stderr); the exit status to return, ``EXIT_REFUSED``."""
    out = stream or sys.stderr
    out.write(refusal(prog, message))
    out.flush()
    return EXIT_REFUSED


class DaemonParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` with ``--version`` whose errors are one line and exit status 2."""

    def __init__(self, *, prog: str, description: str) -> None:
        super().__init__(prog=prog, description=description)
        self.add_argument(
            "--version",
            action="version",
            version=f"{prog} {package_version()}",
            help="print the name and version, then exit",
        )

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_REFUSED, refusal(self.prog, f"{message}; see --help"))
