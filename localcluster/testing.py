"""Helpers for tests that talk to a :class:`~localcluster.apiserver.LocalApiServer` with the real
``kubernetes`` client."""

from __future__ import annotations

from typing import Any

import kubernetes.client

from localcluster.apiserver import LocalApiServer


def api_client(server: LocalApiServer) -> Any:
    """A ``kubernetes.client.ApiClient`` for ``server`` (no kubeconfig, no auth).

    Close it with :func:`close_client` so its pooled sockets do not outlive the test.
    """
    configuration = kubernetes.client.Configuration()
    configuration.host = server.url
    return kubernetes.client.ApiClient(configuration)


def close_client(client: Any) -> None:
    """Close the client's thread pool and its pooled connections."""
    client.close()
    client.rest_client.pool_manager.clear()
