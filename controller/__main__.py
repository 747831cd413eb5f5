"""Entry point of ``instaslice-controller``; wiring only: settings → API client → controller,
webhook (with its certificates) and HTTP endpoints → serve until SIGTERM.

The webhook and the endpoints run on every replica; only the leader allocates. The webhook is
served by a child process with caches of its own (``webhook_child``, ``webhook_process``) unless
``--no-webhook-process``. SIGTERM and SIGINT stop gracefully: allocation stops, the lease is handed
back, servers and the webhook process close.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
from collections.abc import Sequence

from controller.allocation.allocator import AllocatorConfig
from controller.allocation.outcome import SyncConfig
from controller.app import COMPONENT, Controller
from controller.logs import FIELDS as LOG_FIELDS
from controller.metrics import CONTENT_TYPE, WebhookMetrics
from controller.settings import PROG, Settings, build_parser, check_paths, parse_settings
from controller.webhook.child import WebhookChild
from controller.webhook.replica import WebhookRunner
from driver.cluster.leader import LeaderElectionConfig
from driver.cluster.port import ClusterApi
from driver.daemon.http import Route, probe
from driver.daemon.run import Daemon, Program, run_daemon

__all__ = ["build_parser", "main"]

logger = logging.getLogger("controller")
PROGRAM = Program(name=PROG, logger=logger, log_fields=LOG_FIELDS)


def build_controller(settings: Settings, api: ClusterApi) -> Controller:
    election = (
        LeaderElectionConfig(
            identity=settings.identity,
            namespace=settings.namespace,
            lease_duration=settings.lease_duration,
            renew_deadline=settings.renew_deadline,
            retry_period=settings.retry_period,
        )
        if settings.leader_elect
        else None
    )
    return Controller(
        api=api,
        config=AllocatorConfig(
            workers=settings.workers,
            policy=settings.policy,
            sync=SyncConfig(
                handoff_after=settings.handoff_after or None,
                starvation_after=settings.starvation_after or None,
                preemption=settings.preemption,
                scheduler_mode=settings.allocation_mode == "scheduler",
                nominate_node=settings.nominate_node,
            ),
        ),
        leader_election=election,
        identity=settings.identity,
    )


def routes(
    settings: Settings,
    controller: Controller,
    webhook: WebhookRunner | WebhookChild,
    *,
    settled: threading.Event | None = None,
) -> list[tuple[str, dict[str, Route]]]:
    """``/metrics`` and the probes by address; with ``settled``, ``/readyz`` also waits for it."""

    def metrics() -> tuple[int, str, bytes]:
        own = controller.metrics.exposition()
        # the webhook process's figures (instaslice_webhook_*), when it runs apart
        return (
            200,
            CONTENT_TYPE,
            own + webhook.scrape() if isinstance(webhook, WebhookChild) else own,
        )

    def ready() -> bool:
        return (settled is None or settled.is_set()) and controller.ready() and webhook.ready()

    health: dict[str, Route] = {
        "/healthz": probe(controller.healthy, what="controller"),
        "/readyz": probe(ready, what="controller"),
    }
    daemon = settings.daemon
    return [(daemon.metrics_address, {"/metrics": metrics}), (daemon.healthz_address, health)]


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(argv)
    return run_daemon(
        PROGRAM,
        settings.daemon,
        serve=lambda daemon: _serve(settings, daemon, argv=argv),
        user_agent=COMPONENT,
        connections=settings.workers + 16,
    )


def _serve(settings: Settings, daemon: Daemon, *, argv: Sequence[str] | None) -> int:
    """Start the endpoints, the controller and the webhook; run until a signal."""
    check_paths(settings)
    controller = build_controller(settings, daemon.api)
    webhook = _webhook(settings, argv=argv, api=daemon.api, controller=controller, stop=daemon.stop)
    settled = threading.Event()
    """Set once the caches as first listed are out of the collector's reach (``_run``)."""
    daemon.serve_http(routes(settings, controller, webhook, settled=settled))
    daemon.on_stop(webhook.stop)
    daemon.on_stop(controller.stop)
    controller.start()
    webhook.start()
    logger.info(
        "%s running as %s (leader election %s)",
        COMPONENT,
        settings.identity,
        "on" if settings.leader_elect else "off",
    )
    _run(controller, stop=daemon.stop, settled=settled)
    return 0


def _webhook(
    settings: Settings,
    *,
    argv: Sequence[str] | None,
    api: ClusterApi,
    controller: Controller,
    stop: threading.Event,
) -> WebhookRunner | WebhookChild:
    """The pod webhook: in a child process of its own (``--webhook-process``), else in this one."""
    if settings.webhook_process and settings.webhook_port != 0:
        return WebhookChild(argv=sys.argv[1:] if argv is None else argv, stop=stop)
    return WebhookRunner(
        settings=settings,
        api=api,
        admission=controller.admission,
        stop=stop,
        metrics=WebhookMetrics(controller.metrics.registry),
    )


def _run(controller: Controller, *, stop: threading.Event, settled: threading.Event) -> None:
    """Until ``stop``; once the controller is first ready, settle its caches (``settled``)."""
    while not stop.wait(0.5 if settled.is_set() else 0.05):
        if not settled.is_set() and controller.ready():
            # the caches as first listed (and, leading, the rebuilt state) live as long as the
            # process: out of the cyclic collector's reach, they are not scanned again by
            # every full collection during a burst. /readyz answers OK only after this full
            # collection (~0.4 s holding the interpreter lock at 100 nodes): pods that come
            # once we are ready do not share the CPU with it.
            gc.collect()
            gc.freeze()
            settled.set()


if __name__ == "__main__":
    sys.exit(main())
