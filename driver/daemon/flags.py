"""Command-line flags that can also come from the environment (``INSTASLICE_<FLAG>``).

Both daemons are configured the same way: a Deployment or DaemonSet sets env vars, a flag given on
the command line wins over its env var, and a bad value from either ends the process with a
one-line CLI error and exit status 2 (``parser.error``) before anything starts. These helpers hold
that mechanism; each daemon's ``settings`` module declares its own flags and checks.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

ENV_PREFIX: Final = "INSTASLICE_"
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS: Final = ("text", "json")


def env_var(dest: str) -> str:
    """The env var that sets the flag stored in ``dest`` (``node_name`` → ``INSTASLICE_NODE_NAME``)."""
    return ENV_PREFIX + dest.upper()


def add_flag(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    help_text: str,
    default: str | None,
    choices: Sequence[str] | None = None,
    upper: bool = False,
    show_default: bool = False,
) -> None:
    """Add a string flag whose help names its env var (and, with ``show_default``, its default).

    ``upper`` upper-cases the command-line value (log levels are accepted in any case).
    """
    dest = flag.removeprefix("--").replace("-", "_")
    where = f"env {env_var(dest)}; default {default!r}" if show_default else f"env {env_var(dest)}"
    parser.add_argument(
        flag,
        dest=dest,
        default=default,
        choices=choices,
        type=str.upper if upper else str,
        help=f"{help_text} ({where})",
    )


def add_log_flags(parser: argparse.ArgumentParser, *, show_default: bool = False) -> None:
    """``--log-level`` (any case) and ``--log-format``, the same in every daemon."""
    add_flag(
        parser,
        "--log-level",
        help_text="log level",
        default="INFO",
        choices=LOG_LEVELS,
        upper=True,
        show_default=show_default,
    )
    add_flag(
        parser,
        "--log-format",
        help_text="log format",
        default="text",
        choices=LOG_FORMATS,
        show_default=show_default,
    )


def parse_bool(text: str) -> bool | None:
    """``true``/``1``/``yes``/``on`` → True, their opposites → False, anything else → None."""
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    return None


def parse_args_with_env(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    *,
    environ: Mapping[str, str],
    fallbacks: Mapping[str, str] | None = None,
) -> argparse.Namespace:
    """Parse ``argv`` over env vars over the parser's built-in defaults.

    A ``--flag/--no-flag`` switch's env var must read true or false. ``fallbacks`` maps a dest to
    one more env var read (when not empty) if the dest's own is not set.
    """
    from_env: dict[str, object] = {}
    for action in parser._actions:  # argparse has no public accessor for its actions
        if not action.option_strings or action.dest == "help":
            continue
        value = environ.get(env_var(action.dest))
        if value is None:
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            switch = parse_bool(value)
            if switch is None:
                parser.error(f"{env_var(action.dest)}: {value!r} is not true or false")
            from_env[action.dest] = switch
        else:
            from_env[action.dest] = value
    for dest, name in (fallbacks or {}).items():
        if dest not in from_env and environ.get(name):
            from_env[dest] = environ[name]
    parser.set_defaults(**from_env)
    return parser.parse_args(argv)


def check_choices(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    choices: Iterable[tuple[str, Sequence[str]]],
) -> None:
    """Check values against ``(dest, choices)``: argparse checks ``choices`` only for values given
    on the command line, not for defaults taken from env vars."""
    for dest, allowed in choices:
        if getattr(args, dest) not in allowed:
            parser.error(f"{env_var(dest)}: {getattr(args, dest)!r} is not one of {allowed}")


def split_address(address: str, *, example: str) -> tuple[str, int]:
    """``host:port`` → (host, port); an empty host listens on every interface. ``ValueError``
    (naming ``example``) if bad."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"address {address!r} must look like host:port (e.g. {example})")
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104 - endpoints scraped and probed from outside
    return host, int(port_text)


def check_addresses(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    dests: Iterable[str],
    *,
    split: Callable[[str], tuple[str, int]],
) -> None:
    """Check the ``host:port`` flags stored in ``dests`` with ``split``; empty ones are off."""
    for dest in dests:
        value = getattr(args, dest)
        if value:
            try:
                split(value)
            except ValueError as exc:
                parser.error(f"--{dest.replace('_', '-')}: {exc}")
