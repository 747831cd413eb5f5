"""Keeps the webhook certificate in its Secret, the cert directory and the ``caBundle`` current.

The reconcile step of ``--cert-mode self`` (see ``certs`` for the why). Safe to run on every
replica at once: each write is create-or-adopt / update-with-resourceVersion, and the loser of a
race re-reads and adopts what the winner wrote instead of writing its own.
"""

from __future__ import annotations

import base64
import binascii
import copy
import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from controller.certs import (
    CA_FILE,
    CA_KEY,
    CERT_FILE,
    KEY_FILE,
    CertificateSettings,
    CertificateStore,
    ServingCertificate,
    certificate_names,
    generate_ca,
    issue_serving_certificate,
    renewal_due,
    write_certificate_files,
)
from driver.cluster import views
from driver.cluster.clock import Clock
from driver.errors import AlreadyExistsError, ConflictError, DriverError

_log = logging.getLogger(__name__)

_MAX_ATTEMPTS: Final = 5
_LABELS: Final = {
    "app.kubernetes.io/name": "instaslice",
    "app.kubernetes.io/component": "controller",
}


@dataclass(frozen=True, slots=True)
class _Stored:
    ca_cert_pem: bytes
    ca_key_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    ca_bundle_pem: bytes
    ca_cert: x509.Certificate
    cert: x509.Certificate

    def serving(self) -> ServingCertificate:
        return ServingCertificate(
            cert_pem=self.cert_pem,
            key_pem=self.key_pem,
            ca_bundle_pem=self.ca_bundle_pem,
            not_after=self.cert.not_valid_after_utc,
        )


class CertificateManager:
    def __init__(
        self,
        store: CertificateStore,
        *,
        settings: CertificateSettings,
        cert_dir: Path,
        clock: Clock,
    ) -> None:
        self._store = store
        self._settings = settings
        self._cert_dir = cert_dir
        self._clock = clock

    def reconcile(self) -> ServingCertificate:
        """Make Secret, files and ``caBundle`` agree on a valid certificate; returns it."""
        serving = self._ensure_secret()
        if write_certificate_files(self._cert_dir, serving):
            _log.info(
                "webhook certificate written to %s (valid until %s)",
                self._cert_dir,
                serving.not_after.isoformat(),
            )
        if self._settings.webhook_configuration is not None:
            self._ensure_ca_bundle(serving.ca_bundle_pem)
        return serving

    def run(self, stop: threading.Event, *, interval_seconds: float = 3600.0) -> None:
        """Reconcile every ``interval_seconds`` until ``stop`` is set; errors are logged and retried."""
        while not stop.is_set():
            try:
                self.reconcile()
            except DriverError as exc:
                _log.warning("webhook certificate reconcile failed, retrying: %s", exc)
            stop.wait(interval_seconds)

    def _ensure_secret(self) -> ServingCertificate:
        settings = self._settings
        for _ in range(_MAX_ATTEMPTS):
            secret = self._store.get_secret(namespace=settings.namespace, name=settings.secret_name)
            if secret is None:
                fresh = self._build(previous=None)
                try:
                    self._store.create_secret(self._secret_object(fresh, base=None))
                except AlreadyExistsError:
                    _log.info("webhook Secret created by another replica; adopting it")
                    continue
                _log.info("webhook Secret %s/%s created", settings.namespace, settings.secret_name)
                return fresh.serving()
            stored = _decode(secret)
            reason = self._renewal_reason(stored)
            if stored is not None and reason is None:
                return stored.serving()
            _log.info("renewing the webhook certificate: %s", reason)
            fresh = self._build(previous=stored)
            try:
                self._store.update_secret(self._secret_object(fresh, base=secret))
            except ConflictError:
                _log.info("webhook Secret changed by another replica; re-reading it")
                continue
            return fresh.serving()
        raise ConflictError(
            f"webhook Secret {settings.namespace}/{settings.secret_name} kept changing "
            f"under us ({_MAX_ATTEMPTS} attempts)"
        )

    def _renewal_reason(self, stored: _Stored | None) -> str | None:
        if stored is None:
            return "the Secret holds no usable certificate"
        now = self._clock.now()
        settings = self._settings
        if renewal_due(stored.ca_cert, now=now, renew_before=settings.renew_before):
            return f"the CA expires at {stored.ca_cert.not_valid_after_utc.isoformat()}"
        if renewal_due(stored.cert, now=now, renew_before=settings.renew_before):
            return f"the certificate expires at {stored.cert.not_valid_after_utc.isoformat()}"
        dns, ips = certificate_names(stored.cert)
        if dns != set(settings.dns_names()) or ips != set(settings.ip_addresses()):
            return "the certificate's names differ from the service's"
        try:
            stored.cert.verify_directly_issued_by(stored.ca_cert)
        except (ValueError, TypeError, InvalidSignature):
            return "the certificate is not signed by the stored CA"
        if not _key_matches(stored.cert, stored.key_pem):
            return "the private key does not match the certificate"
        return None

    def _build(self, *, previous: _Stored | None) -> _Stored:
        now = self._clock.now()
        settings = self._settings
        reuse_ca = previous is not None and not renewal_due(
            previous.ca_cert, now=now, renew_before=settings.renew_before
        )
        if previous is not None and reuse_ca:
            ca_cert_pem, ca_key_pem = previous.ca_cert_pem, previous.ca_key_pem
            bundle = _bundle([ca_cert_pem, previous.ca_bundle_pem], now=now)
        else:
            ca_cert_pem, ca_key_pem = generate_ca(
                common_name=f"instaslice-webhook-ca@{int(now.timestamp())}",
                now=now,
                validity=settings.ca_validity,
            )
            # the old CA stays trusted while replicas may still serve certificates it signed
            older = [previous.ca_cert_pem] if previous is not None else []
            bundle = _bundle([ca_cert_pem, *older], now=now)
        cert_pem, key_pem = issue_serving_certificate(
            ca_cert_pem=ca_cert_pem,
            ca_key_pem=ca_key_pem,
            dns_names=settings.dns_names(),
            ip_addresses=settings.ip_addresses(),
            now=now,
            validity=settings.serving_validity,
        )
        return _Stored(
            ca_cert_pem=ca_cert_pem,
            ca_key_pem=ca_key_pem,
            cert_pem=cert_pem,
            key_pem=key_pem,
            ca_bundle_pem=bundle,
            ca_cert=x509.load_pem_x509_certificate(ca_cert_pem),
            cert=x509.load_pem_x509_certificate(cert_pem),
        )

    def _secret_object(self, stored: _Stored, *, base: dict[str, Any] | None) -> dict[str, Any]:
        data = {
            CERT_FILE: stored.cert_pem,
            KEY_FILE: stored.key_pem,
            CA_FILE: stored.ca_bundle_pem,
            CA_KEY: stored.ca_key_pem,
        }
        encoded = {key: base64.b64encode(value).decode() for key, value in data.items()}
        if base is not None:
            secret = copy.deepcopy(base)
            secret.pop("stringData", None)
            secret["data"] = {**views.mapping(views.path(base, "data")), **encoded}
            return secret
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": self._settings.secret_name,
                "namespace": self._settings.namespace,
                "labels": dict(_LABELS),
            },
            "type": "kubernetes.io/tls",
            "data": encoded,
        }

    def _ensure_ca_bundle(self, bundle_pem: bytes) -> None:
        name = self._settings.webhook_configuration
        assert name is not None
        wanted = base64.b64encode(bundle_pem).decode()
        for _ in range(_MAX_ATTEMPTS):
            configuration = self._store.get_webhook_configuration(name=name)
            if configuration is None:
                _log.warning("MutatingWebhookConfiguration %s not found; caBundle not set", name)
                return
            updated = copy.deepcopy(configuration)
            stale = [
                hook
                for hook in views.items(views.path(updated, "webhooks"))
                if isinstance(hook, dict) and views.path(hook, "clientConfig", "caBundle") != wanted
            ]
            if not stale:
                return
            for hook in stale:
                client = views.path(hook, "clientConfig")
                if not isinstance(client, dict):
                    client = hook["clientConfig"] = {}
                client["caBundle"] = wanted
            try:
                self._store.update_webhook_configuration(updated)
            except ConflictError:
                continue
            _log.info("caBundle of MutatingWebhookConfiguration %s updated", name)
            return
        raise ConflictError(f"MutatingWebhookConfiguration {name} kept changing under us")


def _decode(secret: dict[str, Any]) -> _Stored | None:
    data = views.mapping(views.path(secret, "data"))
    try:
        raw = {
            key: base64.b64decode(data[key], validate=True)
            for key in (CERT_FILE, KEY_FILE, CA_FILE, CA_KEY)
        }
        bundle = x509.load_pem_x509_certificates(raw[CA_FILE])
        cert = x509.load_pem_x509_certificate(raw[CERT_FILE])
        ca_key = serialization.load_pem_private_key(raw[CA_KEY], password=None)
    except (KeyError, TypeError, ValueError, binascii.Error):
        return None
    ca_public = _spki(ca_key.public_key())
    ca_cert = next((c for c in bundle if _spki(c.public_key()) == ca_public), None)
    if ca_cert is None:
        return None
    return _Stored(
        ca_cert_pem=ca_cert.public_bytes(serialization.Encoding.PEM),
        ca_key_pem=raw[CA_KEY],
        cert_pem=raw[CERT_FILE],
        key_pem=raw[KEY_FILE],
        ca_bundle_pem=raw[CA_FILE],
        ca_cert=ca_cert,
        cert=cert,
    )


def _spki(public_key: Any) -> bytes:
    return bytes(
        public_key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _key_matches(cert: x509.Certificate, key_pem: bytes) -> bool:
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (TypeError, ValueError):
        return False
    return _spki(key.public_key()) == _spki(cert.public_key())


def _bundle(pems: list[bytes], *, now: datetime) -> bytes:
    """Concatenate the unexpired certificates of ``pems`` (in order, each once)."""
    seen: dict[bytes, None] = {}
    for pem in pems:
        for cert in x509.load_pem_x509_certificates(pem):
            if cert.not_valid_after_utc > now:
                seen.setdefault(cert.public_bytes(serialization.Encoding.PEM), None)
    return b"".join(seen)
