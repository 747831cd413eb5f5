"""The API client of the emulated cluster parts: the ``ClusterApi`` port plus the two calls only a
scheduler and a kubelet make.

kube-scheduler binds through ``POST pods/<name>/binding`` and the kubelet finishes a graceful pod
deletion with ``DELETE … gracePeriodSeconds=0``; the port has neither (our daemons never do either),
so this module adds them on the ``kubernetes``-client adapter rather than widening the port for two
callers that exist only in the local cluster.
"""

from __future__ import annotations

from typing import Protocol

from driver.cluster.kube import KubeClusterApi, configuration_for_url
from driver.cluster.port import PODS, ClusterApi, JsonObject
from driver.cluster.throttle import ClientSettings


class ControlPlaneApi(ClusterApi, Protocol):
    """``ClusterApi`` plus pod binding and immediate pod deletion."""

    def bind_pod(self, *, namespace: str, name: str, uid: str, node: str) -> None:
        """``POST pods/<name>/binding`` to ``node``; 409 if bound already, 500 while gated."""
        ...

    def delete_pod_now(self, *, namespace: str, name: str, uid: str) -> None:
        """``DELETE`` with ``gracePeriodSeconds=0`` and a uid precondition (kubelet's last step)."""
        ...


class LocalClusterClient(KubeClusterApi):
    """The adapter with :class:`ControlPlaneApi`'s two extra calls."""

    def bind_pod(self, *, namespace: str, name: str, uid: str, node: str) -> None:
        binding: JsonObject = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        path = PODS.path(namespace=namespace, name=name, subresource="binding")
        self._json("POST", path, body=binding)

    def delete_pod_now(self, *, namespace: str, name: str, uid: str) -> None:
        options: JsonObject = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": uid},
        }
        path = PODS.path(namespace=namespace, name=name)
        self._json("DELETE", path, query=[("gracePeriodSeconds", "0")], body=options)


def connect(url: str, *, user_agent: str = "localcluster") -> LocalClusterClient:
    """A client for one emulated component (each gets its own, like separate processes)."""
    settings = ClientSettings(qps=0, request_timeout=30.0, user_agent=user_agent)
    return LocalClusterClient(configuration=configuration_for_url(url), settings=settings)
