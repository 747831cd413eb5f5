"""Contract: mutating webhooks are called like kube-apiserver calls them (AdmissionReview v1 over
verified HTTPS), their JSONPatch applied, their denials and failures reported the same way."""

from __future__ import annotations

import base64
import contextlib
import datetime
import ipaddress
import json
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes import client
from kubernetes.client import ApiException

from localcluster.admission import match_conditions_hold
from localcluster.apiserver import LocalApiServer
from localcluster.testing import api_client, close_client
from tests.localcluster.helpers import NS, pod, status_of

REPO = Path(__file__).resolve().parents[2]

GATE = "instaslice.dev/placement"
SERVICE_DNS = "hook.instaslice-system.svc"
Reply = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Tls:
    ca_pem: bytes
    cert_file: Path
    key_file: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _make_tls(directory: Path) -> Tls:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("test-ca"))
        .issuer_name(_name("test-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName(SERVICE_DNS), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(SERVICE_DNS))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_file, key_file = directory / "tls.crt", directory / "tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return Tls(ca.public_bytes(serialization.Encoding.PEM), cert_file, key_file)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return _make_tls(tmp_path_factory.mktemp("tls"))


def allow(review: dict[str, Any], patch: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": True}
    if patch is not None:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


@dataclass
class Hook:
    """A tiny HTTPS admission webhook: records every review, answers with ``reply``."""

    port: int
    reviews: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    reply: Reply = allow


def add_gate(review: dict[str, Any]) -> dict[str, Any]:
    return allow(
        review, [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}]
    )


@pytest.fixture
def hook(tls: Tls) -> Iterator[Hook]:
    state = Hook(port=0)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.reviews.append(review)
            state.paths.append(self.path)
            body = json.dumps(state.reply(review)).encode()
            with contextlib.suppress(OSError):  # the API server may have given up (timeout test)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls.cert_file, tls.key_file)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01})
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


@pytest.fixture
def core(hook: Hook) -> Iterator[Any]:
    resolved: list[tuple[str, str, int]] = []

    def resolve(namespace: str, name: str, port: int) -> str:
        resolved.append((namespace, name, port))
        return f"https://127.0.0.1:{hook.port}"

    with LocalApiServer(service_resolver=resolve) as server:
        api = api_client(server)
        try:
            yield client.CoreV1Api(api)
        finally:
            close_client(api)


def _configuration(
    tls: Tls,
    *,
    client_config: dict[str, Any] | None = None,
    failure_policy: str = "Fail",
    timeout_seconds: int = 5,
    **selectors: Any,
) -> dict[str, Any]:
    config = client_config or {
        "service": {
            "namespace": "instaslice-system",
            "name": "hook",
            "port": 9443,
            "path": "/mutate",
        }
    }
    config = {"caBundle": base64.b64encode(tls.ca_pem).decode(), **config}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "instaslice"},
        "webhooks": [
            {
                "name": "pods.instaslice.dev",
                "clientConfig": config,
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                    }
                ],
                "failurePolicy": failure_policy,
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": timeout_seconds,
                **selectors,
            }
        ],
    }


def _install(core: Any, configuration: dict[str, Any]) -> None:
    admission: Any = client.AdmissionregistrationV1Api(core.api_client)
    admission.create_mutating_webhook_configuration(configuration)


def test_webhook_patch_is_applied_on_create(core: Any, hook: Hook, tls: Tls) -> None:
    hook.reply = add_gate
    _install(core, _configuration(tls))

    created = core.create_namespaced_pod(NS, pod("p"))

    assert [g.name for g in created.spec.scheduling_gates] == [GATE]
    request = hook.reviews[0]["request"]
    assert hook.reviews[0]["apiVersion"] == "admission.k8s.io/v1"
    assert request["operation"] == "CREATE"
    assert request["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert request["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert request["namespace"] == NS
    assert request["object"]["metadata"]["name"] == "p"
    assert request["oldObject"] is None
    assert hook.paths == ["/mutate?timeout=5s"]


def test_webhook_sees_generate_name_before_the_name_exists(core: Any, hook: Hook, tls: Tls) -> None:
    _install(core, _configuration(tls))
    body = pod()
    body["metadata"] = {"generateName": "job-"}

    created = core.create_namespaced_pod(NS, body)

    assert hook.reviews[0]["request"]["name"] == ""
    assert created.metadata.name.startswith("job-")


def test_webhook_is_not_called_for_updates_it_did_not_ask_for(
    core: Any, hook: Hook, tls: Tls
) -> None:
    _install(core, _configuration(tls))
    core.create_namespaced_pod(NS, pod("p"))

    core.patch_namespaced_pod("p", NS, {"metadata": {"labels": {"a": "b"}}})

    assert [r["request"]["operation"] for r in hook.reviews] == ["CREATE"]


def test_webhook_denial_is_the_create_error(core: Any, hook: Hook, tls: Tls) -> None:
    def deny(review: dict[str, Any]) -> dict[str, Any]:
        answer = allow(review)
        answer["response"].update(allowed=False, status={"code": 403, "message": "no MIG for you"})
        return answer

    hook.reply = deny
    _install(core, _configuration(tls))

    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod("p"))

    assert caught.value.status == 403
    assert status_of(caught.value)["message"] == (
        'admission webhook "pods.instaslice.dev" denied the request: no MIG for you'
    )
    assert core.list_namespaced_pod(NS).items == []


@pytest.mark.parametrize(
    ("failure_policy", "created"),
    [("Fail", False), ("Ignore", True)],
    ids=["fail", "ignore"],
)
def test_unreachable_webhook_follows_failure_policy(
    core: Any, tls: Tls, failure_policy: str, created: bool
) -> None:
    unreachable = {"url": "https://127.0.0.1:1/mutate"}
    _install(core, _configuration(tls, client_config=unreachable, failure_policy=failure_policy))

    try:
        core.create_namespaced_pod(NS, pod("p"))
        error = None
    except ApiException as exc:
        error = exc

    assert (error is None) == created
    if error is not None:
        assert error.status == 500
        assert 'failed calling webhook "pods.instaslice.dev"' in status_of(error)["message"]


def test_webhook_certificate_is_verified_against_ca_bundle(
    core: Any, hook: Hook, tmp_path: Path
) -> None:
    other_ca = _make_tls(tmp_path)
    _install(core, _configuration(other_ca))

    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod("p"))

    assert caught.value.status == 500
    assert hook.reviews == []


def test_webhook_by_url(core: Any, hook: Hook, tls: Tls) -> None:
    hook.reply = add_gate
    _install(core, _configuration(tls, client_config={"url": f"https://127.0.0.1:{hook.port}/m"}))

    created = core.create_namespaced_pod(NS, pod("p"))

    assert created.spec.scheduling_gates is not None


def test_webhook_timeout(core: Any, hook: Hook, tls: Tls) -> None:
    def slow(review: dict[str, Any]) -> dict[str, Any]:
        time.sleep(1.5)
        return allow(review)

    hook.reply = slow
    _install(core, _configuration(tls, timeout_seconds=1))

    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod("p"))

    assert caught.value.status == 500


def test_webhook_answer_for_another_request_is_a_failure(core: Any, hook: Hook, tls: Tls) -> None:
    def wrong_uid(review: dict[str, Any]) -> dict[str, Any]:
        answer = allow(review)
        answer["response"]["uid"] = "something-else"
        return answer

    hook.reply = wrong_uid
    _install(core, _configuration(tls))

    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod("p"))

    assert caught.value.status == 500


@pytest.mark.parametrize(
    ("selectors", "called"),
    [
        ({"objectSelector": {"matchLabels": {"gpu": "yes"}}}, True),
        ({"objectSelector": {"matchLabels": {"gpu": "no"}}}, False),
        (
            {"objectSelector": {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}},
            True,
        ),
        (
            {
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                         "values": ["kube-system", NS]}
                    ]
                }
            },
            False,
        ),
        ({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}}}, True),
    ],
    ids=["object-match", "object-mismatch", "object-exists", "namespace-excluded", "namespace-match"],
)  # fmt: skip
def test_webhook_selectors(
    core: Any, hook: Hook, tls: Tls, selectors: dict[str, Any], called: bool
) -> None:
    _install(core, _configuration(tls, **selectors))
    body = pod("p")
    body["metadata"]["labels"] = {"gpu": "yes"}

    core.create_namespaced_pod(NS, body)

    assert bool(hook.reviews) == called


def test_webhook_configuration_is_validated(core: Any, tls: Tls) -> None:
    configuration = _configuration(tls)
    configuration["webhooks"][0]["admissionReviewVersions"] = ["v1beta1"]

    with pytest.raises(ApiException) as caught:
        _install(core, configuration)

    assert caught.value.status == 422


def test_match_conditions_evaluated_from_many_threads_give_one_answer() -> None:
    """The local API server admits from one thread per request; celpy compiled expressions wrong
    when several compiled at once (a true condition read false, a webhook silently skipped)."""
    docs = yaml.safe_load_all((REPO / "deploy" / "base" / "webhook.yaml").read_text())
    hooks = [
        hook
        for doc in docs
        if doc and doc.get("kind") == "MutatingWebhookConfiguration"
        for hook in doc["webhooks"]
        if all("pods" in rule["resources"] for rule in hook["rules"])  # the pod entries
    ]
    pod = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "resourceClaims": [{"name": "mig", "resourceClaimTemplateName": "t"}],
            "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "mig"}]}}],
        },
    }
    expected = [match_conditions_hold(hook, pod, None) for hook in hooks]
    assert expected == [False, True]  # the classic webhook skips it, the claims webhook takes it
    answers: list[list[bool]] = []

    def admit_many() -> None:
        for _ in range(150):
            answers.append([match_conditions_hold(hook, pod, None) for hook in hooks])

    threads = [threading.Thread(target=admit_many) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 1200
    assert all(answer == expected for answer in answers)
