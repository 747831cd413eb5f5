"""Command-line flags of ``instaslice-controller``; every flag can also come from the environment.

The Deployment sets most of these through env vars (``INSTASLICE_<FLAG>``, e.g.
``INSTASLICE_LEADER_ELECT=true``); a flag given on the command line wins over its env var. Bad
values end the process with a one-line CLI error and exit status 2, before anything is started.
The flags every daemon has (API server, ``/metrics`` and probe addresses, logging) come from
``driver.daemon.settings``; this module declares the controller's own.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from api.names import SYSTEM_NAMESPACE
from controller.webhook.certificates import CertMode
from driver.daemon import flags
from driver.daemon.flags import add_flag, add_number_flag, env_var
from driver.daemon.parser import DaemonParser
from driver.daemon.paths import check_writable_directory
from driver.daemon.settings import DaemonDefaults, DaemonSettings, add_daemon_flags, daemon_settings
from driver.placement import DEFAULT_POLICY, POLICIES

PROG: Final = "instaslice-controller"
CERT_MODES: Final = tuple(mode.value for mode in CertMode)

DEFAULT_WEBHOOK_PORT: Final = 9443
DEFAULT_WEBHOOK_CERT_DIR: Final = "/var/run/instaslice/webhook-certs"
DEFAULT_WEBHOOK_SERVICE: Final = "instaslice-webhook"
DEFAULT_WEBHOOK_CONFIG_NAME: Final = "instaslice-pod-gate"
DEFAULT_WORKERS: Final = 48
"""Pods placed at once: each waits on API round trips most of its time (real 1.36 control plane,
1,000-pod burst: create -> ungated p50 6.9 s / p99 13.2 s with 16 workers, 3.7 s / 4.3 s with 48)."""
MAX_WORKERS: Final = 256
"""Each worker is a thread with its own API connection (``connection_pool_maxsize``)."""
DEFAULTS: Final = DaemonDefaults(
    metrics_address=":8080",
    healthz_address=":8081",
    kube_api_qps=500.0,
    kube_api_burst=1000,
)
"""The request rate: four writes per pod (finalizer, allocation, nominated node, gate) at well
over 100 pods/s."""
ALLOCATION_MODES: Final = ("controller", "scheduler")
DEFAULT_HANDOFF_AFTER: Final = 120.0
"""Seconds a DRA pod may wait for capacity (or to be bound) before kube-scheduler gets it."""
DEFAULT_STARVATION_AFTER: Final = 60.0
"""Shorter than the hand-off, so that a large request is reserved room here before it would be
handed to kube-scheduler, which reserves nothing."""
MAX_WAIT_S: Final = 86400.0
"""The longest ``--handoff-after`` and ``--starvation-after``: a day."""
MAX_LEADER_ELECTION_S: Final = 3600
"""The longest lease duration, renew deadline and retry period: an hour."""
MIN_LEADER_ELECTION_S: Final = 0.1


@dataclass(frozen=True, slots=True)
class Settings:
    """The validated configuration of one controller process."""

    daemon: DaemonSettings
    """The API server, ``/metrics`` and probe addresses, logging: the flags every daemon has."""
    namespace: str
    policy: str
    webhook_port: int
    """0 disables the webhook server (tests, or a deployment that runs it elsewhere)."""
    webhook_cert_dir: Path
    cert_mode: CertMode
    webhook_service: str
    webhook_config_name: str
    leader_elect: bool
    lease_duration: int
    renew_deadline: float
    retry_period: float
    identity: str
    workers: int
    allocation_mode: str = "controller"
    """``controller``: we allocate (gated flow). ``scheduler``: kube-scheduler allocates; we only
    hand every gated pod over to it and release the shadow claims left from controller mode."""
    handoff_after: float = DEFAULT_HANDOFF_AFTER
    """Controller mode: hand a DRA pod to kube-scheduler after this long without capacity or
    without being bound; 0 never hands off."""
    starvation_after: float = DEFAULT_STARVATION_AFTER
    """Controller mode: reserve a GPU for a pod that has waited this long and fits nowhere; 0
    never reserves."""
    preemption: bool = True
    """Controller mode: evict lower-priority pods that hold our slices for a pod that fits
    nowhere (through the Eviction API)."""
    nominate_node: bool = True
    """Set a placed pod's ``status.nominatedNodeName`` before ungating it (docs/design.md F24)."""
    webhook_process: bool = True
    """Serve the webhook from a process of its own (``webhook_process``), started and watched by
    this one; False serves it from the controller's process (one interpreter lock shared with the
    allocation workers)."""


def build_parser() -> argparse.ArgumentParser:
    """The parser of every flag; defaults here are the built-in ones (env vars applied on parse)."""
    parser = DaemonParser(
        prog=PROG,
        description="InstaSlice controller: the single allocator of MIG slices (DRA claims and "
        "classic nvidia.com/mig-* requests), the pod-gating webhook, leader election and metrics.",
    )
    add_daemon_flags(parser, defaults=DEFAULTS)
    _add_cluster_flags(parser)
    _add_webhook_flags(parser)
    _add_allocator_flags(parser)
    _add_mode_flags(parser)
    return parser


def _add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """The namespace of our own objects and the placement policy."""
    add_flag(
        parser,
        "--namespace",
        help_text="namespace of the lease and the webhook certificate Secret",
        default=SYSTEM_NAMESPACE,
    )
    add_flag(
        parser,
        "--policy",
        help_text="placement policy",
        default=DEFAULT_POLICY,
        choices=tuple(POLICIES),
    )


def _add_webhook_flags(parser: argparse.ArgumentParser) -> None:
    """The pod webhook: port, certificate, the Service and configuration kube-apiserver uses."""
    add_number_flag(
        parser,
        "--webhook-port",
        help_text="HTTPS port of the pod webhook; 0 disables it",
        default=DEFAULT_WEBHOOK_PORT,
        low=0,
        high=65535,
        integer=True,
    )
    add_flag(
        parser,
        "--webhook-cert-dir",
        help_text="directory of tls.crt/tls.key for the webhook",
        default=DEFAULT_WEBHOOK_CERT_DIR,
    )
    add_flag(
        parser,
        "--cert-mode",
        help_text="who provides the webhook certificate",
        default=CertMode.SELF.value,
        choices=CERT_MODES,
    )
    add_flag(
        parser,
        "--webhook-service",
        help_text="Service name kube-apiserver calls the webhook through",
        default=DEFAULT_WEBHOOK_SERVICE,
    )
    add_flag(
        parser,
        "--webhook-config-name",
        help_text="MutatingWebhookConfiguration whose caBundle is kept current (cert mode self)",
        default=DEFAULT_WEBHOOK_CONFIG_NAME,
    )
    parser.add_argument(
        "--webhook-process",
        dest="webhook_process",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve the webhook from a child process with its own caches, so allocation work "
        f"never delays pod admission (env {env_var('webhook_process')}; default true)",
    )


def _add_allocator_flags(parser: argparse.ArgumentParser) -> None:
    """Node nomination, leader election and the allocation workers."""
    parser.add_argument(
        "--nominate-node",
        dest="nominate_node",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="name a placed pod's node in its status.nominatedNodeName before lifting the gate, "
        "so kube-scheduler neither writes it itself (through its rate-limited client) nor "
        f"searches other nodes (env {env_var('nominate_node')}; default true)",
    )
    parser.add_argument(
        "--leader-elect",
        dest="leader_elect",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"elect one allocating replica through a Lease (env {env_var('leader_elect')}; "
        "default true)",
    )
    _add_leader_election_timing_flags(parser)
    add_flag(
        parser,
        "--identity",
        help_text="leader-election identity (default: hostname and process id)",
        default=None,
    )
    add_number_flag(
        parser,
        "--workers",
        help_text="worker threads writing allocations concurrently",
        default=DEFAULT_WORKERS,
        low=1,
        high=MAX_WORKERS,
        integer=True,
    )


def _add_leader_election_timing_flags(parser: argparse.ArgumentParser) -> None:
    """Lease duration, renew deadline and retry period, in seconds."""
    add_number_flag(
        parser,
        "--lease-duration",
        help_text="lease duration, seconds",
        default=15,
        low=1,
        high=MAX_LEADER_ELECTION_S,
        integer=True,
    )
    for flag, what, default in (
        ("--renew-deadline", "renew deadline, seconds; less than --lease-duration", 10.0),
        ("--retry-period", "retry period, seconds; less than --renew-deadline", 2.0),
    ):
        add_number_flag(
            parser,
            flag,
            help_text=what,
            default=default,
            low=MIN_LEADER_ELECTION_S,
            high=MAX_LEADER_ELECTION_S,
        )


def _add_mode_flags(parser: argparse.ArgumentParser) -> None:
    """Who allocates (this controller or kube-scheduler) and when a waiting pod is handed over."""
    add_flag(
        parser,
        "--allocation-mode",
        help_text="who allocates MIG slices: 'controller' (gated pods, this controller places "
        "them) or 'scheduler' (kube-scheduler allocates; no webhook; gated pods are handed over)",
        default="controller",
        choices=ALLOCATION_MODES,
    )
    add_number_flag(
        parser,
        "--handoff-after",
        help_text="controller mode: seconds a DRA pod waits for capacity, or to be bound once "
        "placed, before it is handed to kube-scheduler (and cluster autoscalers); 0 disables",
        default=DEFAULT_HANDOFF_AFTER,
        low=0,
        high=MAX_WAIT_S,
    )
    add_number_flag(
        parser,
        "--starvation-after",
        help_text="controller mode: seconds a pod waits, fitting nowhere, before the GPU "
        "cheapest to empty is reserved for it (nothing of equal or lower priority is placed "
        "there meanwhile); 0 disables",
        default=DEFAULT_STARVATION_AFTER,
        low=0,
        high=MAX_WAIT_S,
    )
    add_flag(
        parser,
        "--preemption",
        help_text="controller mode: 'on' evicts lower-priority pods holding MIG slices for a "
        "pod that fits nowhere (Eviction API, PodDisruptionBudgets honoured); 'off' never does",
        default="on",
        choices=("on", "off"),
    )


def parse_settings(
    argv: Sequence[str] | None = None, *, environ: Mapping[str, str] | None = None
) -> Settings:
    """Flags from ``argv`` over env vars over built-in defaults; exits with status 2 if invalid."""
    parser = build_parser()
    args = flags.parse_args_with_env(
        parser, argv, environ=os.environ if environ is None else environ
    )
    return _validate(parser, args)


def check_paths(settings: Settings) -> None:
    """``ConfigError`` unless this process can write the directories its flags name: the
    webhook's certificate directory when the webhook serves a certificate it makes itself
    (``--cert-mode self``); in the other modes someone else writes it, maybe later."""
    if settings.webhook_port != 0 and settings.cert_mode is CertMode.SELF:
        check_writable_directory(settings.webhook_cert_dir, flag="--webhook-cert-dir")


def _check_leader_election_timing(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> None:
    """Lease duration, renew deadline and retry period, in that order of length."""
    lease, renew, retry = args.lease_duration, args.renew_deadline, args.retry_period
    if not retry < renew < lease:
        parser.error(
            "need --retry-period < --renew-deadline < --lease-duration, got "
            f"{retry:g}, {renew:g}, {lease:g}"
        )


def _validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Settings:
    flags.check_choices(
        parser,
        args,
        (
            ("policy", tuple(POLICIES)),
            ("cert_mode", CERT_MODES),
            ("allocation_mode", ALLOCATION_MODES),
            ("preemption", ("on", "off")),
        ),
    )
    flags.check_names(
        parser, args, labels=("namespace", "webhook_service"), subdomains=("webhook_config_name",)
    )
    _check_leader_election_timing(parser, args)
    return Settings(
        daemon=daemon_settings(parser, args, defaults=DEFAULTS),
        namespace=args.namespace,
        policy=args.policy,
        webhook_port=args.webhook_port,
        webhook_cert_dir=Path(args.webhook_cert_dir),
        cert_mode=CertMode(args.cert_mode),
        webhook_service=args.webhook_service,
        webhook_config_name=args.webhook_config_name,
        leader_elect=True if args.leader_elect is None else bool(args.leader_elect),
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
        identity=args.identity or f"{socket.gethostname()}_{os.getpid()}",
        workers=args.workers,
        allocation_mode=args.allocation_mode,
        handoff_after=args.handoff_after,
        starvation_after=args.starvation_after,
        preemption=args.preemption == "on",
        webhook_process=True if args.webhook_process is None else bool(args.webhook_process),
        nominate_node=True if args.nominate_node is None else bool(args.nominate_node),
    )
