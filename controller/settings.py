"""Command-line flags of ``instaslice-controller``; every flag can also come from the environment.

The Deployment sets most of these through env vars (``INSTASLICE_<FLAG>``, e.g.
``INSTASLICE_LEADER_ELECT=true``); a flag given on the command line wins over its env var. Bad
values end the process with a one-line CLI error and exit status 2, before anything is started.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Final

from api.names import SYSTEM_NAMESPACE
from controller.webhook.certificates import CertMode
from driver.daemon import flags
from driver.daemon.flags import LOG_FORMATS, LOG_LEVELS, add_flag, env_var
from driver.placement import DEFAULT_POLICY, POLICIES

CERT_MODES: Final = tuple(mode.value for mode in CertMode)

DEFAULT_WEBHOOK_PORT: Final = 9443
DEFAULT_WEBHOOK_CERT_DIR: Final = "/var/run/instaslice/webhook-certs"
DEFAULT_WEBHOOK_SERVICE: Final = "instaslice-webhook"
DEFAULT_WEBHOOK_CONFIG_NAME: Final = "instaslice-pod-gate"
DEFAULT_METRICS_ADDRESS: Final = ":8080"
DEFAULT_HEALTHZ_ADDRESS: Final = ":8081"
DEFAULT_WORKERS: Final = 48
"""Pods placed at once: each waits on API round trips most of its time (real 1.36 control plane,
1,000-pod burst: create -> ungated p50 6.9 s / p99 13.2 s with 16 workers, 3.7 s / 4.3 s with 48)."""
DEFAULT_KUBE_API_QPS: Final = 500.0
"""Four writes per pod (finalizer, allocation, nominated node, gate) at well over 100 pods/s."""
DEFAULT_KUBE_API_BURST: Final = 1000
ALLOCATION_MODES: Final = ("controller", "scheduler")
DEFAULT_HANDOFF_AFTER: Final = 120.0
DEFAULT_STARVATION_AFTER: Final = 60.0
"""Shorter than the hand-off, so that a large request is reserved room here before it would be
handed to kube-scheduler, which reserves nothing."""
"""Seconds a DRA pod may wait for capacity (or to be bound) before kube-scheduler gets it."""


@dataclass(frozen=True, slots=True)
class Settings:
    """The validated configuration of one controller process."""

    kubeconfig: str | None
    kube_api_url: str | None
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
    kube_api_qps: float
    kube_api_burst: int
    metrics_address: str
    """``host:port`` for ``/metrics``; empty string disables the endpoint."""
    healthz_address: str
    """``host:port`` for ``/healthz`` and ``/readyz``; empty string disables the endpoint."""
    log_level: str
    log_format: str
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


_add = partial(add_flag, show_default=True)
"""The controller's flag help also names each built-in default."""


def build_parser() -> argparse.ArgumentParser:
    """The parser of every flag; defaults here are the built-in ones (env vars applied on parse)."""
    parser = argparse.ArgumentParser(
        prog="instaslice-controller",
        description="InstaSlice controller: the single allocator of MIG slices (DRA claims and "
        "classic nvidia.com/mig-* requests), the pod-gating webhook, leader election and metrics.",
    )
    _add_cluster_flags(parser)
    _add_webhook_flags(parser)
    _add_allocator_flags(parser)
    _add_client_flags(parser)
    _add_mode_flags(parser)
    flags.add_log_flags(parser, show_default=True)
    return parser


def _add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """How to reach the API server, the namespace of our own objects, the placement policy."""
    _add(parser, "--kubeconfig", help_text="kubeconfig file (default: in-cluster)", default=None)
    _add(
        parser,
        "--kube-api-url",
        help_text="plain API server URL without auth (local API server); overrides --kubeconfig",
        default=None,
    )
    _add(
        parser,
        "--namespace",
        help_text="namespace of the lease and the webhook certificate Secret",
        default=SYSTEM_NAMESPACE,
    )
    _add(
        parser,
        "--policy",
        help_text="placement policy",
        default=DEFAULT_POLICY,
        choices=tuple(POLICIES),
    )


def _add_webhook_flags(parser: argparse.ArgumentParser) -> None:
    """The pod webhook: port, certificate, the Service and configuration kube-apiserver uses."""
    _add(
        parser,
        "--webhook-port",
        help_text="HTTPS port of the pod webhook; 0 disables it",
        default=str(DEFAULT_WEBHOOK_PORT),
    )
    _add(
        parser,
        "--webhook-cert-dir",
        help_text="directory of tls.crt/tls.key for the webhook",
        default=DEFAULT_WEBHOOK_CERT_DIR,
    )
    _add(
        parser,
        "--cert-mode",
        help_text="who provides the webhook certificate",
        default=CertMode.SELF.value,
        choices=CERT_MODES,
    )
    _add(
        parser,
        "--webhook-service",
        help_text="Service name kube-apiserver calls the webhook through",
        default=DEFAULT_WEBHOOK_SERVICE,
    )
    _add(
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
    _add(parser, "--lease-duration", help_text="lease duration, seconds", default="15")
    _add(parser, "--renew-deadline", help_text="renew deadline, seconds", default="10")
    _add(parser, "--retry-period", help_text="retry period, seconds", default="2")
    _add(
        parser,
        "--identity",
        help_text="leader-election identity (default: hostname and process id)",
        default=None,
    )
    _add(
        parser,
        "--workers",
        help_text="worker threads writing allocations concurrently",
        default=str(DEFAULT_WORKERS),
    )


def _add_client_flags(parser: argparse.ArgumentParser) -> None:
    """The API client's rate limits and the /metrics and /healthz endpoints."""
    _add(
        parser,
        "--kube-api-qps",
        help_text="client-side API request rate limit; 0 disables it",
        default=str(DEFAULT_KUBE_API_QPS),
    )
    _add(
        parser,
        "--kube-api-burst",
        help_text="API requests allowed at once before --kube-api-qps applies",
        default=str(DEFAULT_KUBE_API_BURST),
    )
    _add(
        parser,
        "--metrics-address",
        help_text="host:port of /metrics; empty disables it",
        default=DEFAULT_METRICS_ADDRESS,
    )
    _add(
        parser,
        "--healthz-address",
        help_text="host:port of /healthz and /readyz; empty disables it",
        default=DEFAULT_HEALTHZ_ADDRESS,
    )


def _add_mode_flags(parser: argparse.ArgumentParser) -> None:
    """Who allocates (this controller or kube-scheduler) and when a waiting pod is handed over."""
    _add(
        parser,
        "--allocation-mode",
        help_text="who allocates MIG slices: 'controller' (gated pods, this controller places "
        "them) or 'scheduler' (kube-scheduler allocates; no webhook; gated pods are handed over)",
        default="controller",
        choices=ALLOCATION_MODES,
    )
    _add(
        parser,
        "--handoff-after",
        help_text="controller mode: seconds a DRA pod waits for capacity, or to be bound once "
        "placed, before it is handed to kube-scheduler (and cluster autoscalers); 0 disables",
        default=str(DEFAULT_HANDOFF_AFTER),
    )
    _add(
        parser,
        "--starvation-after",
        help_text="controller mode: seconds a pod waits, fitting nowhere, before the GPU "
        "cheapest to empty is reserved for it (nothing of equal or lower priority is placed "
        "there meanwhile); 0 disables",
        default=str(DEFAULT_STARVATION_AFTER),
    )
    _add(
        parser,
        "--preemption",
        help_text="controller mode: 'on' evicts lower-priority pods holding MIG slices for a "
        "pod that fits nowhere (Eviction API, PodDisruptionBudgets honoured); 'off' never does",
        default="on",
        choices=("on", "off"),
    )


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` → (host, port); ``:8080`` listens on every interface. ``ValueError`` if bad."""
    return flags.split_address(address, example=DEFAULT_METRICS_ADDRESS)


def parse_settings(
    argv: Sequence[str] | None = None, *, environ: Mapping[str, str] | None = None
) -> Settings:
    """Flags from ``argv`` over env vars over built-in defaults; exits with status 2 if invalid."""
    parser = build_parser()
    args = flags.parse_args_with_env(
        parser, argv, environ=os.environ if environ is None else environ
    )
    return _validate(parser, args)


def _number(parser: argparse.ArgumentParser, flag: str, text: str, *, kind: type) -> float:
    try:
        return float(kind(text))
    except ValueError:
        parser.error(f"{flag}: {text!r} is not a number")


def _leader_election_timing(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[int, float, float]:
    """Lease duration, renew deadline and retry period, in that order of length."""
    lease = int(_number(parser, "--lease-duration", args.lease_duration, kind=int))
    renew = _number(parser, "--renew-deadline", args.renew_deadline, kind=float)
    retry = _number(parser, "--retry-period", args.retry_period, kind=float)
    if not 0 < retry < renew < lease:
        parser.error(
            "need 0 < --retry-period < --renew-deadline < --lease-duration, got "
            f"{retry}, {renew}, {lease}"
        )
    return lease, renew, retry


def _waiting_limits(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[float, float]:
    """``--handoff-after`` and ``--starvation-after``, in seconds."""
    handoff_after = _number(parser, "--handoff-after", args.handoff_after, kind=float)
    if not 0 <= handoff_after < float("inf"):
        parser.error(
            f"--handoff-after must be a number of seconds >= 0, got {args.handoff_after!r}"
        )
    starvation_after = _number(parser, "--starvation-after", args.starvation_after, kind=float)
    if not 0 <= starvation_after <= 86400:
        parser.error(
            "--starvation-after must be a number of seconds from 0 to 86400, got "
            f"{args.starvation_after!r}"
        )
    return handoff_after, starvation_after


def _validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Settings:
    flags.check_choices(
        parser,
        args,
        (
            ("policy", tuple(POLICIES)),
            ("cert_mode", CERT_MODES),
            ("log_format", LOG_FORMATS),
            ("log_level", LOG_LEVELS),
            ("allocation_mode", ALLOCATION_MODES),
        ),
    )
    handoff_after, starvation_after = _waiting_limits(parser, args)
    port = int(_number(parser, "--webhook-port", args.webhook_port, kind=int))
    if not 0 <= port <= 65535:
        parser.error(f"--webhook-port must be 0..65535, got {port}")
    lease, renew, retry = _leader_election_timing(parser, args)
    workers = int(_number(parser, "--workers", args.workers, kind=int))
    if workers < 1:
        parser.error(f"--workers must be at least 1, got {workers}")
    qps = _number(parser, "--kube-api-qps", args.kube_api_qps, kind=float)
    burst = int(_number(parser, "--kube-api-burst", args.kube_api_burst, kind=int))
    if qps < 0 or burst < 1:
        parser.error(f"--kube-api-qps must be >= 0 and --kube-api-burst >= 1, got {qps}/{burst}")
    flags.check_addresses(parser, args, ("metrics_address", "healthz_address"), split=split_address)
    identity = args.identity or f"{socket.gethostname()}_{os.getpid()}"
    return Settings(
        kubeconfig=args.kubeconfig,
        kube_api_url=args.kube_api_url,
        namespace=args.namespace,
        policy=args.policy,
        webhook_port=port,
        webhook_cert_dir=Path(args.webhook_cert_dir),
        cert_mode=CertMode(args.cert_mode),
        webhook_service=args.webhook_service,
        webhook_config_name=args.webhook_config_name,
        leader_elect=True if args.leader_elect is None else bool(args.leader_elect),
        lease_duration=lease,
        renew_deadline=renew,
        retry_period=retry,
        identity=identity,
        workers=workers,
        kube_api_qps=qps,
        kube_api_burst=burst,
        metrics_address=args.metrics_address,
        healthz_address=args.healthz_address,
        log_level=args.log_level,
        log_format=args.log_format,
        allocation_mode=args.allocation_mode,
        handoff_after=handoff_after,
        starvation_after=starvation_after,
        preemption=args.preemption == "on",
        webhook_process=True if args.webhook_process is None else bool(args.webhook_process),
        nominate_node=True if args.nominate_node is None else bool(args.nominate_node),
    )
