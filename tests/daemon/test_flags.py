"""Env-backed flags: the command line wins over ``INSTASLICE_<FLAG>``, which wins over the built-in
default; bad values from either are CLI errors (exit status 2) naming the flag or env var, and every
number is bounded."""

from __future__ import annotations

import argparse

import pytest

from driver.daemon.flags import (
    LOG_FORMATS,
    LOG_LEVELS,
    add_flag,
    add_log_flags,
    add_number_flag,
    check_addresses,
    check_choices,
    check_names,
    env_var,
    integer_between,
    number_between,
    parse_args_with_env,
    parse_bool,
    shown,
    split_address,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="daemon")
    add_flag(parser, "--node-name", help_text="node", default=None)
    add_flag(
        parser,
        "--log-level",
        help_text="level",
        default="INFO",
        choices=("DEBUG", "INFO"),
        upper=True,
    )
    parser.add_argument("--elect", action=argparse.BooleanOptionalAction, default=None)
    add_number_flag(
        parser, "--workers", help_text="threads", default=4, low=1, high=256, integer=True
    )
    add_number_flag(parser, "--poll", help_text="seconds", default=0.5, low=0.1, high=60)
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


def test_help_names_the_env_var_the_default_and_the_bounds() -> None:
    helps = {a.dest: a.help for a in _parser()._actions}
    assert helps["node_name"] == "node (env INSTASLICE_NODE_NAME)"
    assert helps["log_level"] == "level (env INSTASLICE_LOG_LEVEL; default 'INFO')"
    assert helps["workers"] == "threads (1 to 256; env INSTASLICE_WORKERS; default 4)"
    assert helps["poll"] == "seconds (0.1 to 60; env INSTASLICE_POLL; default 0.5)"


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
    """String flags and switches; numbers below."""
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


@pytest.mark.parametrize(
    "address", ["9400", "host:", "host:http", "h:65536", "h:" + "9" * 5000, "h:٣"], ids=str
)
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
    assert "--healthz-address: address nonsense must look like host:port" in capsys.readouterr().err


def test_log_flags_are_the_same_in_every_daemon() -> None:
    parser = argparse.ArgumentParser(prog="daemon")
    add_log_flags(parser)
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    assert (actions["log_level"].choices, actions["log_format"].choices) == (
        LOG_LEVELS,
        LOG_FORMATS,
    )
    assert actions["log_format"].help == "log format (env INSTASLICE_LOG_FORMAT; default 'text')"
    defaults = parse_args_with_env(parser, [], environ={})
    assert (defaults.log_level, defaults.log_format) == ("INFO", "text")
    given = parse_args_with_env(
        parser, ["--log-level", "warning"], environ={"INSTASLICE_LOG_FORMAT": "json"}
    )
    assert (given.log_level, given.log_format) == ("WARNING", "json")


# -- bounded numbers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1", 1), ("256", 256), (" 48 ", 48), ("+7", 7)],
    ids=["low", "high", "spaces", "plus"],
)
def test_integer_between_accepts_integers_within_bounds(text: str, expected: int) -> None:
    assert integer_between(1, 256)(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "must be between 1 and 256 (got 0)"),
        ("257", "must be between 1 and 256 (got 257)"),
        ("1000000000", "must be between 1 and 256 (got 1000000000)"),
        ("9" * 5000, "must be between 1 and 256 (got '999999999999'... (5000 characters))"),
        ("-3", "must be between 1 and 256 (got -3)"),
        ("4.5", "must be an integer between 1 and 256 (got 4.5)"),
        ("", "must be an integer between 1 and 256 (got '')"),
        ("four", "must be an integer between 1 and 256 (got four)"),
    ],
    ids=["below", "above", "a-billion", "thousands-of-digits", "negative", "fraction", "empty",
         "word"],
)  # fmt: skip
def test_integer_between_refuses_in_one_line(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        integer_between(1, 256)(text)
    assert str(refused.value) == message


@pytest.mark.parametrize("text", ["0.05", "61", "nan", "inf", "-inf", "1e309", "x", ""], ids=str)
def test_number_between_refuses_out_of_bounds_and_non_finite(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be a number between 0\.1 and 60"):
        number_between(0.1, 60)(text)


def test_number_between_accepts_its_bounds() -> None:
    assert [number_between(0.1, 60)(t) for t in ("0.1", "60", "1e1")] == [0.1, 60.0, 10.0]


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        ([], {}, (4, 0.5)),
        ([], {"INSTASLICE_WORKERS": "8", "INSTASLICE_POLL": "2"}, (8, 2.0)),
        (["--workers", "16"], {"INSTASLICE_WORKERS": "8"}, (16, 0.5)),
    ],
    ids=["defaults", "env", "flag-wins"],
)
def test_numbers_over_env_over_defaults(
    argv: list[str], environ: dict[str, str], expected: tuple[int, float]
) -> None:
    args = parse_args_with_env(_parser(), argv, environ=environ)
    assert (args.workers, args.poll) == expected


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (["--workers", "0"], {}, "argument --workers: must be between 1 and 256 (got 0)"),
        ([], {"INSTASLICE_WORKERS": "1000000000"}, "INSTASLICE_WORKERS: must be between 1 and"),
        ([], {"INSTASLICE_POLL": "nan"}, "INSTASLICE_POLL: must be a number between 0.1 and 60"),
        (["--workers", "8"], {"INSTASLICE_WORKERS": "x"}, "INSTASLICE_WORKERS: must be an"),
    ],
    ids=["flag", "env", "env-nan", "env-refused-even-when-the-flag-wins"],
)
def test_a_number_out_of_bounds_is_refused_naming_where_it_came_from(
    capsys: pytest.CaptureFixture[str], argv: list[str], environ: dict[str, str], message: str
) -> None:
    assert message in _exit_message(capsys, argv, environ)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("48", "48"), ("", "''"), ("a b", "'a b'"), ("x" * 30, "'xxxxxxxxxxxx'... (30 characters)")],
    ids=["word", "empty", "spaces", "long"],
)
def test_shown(text: str, expected: str) -> None:
    assert shown(text) == expected


# -- Kubernetes names -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("namespace", "node", "message"),
    [
        ("Foo", "n", "--namespace: Foo is not a Kubernetes name (a DNS-1123 label"),
        ("a.b", "n", "--namespace: a.b is not a Kubernetes name"),
        ("ns", "node_1", "--node: node_1 is not a Kubernetes name (a DNS-1123 subdomain"),
        ("ns", "n" * 254, "(254 characters) is not a Kubernetes name"),
        ("-ns", "n", "--namespace: -ns is not"),
    ],
    ids=["upper-case", "dot-in-label", "underscore", "too-long", "leading-dash"],
)
def test_check_names_refuses_what_the_api_server_would(
    capsys: pytest.CaptureFixture[str], namespace: str, node: str, message: str
) -> None:
    args = argparse.Namespace(namespace=namespace, node=node)
    with pytest.raises(SystemExit) as exc:
        check_names(_parser(), args, labels=("namespace",), subdomains=("node",))
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_check_names_accepts_names_and_skips_empty_ones() -> None:
    args = argparse.Namespace(namespace="instaslice-system", node="gpu-1.example.com", service="")
    check_names(_parser(), args, labels=("namespace", "service"), subdomains=("node",))
