"""Env-backed flags: the command line wins over ``INSTASLICE_<FLAG>``, which wins over the built-in
default; bad values from either are CLI errors (exit status 2) naming the flag or env var."""

from __future__ import annotations

import argparse

import pytest

from driver.daemon.flags import (
    LOG_FORMATS,
    LOG_LEVELS,
    add_flag,
    add_log_flags,
    check_addresses,
    check_choices,
    env_var,
    parse_args_with_env,
    parse_bool,
    split_address,
)


def _parser(*, show_default: bool = False) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="daemon")
    add_flag(parser, "--node-name", help_text="node", default=None, show_default=show_default)
    add_flag(
        parser,
        "--log-level",
        help_text="level",
        default="INFO",
        choices=("DEBUG", "INFO"),
        upper=True,
        show_default=show_default,
    )
    parser.add_argument("--elect", action=argparse.BooleanOptionalAction, default=None)
    return parser


def _exit_message(
    capsys: pytest.CaptureFixture[str], argv: list[str], environ: dict[str, str]
) -> str:
    with pytest.raises(SystemExit) as exc:
        parse_args_with_env(_parser(), argv, environ=environ)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_env_var_names_the_flag_in_caps() -> None:
    assert env_var("node_name") == "INSTASLICE_NODE_NAME"


@pytest.mark.parametrize(
    ("show_default", "expected"),
    [
        (False, "node (env INSTASLICE_NODE_NAME)"),
        (True, "node (env INSTASLICE_NODE_NAME; default None)"),
    ],
    ids=["env-only", "with-default"],
)
def test_help_names_the_env_var_and_optionally_the_default(
    show_default: bool, expected: str
) -> None:
    actions = {a.dest: a for a in _parser(show_default=show_default)._actions}
    assert actions["node_name"].help == expected
    level_help = actions["log_level"].help or ""
    assert level_help.endswith("; default 'INFO')") is show_default


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        ([], {}, (None, "INFO", None)),
        (
            [],
            {"INSTASLICE_NODE_NAME": "env", "INSTASLICE_LOG_LEVEL": "DEBUG"},
            ("env", "DEBUG", None),
        ),
        (["--node-name", "flag"], {"INSTASLICE_NODE_NAME": "env"}, ("flag", "INFO", None)),
        (["--log-level", "debug"], {}, (None, "DEBUG", None)),
        ([], {"INSTASLICE_ELECT": "off"}, (None, "INFO", False)),
        ([], {"INSTASLICE_ELECT": " Yes "}, (None, "INFO", True)),
        (["--elect"], {"INSTASLICE_ELECT": "false"}, (None, "INFO", True)),
    ],
    ids=[
        "defaults",
        "env",
        "flag-wins",
        "flag-upper-cased",
        "bool-env",
        "bool-env-any-case",
        "switch-wins",
    ],
)
def test_flags_over_env_over_defaults(
    argv: list[str], environ: dict[str, str], expected: tuple[object, ...]
) -> None:
    args = parse_args_with_env(_parser(), argv, environ=environ)
    assert (args.node_name, args.log_level, args.elect) == expected


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"NODE_NAME": "fallback"}, "fallback"),
        ({"NODE_NAME": "fallback", "INSTASLICE_NODE_NAME": "own"}, "own"),
        ({"NODE_NAME": ""}, None),
    ],
    ids=["used", "own-env-wins", "empty-ignored"],
)
def test_fallback_env_var(environ: dict[str, str], expected: str | None) -> None:
    args = parse_args_with_env(_parser(), [], environ=environ, fallbacks={"node_name": "NODE_NAME"})
    assert args.node_name == expected


def test_a_switch_env_var_must_be_true_or_false(capsys: pytest.CaptureFixture[str]) -> None:
    message = _exit_message(capsys, [], {"INSTASLICE_ELECT": "maybe"})
    assert "INSTASLICE_ELECT: 'maybe' is not true or false" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("1", True), ("ON", True), ("no", False), ("0", False), ("maybe", None)],
    ids=["true", "one", "on", "no", "zero", "other"],
)
def test_parse_bool(text: str, expected: bool | None) -> None:
    assert parse_bool(text) is expected


def test_check_choices_catches_env_values_argparse_let_through(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = _parser()
    args = parse_args_with_env(parser, [], environ={"INSTASLICE_LOG_LEVEL": "LOUD"})
    with pytest.raises(SystemExit) as exc:
        check_choices(parser, args, (("log_level", ("DEBUG", "INFO")),))
    assert exc.value.code == 2
    assert "INSTASLICE_LOG_LEVEL: 'LOUD' is not one of ('DEBUG', 'INFO')" in capsys.readouterr().err


def test_check_choices_accepts_good_values() -> None:
    parser = _parser()
    args = parse_args_with_env(parser, [], environ={})
    check_choices(parser, args, (("log_level", ("DEBUG", "INFO")),))


@pytest.mark.parametrize(
    ("address", "expected"),
    [(":9400", ("0.0.0.0", 9400)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:80", ("::1", 80))],
    ids=["any", "loopback", "ipv6"],
)
def test_split_address(address: str, expected: tuple[str, int]) -> None:
    assert split_address(address, example=":1") == expected


@pytest.mark.parametrize("address", ["9400", "host:", "host:http", "h:65536"], ids=str)
def test_split_address_rejects_with_the_example(address: str) -> None:
    with pytest.raises(ValueError, match=r"must look like host:port \(e\.g\. :8080\)"):
        split_address(address, example=":8080")


def test_check_addresses_names_the_flag_and_skips_empty_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser(prog="daemon")
    args = argparse.Namespace(metrics_address="", healthz_address="nonsense")
    with pytest.raises(SystemExit) as exc:
        check_addresses(
            parser,
            args,
            ("metrics_address", "healthz_address"),
            split=lambda a: split_address(a, example=":1"),
        )
    assert exc.value.code == 2
    assert (
        "--healthz-address: address 'nonsense' must look like host:port" in capsys.readouterr().err
    )


@pytest.mark.parametrize("show_default", [False, True], ids=["env-only", "with-default"])
def test_log_flags_are_the_same_in_every_daemon(show_default: bool) -> None:
    parser = argparse.ArgumentParser(prog="daemon")
    add_log_flags(parser, show_default=show_default)
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    assert (actions["log_level"].choices, actions["log_format"].choices) == (
        LOG_LEVELS,
        LOG_FORMATS,
    )
    assert actions["log_format"].help == (
        "log format (env INSTASLICE_LOG_FORMAT; default 'text')"
        if show_default
        else "log format (env INSTASLICE_LOG_FORMAT)"
    )
    defaults = parse_args_with_env(parser, [], environ={})
    assert (defaults.log_level, defaults.log_format) == ("INFO", "text")
    given = parse_args_with_env(
        parser, ["--log-level", "warning"], environ={"INSTASLICE_LOG_FORMAT": "json"}
    )
    assert (given.log_level, given.log_format) == ("WARNING", "json")
