"""``CertificateStore`` over the ``ClusterApi`` port: the webhook Secret and webhook configuration.

Kept apart from ``cert_manager`` so the manager's tests use a small in-memory fake, and this file is
the only place that knows which REST resources hold certificates.
"""

from __future__ import annotations

from typing import Any, Final

from driver.cluster.port import ClusterApi, Resource
from driver.errors import ApiNotFoundError

SECRETS: Final = Resource(group="", version="v1", plural="secrets", kind="Secret", namespaced=True)
MUTATING_WEBHOOK_CONFIGURATIONS: Final = Resource(
    group="admissionregistration.k8s.io",
    version="v1",
    plural="mutatingwebhookconfigurations",
    kind="MutatingWebhookConfiguration",
    namespaced=False,
)


class ClusterCertificateStore:
    """Satisfies ``controller.certs.CertificateStore`` with the API server's own semantics."""

    def __init__(self, api: ClusterApi) -> None:
        self._api = api

    def get_secret(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._api.get(SECRETS, name=name, namespace=namespace)
        except ApiNotFoundError:
            return None

    def create_secret(self, secret: dict[str, Any]) -> dict[str, Any]:
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
