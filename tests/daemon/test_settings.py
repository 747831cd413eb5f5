"""The flags every daemon has, declared once: defaults per daemon, env vars, and the checks of the
API server URL, the addresses, the request rates and the log flags."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

import pytest

from controller.settings import build_parser as controller_parser
from driver.daemon.flags import parse_args_with_env
from driver.daemon.parser import DaemonParser
from driver.daemon.settings import (
    DaemonDefaults,
    DaemonSettings,
    add_daemon_flags,
    daemon_settings,
)
from kubeletplugin.settings import build_parser as plugin_parser

DEFAULTS = DaemonDefaults(
    metrics_address=":9000", healthz_address=":9001", kube_api_qps=5.0, kube_api_burst=10
)
SHARED_FLAGS = (
    "--kubeconfig", "--kube-api-url", "--kube-api-qps", "--kube-api-burst", "--metrics-address",
    "--healthz-address", "--log-level", "--log-format",
)  # fmt: skip


def _settings(argv: list[str], environ: dict[str, str] | None = None) -> DaemonSettings:
    parser = DaemonParser(prog="instaslice-test", description="")
    add_daemon_flags(parser, defaults=DEFAULTS)
    args = parse_args_with_env(parser, argv, environ=environ or {})
    return daemon_settings(parser, args, defaults=DEFAULTS)


def test_defaults_are_the_daemon_s_own() -> None:
    assert _settings([]) == DaemonSettings(
        kubeconfig=None,
        kube_api_url=None,
        kube_api_qps=5.0,
        kube_api_burst=10,
        metrics_address=":9000",
        healthz_address=":9001",
        log_level="INFO",
        log_format="text",
    )


def test_flags_and_env_vars() -> None:
    environ = {
        "INSTASLICE_KUBE_API_URL": "http://127.0.0.1:8080",
        "INSTASLICE_KUBE_API_QPS": "0",
        "INSTASLICE_LOG_LEVEL": "debug",
        "INSTASLICE_METRICS_ADDRESS": "",
    }
    settings = _settings(["--kube-api-burst", "7", "--kubeconfig", "/etc/kube"], environ)
    assert settings == dataclasses.replace(
        _settings([]),
        kubeconfig="/etc/kube",
        kube_api_url="http://127.0.0.1:8080",
        kube_api_qps=0.0,
        kube_api_burst=7,
        metrics_address="",
        log_level="DEBUG",
    )
    assert _settings([], {"INSTASLICE_KUBE_API_URL": "", "INSTASLICE_KUBECONFIG": ""}) == (
        _settings([])
    )


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (["--kube-api-url", "127.0.0.1:6443"], {}, "--kube-api-url: API server URL"),
        ([], {"INSTASLICE_KUBE_API_URL": "ftp://x"}, "--kube-api-url: API server URL 'ftp://x'"),
        (["--metrics-address", "9400"], {}, "--metrics-address: address 9400 must look like"),
        (["--kube-api-qps", "-1"], {}, "argument --kube-api-qps: must be a number between 0"),
        (["--kube-api-qps", "1e6"], {}, "between 0 and 100000"),
        (["--kube-api-burst", "0"], {}, "argument --kube-api-burst: must be between 1 and"),
        ([], {"INSTASLICE_KUBE_API_BURST": "100001"}, "INSTASLICE_KUBE_API_BURST: must be"),
        ([], {"INSTASLICE_LOG_FORMAT": "xml"}, "INSTASLICE_LOG_FORMAT: 'xml' is not one of"),
    ],
    ids=["url-without-scheme", "url-scheme-env", "address", "negative-qps", "qps-too-high",
         "zero-burst", "burst-too-high-env", "log-format-env"],
)  # fmt: skip
def test_bad_shared_flags_are_one_line_refusals(
    capsys: pytest.CaptureFixture[str], argv: list[str], environ: dict[str, str], message: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        _settings(argv, environ)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("instaslice-test: error: ")
    assert err.count("\n") == 1
    assert message in err


PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "controller": controller_parser,
    "kubelet-plugin": plugin_parser,
}


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {option: a for a in parser._actions for option in a.option_strings}


@pytest.mark.parametrize("daemon", sorted(PARSERS))
def test_both_daemons_have_the_shared_flags_and_version(daemon: str) -> None:
    options = _options(PARSERS[daemon]())
    assert {*SHARED_FLAGS, "--version"} <= set(options)


@pytest.mark.parametrize("daemon", sorted(PARSERS))
def test_every_number_a_daemon_takes_is_bounded_and_its_help_says_so(daemon: str) -> None:
    numeric = {
        option: action
        for option, action in _options(PARSERS[daemon]()).items()
        if isinstance(action.default, int | float) and not isinstance(action.default, bool)
    }
    assert numeric, "the daemon has numeric flags"
    for option, action in numeric.items():
        convert = action.type
        assert callable(convert), option
        for beyond in ("1" + "0" * 30, "-1"):
            with pytest.raises(argparse.ArgumentTypeError, match="must be"):
                convert(beyond)
        assert " to " in (action.help or ""), option
