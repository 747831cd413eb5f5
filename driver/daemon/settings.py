"""The flags every daemon has, declared and checked in one place: how it reaches the API server,
where it serves ``/metrics`` and the probes, and how it logs.

Each daemon's own ``settings`` module adds these to its parser (``add_daemon_flags``) with its own
defaults (``DaemonDefaults``: ports and request rates differ) and keeps the checked values in its
``Settings`` as ``daemon`` (``daemon_settings``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from functools import partial
from typing import Final

from driver.cluster.kube import check_server_url
from driver.daemon.flags import (
    LOG_FORMATS,
    LOG_LEVELS,
    add_flag,
    add_log_flags,
    add_number_flag,
    check_addresses,
    check_choices,
    split_address,
)
from driver.errors import ConfigError

MAX_KUBE_API_QPS: Final = 100_000.0
MAX_KUBE_API_BURST: Final = 100_000


@dataclass(frozen=True, slots=True)
class DaemonDefaults:
    """What differs between the daemons in the flags they share: ports and request rates."""

    metrics_address: str
    healthz_address: str
    kube_api_qps: float
    kube_api_burst: int


@dataclass(frozen=True, slots=True)
class DaemonSettings:
    """The checked values of the flags every daemon has."""

    kubeconfig: str | None
    kube_api_url: str | None
    """A plain API server URL (the local API server); wins over ``kubeconfig``."""
    kube_api_qps: float
    """Client-side request rate limit to the API server (0: unlimited), with ``kube_api_burst``."""
    kube_api_burst: int
    metrics_address: str
    """``host:port`` of ``/metrics``; empty: not served."""
    healthz_address: str
    """``host:port`` of ``/healthz`` and ``/readyz``; empty: not served."""
    log_level: str = "INFO"
    log_format: str = "text"


def add_daemon_flags(parser: argparse.ArgumentParser, *, defaults: DaemonDefaults) -> None:
    """``--kubeconfig``, ``--kube-api-url``, ``--kube-api-qps``, ``--kube-api-burst``,
    ``--metrics-address``, ``--healthz-address``, ``--log-level`` and ``--log-format``."""
    add_flag(parser, "--kubeconfig", help_text="kubeconfig file (default: in-cluster config)",
             default=None)  # fmt: skip
    add_flag(
        parser,
        "--kube-api-url",
        help_text="plain API server URL without auth (local API server); overrides --kubeconfig",
        default=None,
    )
    add_number_flag(
        parser,
        "--kube-api-qps",
        help_text="client-side API request rate limit; 0 disables it",
        default=defaults.kube_api_qps,
        low=0,
        high=MAX_KUBE_API_QPS,
    )
    add_number_flag(
        parser,
        "--kube-api-burst",
        help_text="API requests allowed at once before --kube-api-qps applies",
        default=defaults.kube_api_burst,
        low=1,
        high=MAX_KUBE_API_BURST,
        integer=True,
    )
    add_flag(parser, "--metrics-address", help_text="host:port of /metrics; empty disables it",
             default=defaults.metrics_address)  # fmt: skip
    add_flag(
        parser,
        "--healthz-address",
        help_text="host:port of /healthz and /readyz; empty disables it",
        default=defaults.healthz_address,
    )
    add_log_flags(parser)


def daemon_settings(
    parser: argparse.ArgumentParser, args: argparse.Namespace, *, defaults: DaemonDefaults
) -> DaemonSettings:
    """The checked values of the shared flags; ``parser.error`` (exit status 2) on a bad one."""
    check_choices(parser, args, (("log_level", LOG_LEVELS), ("log_format", LOG_FORMATS)))
    check_addresses(
        parser,
        args,
        ("metrics_address", "healthz_address"),
        split=partial(split_address, example=defaults.metrics_address),
    )
    url = args.kube_api_url or None
    if url is not None:
        try:
            check_server_url(url)
        except ConfigError as exc:
            parser.error(f"--kube-api-url: {exc}")
    return DaemonSettings(
        kubeconfig=args.kubeconfig or None,
        kube_api_url=url,
        kube_api_qps=float(args.kube_api_qps),
        kube_api_burst=int(args.kube_api_burst),
        metrics_address=str(args.metrics_address),
        healthz_address=str(args.healthz_address),
        log_level=str(args.log_level),
        log_format=str(args.log_format),
    )
