"""Self-managed webhook certificates: issuing, storing, rotating, and two replicas at once."""

import base64
import stat
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from controller.webhook.certificates import (
    CA_FILE,
    CA_KEY,
    CERT_FILE,
    KEY_FILE,
    MUTATING_WEBHOOK_CONFIGURATIONS,
    SECRETS,
    CertificateManager,
    CertificateSettings,
    CertMode,
    ClusterCertificateStore,
    ServingCertificate,
    certificate_names,
    generate_ca,
    issue_serving_certificate,
    renewal_due,
    write_certificate_files,
)
from driver.cluster.port import Resource
from driver.errors import ApiNotFoundError, ConflictError
from tests.controller.certfakes import WEBHOOK_CONFIGURATION, InMemoryCertificateStore, StepClock

SETTINGS = CertificateSettings(
    service="instaslice-webhook", namespace="instaslice-system", extra_names=("127.0.0.1",)
)
SECRET_KEY = ("instaslice-system", "instaslice-webhook-cert")


def manager(
    store: InMemoryCertificateStore, tmp_path: Path, clock: StepClock, **overrides: Any
) -> CertificateManager:
    settings = CertificateSettings(**{**_fields(SETTINGS), **overrides})
    return CertificateManager(store, settings=settings, cert_dir=tmp_path / "certs", clock=clock)


def _fields(settings: CertificateSettings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in settings.__dataclass_fields__}


def secret_cert(store: InMemoryCertificateStore, key: str = CERT_FILE) -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(store.secrets[SECRET_KEY]["data"][key]))


def bundle_of(store: InMemoryCertificateStore) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(
        base64.b64decode(store.secrets[SECRET_KEY]["data"][CA_FILE])
    )


def test_issued_certificate_names_the_service_and_chains_to_the_ca() -> None:
    clock = StepClock()
    ca_pem, ca_key = generate_ca(
        common_name="test-ca", now=clock.now(), validity=timedelta(days=3650)
    )
    cert_pem, _ = issue_serving_certificate(
        ca_cert_pem=ca_pem,
        ca_key_pem=ca_key,
        dns_names=SETTINGS.dns_names(),
        ip_addresses=SETTINGS.ip_addresses(),
        now=clock.now(),
        validity=timedelta(days=365),
    )
    ca, cert = x509.load_pem_x509_certificate(ca_pem), x509.load_pem_x509_certificate(cert_pem)
    cert.verify_directly_issued_by(ca)
    dns, ips = certificate_names(cert)
    assert dns == {
        "instaslice-webhook.instaslice-system.svc",
        "instaslice-webhook.instaslice-system.svc.cluster.local",
        "instaslice-webhook.instaslice-system",
        "instaslice-webhook",
    }
    assert ips == {"127.0.0.1"}
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert abs(cert.not_valid_after_utc - clock.now() - timedelta(days=365)) < timedelta(seconds=1)


def test_serving_certificate_never_outlives_its_ca() -> None:
    clock = StepClock()
    ca_pem, ca_key = generate_ca(common_name="short", now=clock.now(), validity=timedelta(days=10))
    cert_pem, _ = issue_serving_certificate(
        ca_cert_pem=ca_pem,
        ca_key_pem=ca_key,
        dns_names=["a.b.svc"],
        now=clock.now(),
        validity=timedelta(days=365),
    )
    ca, cert = x509.load_pem_x509_certificate(ca_pem), x509.load_pem_x509_certificate(cert_pem)
    assert cert.not_valid_after_utc == ca.not_valid_after_utc


@pytest.mark.parametrize(
    ("age_days", "lifetime_days", "due"),
    [
        (0, 365, False),
        (240, 365, False),
        (244, 365, True),
        (0, 20, True),
        (5, 90, False),
        (61, 90, True),
    ],
    ids=["new", "before-two-thirds", "after-two-thirds", "short-lived", "young", "old"],
)
def test_renewal_at_two_thirds_or_thirty_days_left(
    age_days: int, lifetime_days: int, due: bool
) -> None:
    clock = StepClock()
    ca_pem, _ = generate_ca(
        common_name="ca", now=clock.now(), validity=timedelta(days=lifetime_days)
    )
    clock.advance(timedelta(days=age_days))
    ca = x509.load_pem_x509_certificate(ca_pem)
    assert renewal_due(ca, now=clock.now(), renew_before=timedelta(days=30)) is due


def test_first_reconcile_creates_secret_files_and_ca_bundle(tmp_path: Path) -> None:
    store = InMemoryCertificateStore()
    serving = manager(store, tmp_path, StepClock()).reconcile()

    secret = store.secrets[SECRET_KEY]
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {CERT_FILE, KEY_FILE, CA_FILE, CA_KEY}
    cert_dir = tmp_path / "certs"
    assert (cert_dir / CERT_FILE).read_bytes() == serving.cert_pem
    assert (cert_dir / KEY_FILE).read_bytes() == serving.key_pem
    assert (cert_dir / CA_FILE).read_bytes() == serving.ca_bundle_pem
    assert not (cert_dir / CA_KEY).exists()
    assert stat.S_IMODE((cert_dir / KEY_FILE).stat().st_mode) == 0o600
    wanted = base64.b64encode(serving.ca_bundle_pem).decode()
    hooks = store.configurations[WEBHOOK_CONFIGURATION]["webhooks"]
    assert [h["clientConfig"]["caBundle"] for h in hooks] == [wanted, wanted]
    assert hooks[0]["clientConfig"]["service"] == {"name": "instaslice-webhook"}
    assert store.writes == ["create_secret", "update_webhook_configuration"]


def test_reconcile_is_a_no_op_when_everything_is_current(tmp_path: Path) -> None:
    store = InMemoryCertificateStore()
    subject = manager(store, tmp_path, StepClock())
    first = subject.reconcile()
    store.writes.clear()
    assert subject.reconcile() == first
    assert store.writes == []


def test_serving_certificate_is_renewed_with_the_same_ca(tmp_path: Path) -> None:
    store, clock = InMemoryCertificateStore(), StepClock()
    subject = manager(store, tmp_path, clock)
    first = subject.reconcile()
    ca_before = bundle_of(store)
    store.writes.clear()

    clock.advance(timedelta(days=250))  # past two thirds of 365 days
    renewed = subject.reconcile()

    assert renewed.cert_pem != first.cert_pem
    assert bundle_of(store) == ca_before
    assert store.writes == ["update_secret"]  # caBundle unchanged: no configuration write
    assert (tmp_path / "certs" / CERT_FILE).read_bytes() == renewed.cert_pem
    assert secret_cert(store).not_valid_before_utc > first.not_after - timedelta(days=365)


def test_ca_rotation_keeps_the_old_ca_trusted_while_it_is_valid(tmp_path: Path) -> None:
    store, clock = InMemoryCertificateStore(), StepClock()
    subject = manager(
        store, tmp_path, clock, ca_validity=timedelta(days=90), serving_validity=timedelta(days=30)
    )
    subject.reconcile()
    (old_ca,) = bundle_of(store)

    clock.advance(timedelta(days=61))
    subject.reconcile()
    new_ca, kept = bundle_of(store)
    assert kept == old_ca
    assert new_ca != old_ca
    secret_cert(store).verify_directly_issued_by(new_ca)
    wanted = store.secrets[SECRET_KEY]["data"][CA_FILE]
    assert (
        store.configurations[WEBHOOK_CONFIGURATION]["webhooks"][0]["clientConfig"]["caBundle"]
        == wanted
    )

    clock.advance(timedelta(days=31))  # the old CA has expired; next renewal drops it
    subject.reconcile()
    assert old_ca not in bundle_of(store)


def test_changed_service_names_reissue_the_certificate(tmp_path: Path) -> None:
    store, clock = InMemoryCertificateStore(), StepClock()
    manager(store, tmp_path, clock).reconcile()
    serving = manager(store, tmp_path, clock, extra_names=("127.0.0.1", "localhost")).reconcile()
    dns, _ = certificate_names(x509.load_pem_x509_certificate(serving.cert_pem))
    assert "localhost" in dns


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data.pop(CA_KEY),
        lambda data: data.__setitem__(CERT_FILE, "not base64!"),
        lambda data: data.__setitem__(KEY_FILE, base64.b64encode(b"junk").decode()),
        lambda data: data.__setitem__(
            CA_FILE, base64.b64encode(b"-----BEGIN CERTIFICATE-----").decode()
        ),
    ],
    ids=["no-ca-key", "bad-base64", "junk-key", "junk-ca"],
)
def test_a_damaged_secret_is_replaced(tmp_path: Path, damage: Any) -> None:
    store, clock = InMemoryCertificateStore(), StepClock()
    manager(store, tmp_path, clock).reconcile()
    damage(store.secrets[SECRET_KEY]["data"])
    serving = manager(store, tmp_path, clock).reconcile()
    assert set(store.secrets[SECRET_KEY]["data"]) == {CERT_FILE, KEY_FILE, CA_FILE, CA_KEY}
    x509.load_pem_x509_certificate(serving.cert_pem).verify_directly_issued_by(bundle_of(store)[0])


def test_two_replicas_creating_at_once_end_with_one_certificate(tmp_path: Path) -> None:
    store, clock = InMemoryCertificateStore(), StepClock()
    replica_a = manager(store, tmp_path / "a", clock)
    replica_b = manager(store, tmp_path / "b", clock)
    winner: dict[str, ServingCertificate] = {}
    # B creates the Secret between A's read and A's create
    store.before_write = lambda what: winner.setdefault("b", replica_b.reconcile())
    from_a = replica_a.reconcile()
    assert from_a == winner["b"]
    assert store.writes.count("create_secret") == 1
    assert (tmp_path / "a" / "certs" / CERT_FILE).read_bytes() == (
        tmp_path / "b" / "certs" / CERT_FILE
    ).read_bytes()


def test_two_replicas_renewing_at_once_adopt_the_winner(tmp_path: Path) -> None:
    store, clock = InMemoryCertificateStore(), StepClock()
    replica_a = manager(store, tmp_path / "a", clock)
    replica_b = manager(store, tmp_path / "b", clock)
    replica_a.reconcile()
    clock.advance(timedelta(days=250))
    store.writes.clear()
    winner: dict[str, ServingCertificate] = {}
    store.before_write = lambda what: winner.setdefault("b", replica_b.reconcile())
    from_a = replica_a.reconcile()  # A's update conflicts; it re-reads B's fresh certificate
    assert from_a == winner["b"]
    assert store.writes == ["update_secret"]


def test_ca_bundle_update_conflict_is_retried(tmp_path: Path) -> None:
    store = InMemoryCertificateStore()

    def someone_edits(what: str) -> None:
        assert what == "create_secret"
        store.before_write = lambda _: store.configurations[WEBHOOK_CONFIGURATION][
            "metadata"
        ].update(resourceVersion="edited-by-someone")

    store.before_write = someone_edits
    serving = manager(store, tmp_path, StepClock()).reconcile()
    hook = store.configurations[WEBHOOK_CONFIGURATION]["webhooks"][0]
    assert hook["clientConfig"]["caBundle"] == base64.b64encode(serving.ca_bundle_pem).decode()


def test_endless_conflicts_give_up_with_a_conflict_error(tmp_path: Path) -> None:
    class AlwaysConflicting(InMemoryCertificateStore):
        def update_secret(self, secret: dict[str, Any]) -> dict[str, Any]:
            raise ConflictError("the object has been modified")

    store, clock = AlwaysConflicting(), StepClock()
    manager(store, tmp_path, clock).reconcile()
    clock.advance(timedelta(days=300))
    with pytest.raises(ConflictError, match="kept changing"):
        manager(store, tmp_path, clock).reconcile()


def test_missing_webhook_configuration_is_not_fatal(tmp_path: Path) -> None:
    store = InMemoryCertificateStore(with_webhook_configuration=False)
    assert manager(store, tmp_path, StepClock()).reconcile().cert_pem
    store_b = InMemoryCertificateStore()
    manager(store_b, tmp_path, StepClock(), webhook_configuration=None).reconcile()
    assert "update_webhook_configuration" not in store_b.writes


def test_odd_webhook_entries_do_not_stop_the_ca_bundle_update(tmp_path: Path) -> None:
    """The configuration is someone else's object: an entry that is not an object is left as it is,
    a null ``clientConfig`` gets one, and the other entries still get the bundle."""
    store = InMemoryCertificateStore()
    hooks = store.configurations[WEBHOOK_CONFIGURATION]["webhooks"]
    hooks[1]["clientConfig"] = None
    hooks.append("not-a-webhook")
    serving = manager(store, tmp_path, StepClock()).reconcile()
    wanted = base64.b64encode(serving.ca_bundle_pem).decode()
    updated = store.configurations[WEBHOOK_CONFIGURATION]["webhooks"]
    assert [h["clientConfig"]["caBundle"] for h in updated[:2]] == [wanted, wanted]
    assert updated[2] == "not-a-webhook"


def test_write_certificate_files_reports_changes(tmp_path: Path) -> None:
    serving = ServingCertificate(
        cert_pem=b"c", key_pem=b"k", ca_bundle_pem=b"a", not_after=StepClock().now()
    )
    assert write_certificate_files(tmp_path, serving) is True
    assert write_certificate_files(tmp_path, serving) is False
    assert sorted(p.name for p in tmp_path.iterdir()) == [CA_FILE, CERT_FILE, KEY_FILE]


def test_cert_modes() -> None:
    assert [m.value for m in CertMode] == ["self", "cert-manager", "files"]
    assert CertMode("cert-manager") is CertMode.CERT_MANAGER


class _RecordingApi:
    """Just enough of ``ClusterApi`` for the store adapter."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []

    def get(self, resource: Resource, *, name: str, namespace: str | None = None) -> dict[str, Any]:
        self.calls.append(("get", resource.plural))
        try:
            return self.objects[(resource.plural, namespace, name)]
        except KeyError:
            raise ApiNotFoundError(f"{resource.plural} {name!r} not found") from None

    def create(
        self, resource: Resource, obj: dict[str, Any], *, namespace: str | None = None
    ) -> dict[str, Any]:
        self.calls.append(("create", resource.plural))
        meta = obj["metadata"]
        self.objects[(resource.plural, meta.get("namespace"), meta["name"])] = obj
        return obj

    def update(self, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("update", resource.plural))
        return obj


def test_cluster_store_maps_not_found_to_none_and_uses_the_right_resources() -> None:
    api = _RecordingApi()
    store = ClusterCertificateStore(api)  # type: ignore[arg-type]
    assert store.get_secret(namespace="ns", name="s") is None
    assert store.get_webhook_configuration(name="w") is None
    store.create_secret({"metadata": {"name": "s", "namespace": "ns"}})
    assert store.get_secret(namespace="ns", name="s") == {
        "metadata": {"name": "s", "namespace": "ns"}
    }
    store.update_secret({"metadata": {"name": "s", "namespace": "ns"}})
    store.update_webhook_configuration({"metadata": {"name": "w"}})
    assert ("update", MUTATING_WEBHOOK_CONFIGURATIONS.plural) in api.calls
    assert ("create", SECRETS.plural) in api.calls
    assert MUTATING_WEBHOOK_CONFIGURATIONS.path(name="w") == (
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/w"
    )
