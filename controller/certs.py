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
"""

from __future__ import annotations

import enum
import ipaddress
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final, Protocol

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from driver.errors import ConfigError

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

    def create_secret(self, secret: dict[str, Any]) -> dict[str, Any]: ...

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
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
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
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=False,
                crl_sign=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
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
