"""The webhook's serving certificate, managed by the controller itself (``--cert-mode self``).

kube-apiserver calls our webhook over HTTPS and verifies it against the ``caBundle`` in the
MutatingWebhookConfiguration. So that a deploy does not need cert-manager, the controller makes a
CA and a serving certificate for ``<service>.<namespace>.svc`` (and ``.svc.cluster.local``, plus
extra names such as ``127.0.0.1`` for local runs), keeps them in a Secret, writes them to the cert
directory the HTTPS server reads, and patches the CA into the webhook configuration.

Every replica runs ``CertificateManager.reconcile`` (the standby serves webhooks too), so all its
writes are idempotent and optimistic: a create that finds the Secret already there adopts the
other replica's certificate, an update that loses a race (409) re-reads and adopts the winner's.
The serving certificate is renewed at two thirds of its lifetime or when less than
``renew_before`` is left, re-using the CA; the CA itself is renewed the same way, and while a new
CA rolls out the ``caBundle`` carries the old and the new one, so a replica still serving the old
certificate keeps being trusted.

``--cert-mode cert-manager`` or ``files``: someone else writes ``tls.crt``/``tls.key`` into the cert
directory (a mounted Secret); the controller only reads them, and the server reloads them when they
change.

One module for the concept: the certificate primitives (CA, serving certificate, files), the
``CertificateStore`` seam with its API-server implementation (``ClusterCertificateStore``, the only
code that knows which REST resources hold certificates; tests use a small in-memory fake), and the
reconcile loop (``CertificateManager``).
"""

from __future__ import annotations

import base64
import binascii
import copy
import enum
import ipaddress
import logging
import os
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final, Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from api import wire
from driver.cluster import views
from driver.cluster.clock import Clock
from driver.cluster.port import ClusterApi, Resource
from driver.errors import (
    AlreadyExistsError,
    ApiNotFoundError,
    ConfigError,
    ConflictError,
    DriverError,
)

_log = logging.getLogger(__name__)

CERT_FILE: Final = "tls.crt"
KEY_FILE: Final = "tls.key"
CA_FILE: Final = "ca.crt"
CA_KEY: Final = "ca.key"
"""Secret key of the CA's private key (only in our own Secret, never written to the cert dir)."""

_CLOCK_SKEW: Final = timedelta(minutes=5)


class CertMode(enum.StrEnum):
    SELF = "self"
    """Generate, store in a Secret, patch ``caBundle``, rotate."""
    CERT_MANAGER = "cert-manager"
    """cert-manager writes the files and injects the CA; we only read."""
    FILES = "files"
    """An operator provides the files and the ``caBundle``; we only read."""


class CertificateStore(Protocol):
    """Where certificates live in the cluster. Writes are optimistic: ``update_*`` send
    ``metadata.resourceVersion`` and raise ``ConflictError`` when it is stale; ``create_secret``
    raises ``AlreadyExistsError`` when the name is taken."""

    def get_secret(self, *, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create_secret(self, secret: wire.Secret) -> dict[str, Any]: ...

    def update_secret(self, secret: dict[str, Any]) -> dict[str, Any]: ...

    def get_webhook_configuration(self, *, name: str) -> dict[str, Any] | None:
        """A MutatingWebhookConfiguration, or ``None`` when it does not exist."""
        ...

    def update_webhook_configuration(self, configuration: dict[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class CertificateSettings:
    service: str
    namespace: str
    secret_name: str = "instaslice-webhook-cert"  # noqa: S105 (a Secret's name, not a password)
    webhook_configuration: str | None = "instaslice-pod-gate"
    """Whose ``caBundle`` we keep current; ``None`` to leave every configuration alone."""
    extra_names: tuple[str, ...] = ()
    """More subject alternative names: IP addresses (``127.0.0.1``) or DNS names."""
    serving_validity: timedelta = timedelta(days=365)
    ca_validity: timedelta = timedelta(days=10 * 365)
    renew_before: timedelta = timedelta(days=30)

    def dns_names(self) -> list[str]:
        base = f"{self.service}.{self.namespace}"
        names = [f"{base}.svc", f"{base}.svc.cluster.local", base, self.service]
        names += [n for n in self.extra_names if not _is_ip(n)]
        return list(dict.fromkeys(names))

    def ip_addresses(self) -> list[str]:
        return [n for n in self.extra_names if _is_ip(n)]


@dataclass(frozen=True, slots=True)
class ServingCertificate:
    cert_pem: bytes
    key_pem: bytes
    ca_bundle_pem: bytes
    """Every CA a client should trust now (the current one first)."""
    not_after: datetime


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def generate_ca(*, common_name: str, now: datetime, validity: timedelta) -> tuple[bytes, bytes]:
    """A self-signed CA that may only sign leaf certificates: (cert PEM, key PEM)."""
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage(ca=True),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def issue_serving_certificate(
    *,
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str] = (),
    now: datetime,
    validity: timedelta,
) -> tuple[bytes, bytes]:
    """A TLS server certificate for the given names, signed by the CA: (cert PEM, key PEM)."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ConfigError("the webhook CA key must be an EC key")
    key = _new_key()
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    not_after = min(now + validity, ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            _key_usage(ca=False),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """Digital signatures (ECDSA TLS) only; a CA also signs certificates and CRLs."""
    return x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=ca,
        crl_sign=ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )


def renewal_due(cert: x509.Certificate, *, now: datetime, renew_before: timedelta) -> bool:
    """Renew at two thirds of the lifetime, or when less than ``renew_before`` is left."""
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    two_thirds = start + (end - start) * 2 / 3
    return now >= two_thirds or end - now < renew_before


def certificate_names(cert: x509.Certificate) -> tuple[set[str], set[str]]:
    """(DNS names, IP addresses) of a certificate's subject alternative names."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set(), set()
    dns = set(sans.get_values_for_type(x509.DNSName))
    ips = {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    return dns, ips


def write_certificate_files(cert_dir: Path, serving: ServingCertificate) -> bool:
    """Write ``tls.crt``, ``tls.key`` and ``ca.crt`` atomically; whether anything changed.

    The key is written before the certificate so a reader that sees the new certificate finds its
    key; a reader that catches the pair mid-way fails to load it and keeps its old context.
    """
    cert_dir.mkdir(parents=True, exist_ok=True)
    changed = False
    for filename, content, mode in (
        (KEY_FILE, serving.key_pem, 0o600),
        (CERT_FILE, serving.cert_pem, 0o644),
        (CA_FILE, serving.ca_bundle_pem, 0o644),
    ):
        target = cert_dir / filename
        if target.exists() and target.read_bytes() == content:
            continue
        descriptor, temporary = tempfile.mkstemp(dir=cert_dir, prefix=f".{filename}.")
        try:
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(content)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(temporary, mode)
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        changed = True
    return changed


# ---------------------------------------------------------------------------------------------
# the store over the ClusterApi port


SECRETS: Final = Resource(group="", version="v1", plural="secrets", kind="Secret", namespaced=True)
MUTATING_WEBHOOK_CONFIGURATIONS: Final = Resource(
    group="admissionregistration.k8s.io",
    version="v1",
    plural="mutatingwebhookconfigurations",
    kind="MutatingWebhookConfiguration",
    namespaced=False,
)


class ClusterCertificateStore:
    """Satisfies ``CertificateStore`` with the API server's own semantics."""

    def __init__(self, api: ClusterApi) -> None:
        self._api = api

    def get_secret(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._api.get(SECRETS, name=name, namespace=namespace)
        except ApiNotFoundError:
            return None

    def create_secret(self, secret: wire.Secret) -> dict[str, Any]:
        return self._api.create(SECRETS, secret)

    def update_secret(self, secret: dict[str, Any]) -> dict[str, Any]:
        return self._api.update(SECRETS, secret)

    def get_webhook_configuration(self, *, name: str) -> dict[str, Any] | None:
        try:
            return self._api.get(MUTATING_WEBHOOK_CONFIGURATIONS, name=name)
        except ApiNotFoundError:
            return None

    def update_webhook_configuration(self, configuration: dict[str, Any]) -> dict[str, Any]:
        return self._api.update(MUTATING_WEBHOOK_CONFIGURATIONS, configuration)


# ---------------------------------------------------------------------------------------------
# the reconcile loop of --cert-mode self


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
                    self._store.create_secret(self._new_secret(fresh))
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
                self._store.update_secret(self._renewed_secret(fresh, base=secret))
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

    def _new_secret(self, stored: _Stored) -> wire.Secret:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": self._settings.secret_name,
                "namespace": self._settings.namespace,
                "labels": dict(_LABELS),
            },
            "type": "kubernetes.io/tls",
            "data": _encoded(stored),
        }

    @staticmethod
    def _renewed_secret(stored: _Stored, *, base: dict[str, Any]) -> dict[str, Any]:
        """``base`` (the Secret as read) holding ``stored``; its other keys are kept."""
        secret = copy.deepcopy(base)
        secret.pop("stringData", None)
        secret["data"] = {**views.mapping(views.path(base, "data")), **_encoded(stored)}
        return secret

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


def _encoded(stored: _Stored) -> dict[str, str]:
    """A Secret's ``data``: the certificates and keys, base64-encoded."""
    data = {
        CERT_FILE: stored.cert_pem,
        KEY_FILE: stored.key_pem,
        CA_FILE: stored.ca_bundle_pem,
        CA_KEY: stored.ca_key_pem,
    }
    return {key: base64.b64encode(value).decode() for key, value in data.items()}


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
