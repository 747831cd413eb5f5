"""Command-line flags that can also come from the environment (``INSTASLICE_<FLAG>``).

Both daemons are configured the same way: a Deployment or DaemonSet sets env vars, a flag given on
the command line wins over its env var, and a bad value from either ends the process with a
one-line CLI error and exit status 2 (``parser.error``) before anything starts. These helpers hold
that mechanism; each daemon's ``settings`` module declares its own flags and checks.

Every number a flag takes is bounded (``integer_between``, ``number_between``): a value outside
the bounds is refused when the flags are parsed, never grown into (a billion worker threads) nor
found out later; the bounds are stated in the flag's help.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

ENV_PREFIX: Final = "INSTASLICE_"
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS: Final = ("text", "json")
SHOWN_CHARACTERS: Final = 24
"""A refused value is quoted up to this many characters (a flag may be handed a whole file)."""
_INTEGER: Final = re.compile(r"[+-]?[0-9]+")
_DNS_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
MAX_DNS_SUBDOMAIN: Final = 253


def env_var(dest: str) -> str:
    """The env var that sets the flag stored in ``dest`` (``node_name`` → ``INSTASLICE_NODE_NAME``)."""
    return ENV_PREFIX + dest.upper()


def shown(text: str) -> str:
    """``text`` as a refusal shows it: as it is when it is a short word, else quoted, and at most
    ``SHOWN_CHARACTERS`` of it."""
    if len(text) > SHOWN_CHARACTERS:
        return f"{text[: SHOWN_CHARACTERS // 2]!r}... ({len(text)} characters)"
    if text and text.isprintable() and not any(c.isspace() or c in "'\"" for c in text):
        return text
    return repr(text)


def integer_between(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer from ``low`` to ``high``; its digits are counted before
    they are converted, so a thousand of them are refused as quickly as one too many."""

    def integer(text: str) -> int:
        digits = text.strip()
        if not _INTEGER.fullmatch(digits):
            raise argparse.ArgumentTypeError(
                f"must be an integer between {low} and {high} (got {shown(text)})"
            )
        value = int(digits) if len(digits) <= len(str(high)) + 1 else high + 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"must be between {low} and {high} (got {shown(text)})"
            )
        return value

    return integer


def number_between(low: float, high: float) -> Callable[[str], float]:
    """An argparse ``type``: a finite number from ``low`` to ``high`` (``nan`` and ``inf`` too
    are refused)."""

    def number(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(
                f"must be a number between {low:g} and {high:g} (got {shown(text)})"
            )
        return value

    return number


def add_flag(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    help_text: str,
    default: str | float | None,
    choices: Sequence[str] | None = None,
    upper: bool = False,
) -> None:
    """Add a string flag whose help names its env var and its default (when it has one).

    ``upper`` upper-cases the value (log levels are accepted in any case).
    """
    _add(parser, flag, help_text=help_text, default=default, choices=choices,
         convert=str.upper if upper else str)  # fmt: skip


def add_number_flag(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    help_text: str,
    default: float,
    low: float,
    high: float,
    integer: bool = False,
) -> None:
    """Add a flag taking a number (an ``integer`` one) from ``low`` to ``high``, stated in its
    help."""
    convert = integer_between(int(low), int(high)) if integer else number_between(low, high)
    _add(parser, flag, help_text=help_text, default=default, convert=convert,
         limits=f"{low:g} to {high:g}")  # fmt: skip


def _add(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    help_text: str,
    default: str | float | None,
    convert: Callable[[str], object],
    choices: Sequence[str] | None = None,
    limits: str = "",
) -> None:
    dest = flag.removeprefix("--").replace("-", "_")
    notes = [limits] if limits else []
    notes.append(f"env {env_var(dest)}")
    if default not in (None, ""):
        notes.append(f"default {default!r}")
    parser.add_argument(
        flag,
        dest=dest,
        default=default,
        choices=choices,
        type=convert,
        help=f"{help_text} ({'; '.join(notes)})",
    )


def add_log_flags(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` (any case) and ``--log-format``, the same in every daemon."""
    add_flag(parser, "--log-level", help_text="log level", default="INFO", choices=LOG_LEVELS,
             upper=True)  # fmt: skip
    add_flag(parser, "--log-format", help_text="log format", default="text", choices=LOG_FORMATS)


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

    A ``--flag/--no-flag`` switch's env var must read true or false; any other env var is
    converted as its flag's value would be, and a refusal names the env var. ``fallbacks`` maps a
    dest to one more env var read (when not empty) if the dest's own is not set.
    """
    from_env: dict[str, object] = {}
    for action in parser._actions:  # argparse has no public accessor for its actions
        if not action.option_strings or action.dest in ("help", "version"):
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
            from_env[action.dest] = _converted(parser, action, value, source=env_var(action.dest))
    for dest, name in (fallbacks or {}).items():
        if dest not in from_env and environ.get(name):
            from_env[dest] = environ[name]
    parser.set_defaults(**from_env)
    return parser.parse_args(argv)


def _converted(
    parser: argparse.ArgumentParser, action: argparse.Action, value: str, *, source: str
) -> object:
    """``value`` converted by ``action``'s type now, so that a refusal names where it came from
    (argparse would convert it later as a default, naming the flag)."""
    if not callable(action.type):
        return value
    try:
        return action.type(value)
    except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
        parser.error(f"{source}: {exc}")


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


def split_address(address: str, *, example: str = ":8080") -> tuple[str, int]:
    """``host:port`` → (host, port); an empty host listens on every interface. ``ValueError``
    (naming ``example``) if bad."""
    host, sep, port_text = address.rpartition(":")
    digits = sep and port_text.isascii() and port_text.isdigit() and len(port_text) <= 5
    if not digits or int(port_text) > 65535:
        raise ValueError(f"address {shown(address)} must look like host:port (e.g. {example})")
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


def check_names(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    *,
    labels: Iterable[str] = (),
    subdomains: Iterable[str] = (),
) -> None:
    """Check the Kubernetes object names stored in ``labels`` (DNS-1123 labels: a namespace, a
    Service) and ``subdomains`` (DNS-1123 subdomains: a Node, a webhook configuration); empty ones
    are off. A name the API server refuses is refused on every try: better at start."""
    kinds = [(dest, "label", _DNS_LABEL) for dest in labels]
    kinds += [(dest, "subdomain", _DNS_SUBDOMAIN) for dest in subdomains]
    for dest, kind, pattern in kinds:
        value = str(getattr(args, dest) or "")
        if value and (len(value) > MAX_DNS_SUBDOMAIN or not pattern.fullmatch(value)):
            parser.error(
                f"--{dest.replace('_', '-')}: {shown(value)} is not a Kubernetes name "
                f"(a DNS-1123 {kind}: lower-case letters, digits and '-'"
                f"{', and dots' if kind == 'subdomain' else ''})"
            )
