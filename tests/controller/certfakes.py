"""In-memory fakes for the certificate seams, shared by the cert and webhook-server tests."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from api import wire
from driver.cluster.port import as_json
from driver.errors import AlreadyExistsError, ConflictError

WEBHOOK_CONFIGURATION = "instaslice-pod-gate"


class StepClock:
    """Wall time anchored at the real now (so real TLS verification accepts the certificates),
    moved forward only by ``advance``."""

    def __init__(self) -> None:
        self._now = datetime.now(UTC)
        self._mono = 0.0

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, delta: timedelta) -> None:
        self._now += delta
        self._mono += delta.total_seconds()


class InMemoryCertificateStore:
    """``CertificateStore`` with the API server's optimistic concurrency: resourceVersions, 409s.

    ``before_write`` runs just before each create/update is applied — the hook tests use to let
    "another replica" write first.
    """

    def __init__(self, *, with_webhook_configuration: bool = True) -> None:
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.configurations: dict[str, dict[str, Any]] = {}
        self.writes: list[str] = []
        self.before_write: Callable[[str], object] | None = None
        self._version = 0
        if with_webhook_configuration:
            self.configurations[WEBHOOK_CONFIGURATION] = {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": WEBHOOK_CONFIGURATION, "resourceVersion": self._next()},
                "webhooks": [
                    {
                        "name": "pod-gate.instaslice.dev",
                        "clientConfig": {"service": {"name": "instaslice-webhook"}},
                    },
                    {"name": "second.instaslice.dev", "clientConfig": {"caBundle": "b2xk"}},
                ],
            }

    def _next(self) -> str:
        self._version += 1
        return str(self._version)

    def _hook(self, what: str) -> None:
        hook, self.before_write = self.before_write, None
        if hook is not None:
            hook(what)

    def get_secret(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.secrets.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def create_secret(self, secret: wire.Secret) -> dict[str, Any]:
        self._hook("create_secret")
        key = (secret["metadata"]["namespace"], secret["metadata"]["name"])
        if key in self.secrets:
            raise AlreadyExistsError(f"secrets {key[1]!r} already exists")
        stored = copy.deepcopy(as_json(secret))
        stored["metadata"]["resourceVersion"] = self._next()
        self.secrets[key] = stored
        self.writes.append("create_secret")
        return copy.deepcopy(stored)

    def update_secret(self, secret: dict[str, Any]) -> dict[str, Any]:
        self._hook("update_secret")
        key = (secret["metadata"]["namespace"], secret["metadata"]["name"])
        current = self.secrets[key]
        if secret["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ConflictError("the object has been modified")
        stored = copy.deepcopy(secret)
        stored["metadata"]["resourceVersion"] = self._next()
        self.secrets[key] = stored
        self.writes.append("update_secret")
        return copy.deepcopy(stored)

    def get_webhook_configuration(self, *, name: str) -> dict[str, Any] | None:
        found = self.configurations.get(name)
        return copy.deepcopy(found) if found is not None else None

    def update_webhook_configuration(self, configuration: dict[str, Any]) -> dict[str, Any]:
        self._hook("update_webhook_configuration")
        name = configuration["metadata"]["name"]
        current = self.configurations[name]
        if (
            configuration["metadata"].get("resourceVersion")
            != current["metadata"]["resourceVersion"]
        ):
            raise ConflictError("the object has been modified")
        stored = copy.deepcopy(configuration)
        stored["metadata"]["resourceVersion"] = self._next()
        self.configurations[name] = stored
        self.writes.append("update_webhook_configuration")
        return copy.deepcopy(stored)
