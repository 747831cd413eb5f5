"""The pod webhook in a process of its own: ``python -m controller.webhook.process``.

Why a process: admission is on the path of every pod create (docs/design.md F15). Served by the
controller's process it would share one interpreter lock with the allocation workers, and every
answer during a burst would wait for them. Here it has its own
interpreter, its own client and its own informers — claims, claim templates, DeviceClasses and
ResourceSlices, which is all admission reads; never pods or nodes, the busiest kinds in a burst —
so allocation work cannot delay an answer.

The controller starts it (``webhook_child``) with its own arguments, and the environment carries
the same ``INSTASLICE_*`` variables, so both read one configuration: this process uses the
webhook, certificate, client and log settings and ignores the rest. It can also run on its own
(its ``--healthz-address`` then serves ``/readyz``, its ``--metrics-address`` ``/metrics``). Its
figures (``metrics.WebhookMetrics``: answers by status and decision, the server-side time of each)
are served on 127.0.0.1 when the controller started it, and the controller's ``/metrics`` adds
them to its own: one scrape target per controller pod.
The server opens its port only once the caches are synced and the slice inventory is built (at
hundreds of nodes that takes seconds: never on an admission's path; later slice changes are applied
by a thread of their own), then
``gc.freeze()`` moves everything loaded so far out of the collector's reach, so the cached objects
are not scanned again on every collection.

Started by the controller (``PARENT_PID_ENV`` set), it ends when the controller dies, even by
``SIGKILL``, and tells the controller it is serving by one line on stdout (``READY_LINE``).
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import Final

from controller.allocation.state import SliceState
from controller.informers import WebhookInformers
from controller.logs import FIELDS as LOG_FIELDS
from controller.metrics import CONTENT_TYPE, WEBHOOK_NAMESPACE, WebhookMetrics
from controller.settings import PROG, Settings, check_paths, parse_settings
from controller.webhook.context import CacheAdmissionContext
from controller.webhook.replica import WebhookRunner
from driver.cluster.informer_metrics import InformerCollector
from driver.cluster.port import ClusterApi, JsonObject
from driver.daemon.http import Route, probe
from driver.daemon.lifeline import die_with_parent
from driver.daemon.parser import refuse
from driver.daemon.run import Daemon, Program, run_daemon

__all__ = ["METRICS_LINE", "PARENT_PID_ENV", "READY_LINE", "WebhookProcess", "main"]

logger = logging.getLogger("controller.webhook.process")
PROGRAM = Program(name=PROG, logger=logger, log_fields=LOG_FIELDS)

COMPONENT: Final = "instaslice-webhook"
USER_AGENT: Final = "instaslice-controller/webhook"
"""It runs as the controller's ServiceAccount, in the controller's pod: the same product token."""
PARENT_PID_ENV: Final = "INSTASLICE_WEBHOOK_PARENT_PID"
"""Set by the controller to its pid: this process then ends with it and announces readiness."""
READY_LINE: Final = "instaslice-webhook serving"
METRICS_LINE: Final = "instaslice-webhook metrics on port "
"""Followed by the port: where a child serves ``/metrics`` (on 127.0.0.1, a port of the kernel's
choosing), announced before ``READY_LINE``, so the controller can add them to its own."""
SYNC_POLL_S: Final = 0.5
SHUTDOWN_GRACE_S: Final = 10.0
INVENTORY_REFRESH_S: Final = 0.5
SWITCH_INTERVAL_S: Final = 0.001
"""How long a thread may hold the interpreter lock while another waits (Python's default: 5 ms).
An answer waiting behind an informer thread decoding a claim event waits at most this long."""


class WebhookProcess:
    """Informers, inventory and webhook server of the process; ``run`` until ``stop`` is set."""

    def __init__(self, *, settings: Settings, api: ClusterApi, stop: threading.Event) -> None:
        self._stop = stop
        self.informers = WebhookInformers.create(api, name=f"{settings.identity}-webhook")
        self.state = SliceState()
        self.informers.slices.add_handler(
            on_add=self.state.slice_changed,
            on_update=self._slice_updated,
            on_delete=self.state.slice_deleted,
        )
        self.admission = CacheAdmissionContext(informers=self.informers, state=self.state)
        self.metrics = WebhookMetrics()
        self.metrics.registry.register(
            InformerCollector(namespace=WEBHOOK_NAMESPACE, informers=self.informers.named)
        )
        self.webhook = WebhookRunner(
            settings=settings, api=api, admission=self.admission, stop=stop, metrics=self.metrics
        )
        self._refresher: threading.Thread | None = None

    def _slice_updated(self, old: JsonObject, new: JsonObject) -> None:
        self.state.slice_changed(new)

    def ready(self) -> bool:
        return self.informers.has_synced() and self.webhook.ready()

    def start(self) -> bool:
        """Start the informers, wait for their first lists, then serve; False if stopped first."""
        self.informers.start()
        while not self.informers.wait_for_sync(timeout=SYNC_POLL_S):
            if self._stop.is_set():
                return False
        self._refresh_inventory()
        gc.collect()
        gc.freeze()
        self._refresher = threading.Thread(
            target=self._keep_inventory_fresh, name="webhook-inventory", daemon=True
        )
        self._refresher.start()
        self.webhook.start()
        return True

    def _refresh_inventory(self) -> None:
        with self.state.lock:
            self.state.refresh()

    def _keep_inventory_fresh(self) -> None:
        # Slice changes are applied here, off the admission path: building a node's devices takes
        # milliseconds, the whole inventory seconds at hundreds of nodes.
        while not self._stop.wait(INVENTORY_REFRESH_S):
            if self.state.inventory.dirty:
                self._refresh_inventory()

    def wait_serving(self) -> bool:
        """Block until the server is up (certificate found, port bound); False if stopped first."""
        while not self.webhook.ready():
            if self._stop.wait(0.05):
                return False
        return True

    def stop(self) -> None:
        self._stop.set()
        self.webhook.stop()
        self.informers.stop()
        if self._refresher is not None:
            self._refresher.join(timeout=5.0)


def main(argv: Sequence[str] | None = None) -> int:
    child_of_controller = PARENT_PID_ENV in os.environ
    if child_of_controller and not die_with_parent(PARENT_PID_ENV):
        return 1
    settings = parse_settings(argv)
    if settings.webhook_port == 0:
        return refuse(PROG, "--webhook-port 0: there is no webhook to serve")
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    return run_daemon(
        PROGRAM,
        settings.daemon,
        serve=lambda daemon: _serve(settings, daemon, child_of_controller=child_of_controller),
        user_agent=USER_AGENT,
        connections=8,
    )


def _serve(settings: Settings, daemon: Daemon, *, child_of_controller: bool) -> int:
    """Serve the probes and ``/metrics``, then the webhook once its caches are synced; run until
    a signal."""
    check_paths(settings)
    process = WebhookProcess(settings=settings, api=daemon.api, stop=daemon.stop)
    endpoints = daemon.serve_http(_routes(settings, process, daemon.stop))
    daemon.on_stop(process.stop)
    # A graceful stop joins connection and informer threads; bounded, so the process surely ends
    # soon after its controller (kubelet would kill it after the grace period anyway).
    daemon.on_stop(_exit_if_not_stopped_in_time)
    metrics = endpoints.get(settings.daemon.metrics_address)
    if child_of_controller and metrics is not None:
        _announce(f"{METRICS_LINE}{metrics.port}")
    if process.start() and process.wait_serving():
        logger.info("%s serving on port %d", COMPONENT, settings.webhook_port)
        if child_of_controller:
            _announce(READY_LINE)
    return daemon.wait()


def _routes(
    settings: Settings, process: WebhookProcess, stop: threading.Event
) -> list[tuple[str, dict[str, Route]]]:
    """``/metrics`` on ``--metrics-address`` and the probes on ``--healthz-address`` (one server
    when they are the same)."""

    def metrics() -> tuple[int, str, bytes]:
        return 200, CONTENT_TYPE, process.metrics.exposition()

    health: dict[str, Route] = {
        "/healthz": probe(lambda: not stop.is_set(), what="webhook"),
        "/readyz": probe(process.ready, what="webhook"),
    }
    daemon = settings.daemon
    return [(daemon.metrics_address, {"/metrics": metrics}), (daemon.healthz_address, health)]


def _exit_if_not_stopped_in_time() -> None:
    deadline = threading.Timer(SHUTDOWN_GRACE_S, _exit_now)
    deadline.daemon = True
    deadline.start()


def _announce(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _exit_now() -> None:
    logger.warning("%s did not stop within %.0f s; exiting", COMPONENT, SHUTDOWN_GRACE_S)
    logging.shutdown()
    os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
