"""Fixtures for the cluster layer's tests: the real adapter on the local API server over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from driver.cluster.kube import KubeClusterApi, configuration_for_url
from driver.cluster.throttle import ClientSettings
from localcluster.apiserver import LocalApiServer


def make_api(url: str, *, settings: ClientSettings | None = None) -> KubeClusterApi:
    return KubeClusterApi(
        configuration=configuration_for_url(url),
        settings=settings or ClientSettings(qps=0, request_timeout=10.0),
    )


@pytest.fixture
def api(apiserver: LocalApiServer) -> Iterator[KubeClusterApi]:
    with make_api(apiserver.url) as client:
        yield client
