"""What every ``instaslice`` command checks before it starts work: arguments, files, connections.

Every refusal is one line naming the problem, on stderr, with a non-zero exit status: ``2`` when the
command line itself is wrong (what argparse rejects in ``CommandParser``, and ``ArgumentError``: a
value out of its range, flags that do not combine or do not apply), ``1`` when what it names cannot
be used (a file, the cluster) or the work fails. Files are checked for what they are before they
are opened (a FIFO would block the open, a device could stream forever) and for their size before
they are read.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

from driver.errors import ConfigError
from instaslice.files import open_regular_file

MAX_KUBECONFIG_BYTES = 4 * 1024 * 1024
"""A kubeconfig is read whole by the Kubernetes client: files larger than this are refused."""


ARGUMENT_ERROR_STATUS = 2
"""The exit status of a wrong command line, argparse's own."""


class ArgumentError(ConfigError):
    """The command line itself is wrong, whatever the files and the cluster hold: a value out of
    its range, flags that do not combine, a flag the chosen mode ignores. Refused as argparse
    refuses: exit status 2."""


@contextmanager
def command_line_checks() -> Iterator[None]:
    """Inside, every ``ConfigError`` is about the command line alone: it leaves as an
    ``ArgumentError``. For checks that read no file and no cluster (parsing a flag's value,
    checking flags together)."""
    try:
        yield
    except ArgumentError:
        raise
    except ConfigError as exc:
        raise ArgumentError(str(exc)) from exc


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose refusals are one line: the problem and where help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            ARGUMENT_ERROR_STATUS, f"{self.prog}: {one_line(message)} (see {self.prog} --help)\n"
        )


def package_version() -> str:
    """``instaslice X.Y.Z`` from the installed package's metadata."""
    try:
        return f"instaslice {metadata.version('instaslice')}"
    except metadata.PackageNotFoundError:
        return "instaslice (version unknown: the package is not installed)"


def number_between(
    low: float, high: float, *, low_included: bool = True, what: str = "a number"
) -> Callable[[str], float]:
    """An argparse ``type``: a finite float from ``low`` to ``high`` (``low`` itself only when
    ``low_included``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} expected, got {shown(text)}") from None
        above_low = value >= low if low_included else value > low
        if not (math.isfinite(value) and above_low and value <= high):
            bounds = f"from {low:g} to" if low_included else f"more than {low:g} and at most"
            raise argparse.ArgumentTypeError(f"must be {bounds} {high:g}, got {shown(text)}")
        return value

    return parse


def integer_between(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer from ``low`` to ``high`` (digits counted first, so that a
    thousand of them are refused without converting them)."""

    def parse(text: str) -> int:
        digits = text.strip().lstrip("+-")
        if not digits.isdigit() or not digits.isascii():
            raise argparse.ArgumentTypeError(f"an integer expected, got {shown(text)}")
        value = int(text) if len(digits) <= len(str(high)) + 1 else high + 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low:,} to {high:,}, got {shown(text)}")
        return value

    return parse


def shown(text: str) -> str:
    """``text`` as a refusal quotes it: at most a few dozen characters."""
    return text if len(text) <= 24 else f"{text[:12]}… ({len(text)} characters)"


def check_regular_file(path: Path, *, what: str, max_bytes: int | None = None) -> None:
    """``ConfigError`` unless ``path`` is a readable regular file (of at most ``max_bytes``)."""
    try:
        with open_regular_file(path) as stream:
            size = os.fstat(stream.fileno()).st_size
            if max_bytes is not None and size > max_bytes:
                raise ConfigError(
                    f"{what} {path} is {size:,} bytes; at most {max_bytes:,} are read"
                )
            stream.read(1)  # a file that opens can still refuse reads (EIO, some /proc files)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc


def kubeconfig_files(kubeconfig: str | None) -> Iterator[Path]:
    """The kubeconfig files the Kubernetes client would read: ``--kubeconfig``, else each file of
    ``$KUBECONFIG``, else ``~/.kube/config`` if it exists (none in a pod: in-cluster config)."""
    if kubeconfig is not None:
        yield Path(kubeconfig)
        return
    listed = os.environ.get("KUBECONFIG")
    if listed:  # the client skips the files of the list that do not exist
        paths = (Path(p).expanduser() for p in listed.split(os.pathsep) if p)
        yield from (p for p in paths if p.exists())
        return
    default = Path("~/.kube/config").expanduser()
    if default.exists():
        yield default


def check_kubeconfig(kubeconfig: str | None) -> None:
    """``ConfigError`` unless every kubeconfig file the client would read is a readable regular
    file of a sensible size."""
    for path in kubeconfig_files(kubeconfig):
        check_regular_file(path, what="kubeconfig", max_bytes=MAX_KUBECONFIG_BYTES)


def api_server_url(text: str) -> str:
    """An argparse ``type``: an ``http(s)://HOST[:PORT]`` URL, as the cluster client checks it."""
    from driver.cluster.kube import check_server_url  # noqa: PLC0415 - imports kubernetes

    try:
        check_server_url(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def connection_flag_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the connection flags together (None: nothing)."""
    if args.kube_api_url is not None and (args.kubeconfig is not None or args.context is not None):
        return "--kube-api-url and --kubeconfig/--context do not combine; give one way to connect"
    return None


def connect_cluster(args: argparse.Namespace) -> Any:
    """A ``ClusterApi`` for the connection flags, checked first: flags that do not combine, a
    kubeconfig that is not a readable regular file of a sensible size, a URL that is not one."""
    from driver.cluster.kube import connect  # noqa: PLC0415 - imports kubernetes only when used
    from driver.cluster.throttle import ClientSettings  # noqa: PLC0415

    problem = connection_flag_problem(args)
    if problem is not None:
        raise ArgumentError(problem)
    if args.kube_api_url is None:
        check_kubeconfig(args.kubeconfig)
    return connect(
        kubeconfig=args.kubeconfig,
        context=args.context,
        url=args.kube_api_url,
        settings=ClientSettings(user_agent="instaslice-cli"),
    )


def refuse(command: str, exc: Exception) -> int:
    """Print ``exc`` as the one line of ``instaslice COMMAND``'s refusal; the exit status: 2 for an
    ``ArgumentError`` (with where help is, as argparse says it), else 1."""
    prog = f"instaslice {command}"
    if isinstance(exc, ArgumentError):
        print(f"{prog}: {one_line(str(exc))} (see {prog} --help)", file=sys.stderr)
        return ARGUMENT_ERROR_STATUS
    print(f"{prog}: {one_line(str(exc))}", file=sys.stderr)
    return 1


def one_line(text: str) -> str:
    """``text`` on one line: a library's message over several lines (a YAML parser's) joined."""
    return "; ".join(part.strip() for part in text.strip().splitlines() if part.strip())
