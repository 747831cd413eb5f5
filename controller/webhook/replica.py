"""The pod webhook of one replica: its serving certificate (per ``--cert-mode``) and its server.

``self``: the certificate is kept in a Secret shared by the replicas, written to the cert
directory and its CA put in the webhook configuration's ``caBundle`` (``certificates``), then
re-checked every hour so it is rotated before it expires. ``cert-manager`` and ``files``: someone
else writes the files; we wait for them and the server reloads them when they change.
Set up on a thread of its own, so a slow API server or a missing Secret mount delays the webhook,
not the allocator; ``ready`` tells the readiness probe.
"""

from __future__ import annotations

import logging
import threading

from controller.metrics import WebhookMetrics
from controller.settings import Settings
from controller.webhook.admission import AdmissionContext, review_pod
from controller.webhook.certificates import (
    CERT_FILE,
    KEY_FILE,
    CertificateManager,
    CertificateSettings,
    CertMode,
    ClusterCertificateStore,
)
from controller.webhook.server import WebhookServer
from driver.cluster.clock import Clock, SystemClock
from driver.cluster.port import ClusterApi
from driver.errors import DriverError

logger = logging.getLogger(__name__)

RETRY_SECONDS = 5.0
ROTATION_CHECK_SECONDS = 3600.0


class WebhookRunner:
    def __init__(
        self,
        *,
        settings: Settings,
        api: ClusterApi,
        admission: AdmissionContext,
        stop: threading.Event,
        clock: Clock | None = None,
        metrics: WebhookMetrics | None = None,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._api = api
        self._admission = admission
        self._stop = stop
        self._clock = clock or SystemClock()
        self._ready = threading.Event()
        self._server: WebhookServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def ready(self) -> bool:
        return self._settings.webhook_port == 0 or self._ready.is_set()

    @property
    def port(self) -> int | None:
        with self._lock:
            return self._server.port if self._server is not None else None

    def start(self) -> None:
        if self._settings.webhook_port == 0:
            logger.info("webhook disabled (--webhook-port 0)")
            return
        self._thread = threading.Thread(target=self._run, name="webhook-setup", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        settings = self._settings
        manager: CertificateManager | None = None
        if settings.cert_mode is CertMode.SELF:
            manager = CertificateManager(
                ClusterCertificateStore(self._api),
                settings=CertificateSettings(
                    service=settings.webhook_service,
                    namespace=settings.namespace,
                    webhook_configuration=settings.webhook_config_name or None,
                ),
                cert_dir=settings.webhook_cert_dir,
                clock=self._clock,
            )
            while not self._stop.is_set():
                try:
                    manager.reconcile()
                    break
                except DriverError as exc:
                    logger.warning("webhook certificate not ready, retrying: %s", exc)
                    self._stop.wait(RETRY_SECONDS)
        cert_file = settings.webhook_cert_dir / CERT_FILE
        key_file = settings.webhook_cert_dir / KEY_FILE
        while not self._stop.is_set() and not (cert_file.exists() and key_file.exists()):
            logger.info("waiting for webhook certificate files in %s", settings.webhook_cert_dir)
            self._stop.wait(RETRY_SECONDS)
        while not self._stop.is_set():
            server = WebhookServer(
                review=lambda review: review_pod(review, self._admission),
                cert_file=cert_file,
                key_file=key_file,
                address=("0.0.0.0", settings.webhook_port),  # noqa: S104 (the pod IP)
                observe=self._metrics.answered if self._metrics is not None else None,
            )
            try:
                server.start()
            except (DriverError, OSError) as exc:
                logger.warning("webhook server cannot start, retrying: %s", exc)
                self._stop.wait(RETRY_SECONDS)
                continue
            with self._lock:
                self._server = server
            self._ready.set()
            break
        if manager is not None:
            manager.run(self._stop, interval_seconds=ROTATION_CHECK_SECONDS)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
        with self._lock:
            server, self._server = self._server, None
        if server is not None:
            server.stop()
