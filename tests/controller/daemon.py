"""``instaslice-controller`` as a process against the local API server, shared by the tests of the
daemon (``test_main.py``) and of its webhook process (``test_webhook_process.py``): the webhook
configuration ``deploy/`` ships, the daemon's command line, and plain HTTP probes. The fixtures
``webhook_port`` and ``gated_server`` are in ``conftest.py``."""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from driver.cluster.port import JsonObject, Resource
from tests.controller.harness import NS

ROOT = Path(__file__).resolve().parents[2]
WEBHOOK_CONFIGURATIONS = Resource(
    group="admissionregistration.k8s.io",
    version="v1",
    plural="mutatingwebhookconfigurations",
    kind="MutatingWebhookConfiguration",
    namespaced=False,
)


def http_get(url: str) -> tuple[int, str]:
    """Status and body; status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


def webhook_configuration(*, failure_policy: str) -> JsonObject:
    """Our pod-gating webhook registered by its Service (``caBundle`` left to the daemon)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "instaslice-pod-gate"},
        "webhooks": [
            {
                "name": "pod-gate.instaslice.dev",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {
                    "service": {
                        "name": "instaslice-webhook",
                        "namespace": NS,
                        "path": "/mutate-v1-pod",
                        "port": 443,
                    }
                },
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
                "timeoutSeconds": 5,
            }
        ],
    }


def controller_command(
    api_url: str, *, webhook_port: int, cert_dir: Path, healthz_port: int, extra: Sequence[str]
) -> list[str]:
    """``python -m controller`` on ``api_url`` with a self-managed webhook certificate."""
    return [
        sys.executable, "-m", "controller", "--kube-api-url", api_url, "--namespace", NS,
        "--webhook-port", str(webhook_port), "--webhook-cert-dir", str(cert_dir),
        "--cert-mode", "self", "--healthz-address", f"127.0.0.1:{healthz_port}", *extra,
    ]  # fmt: skip
