"""A whole cluster in one process: API server, controller-manager parts, scheduler, kubelets.

``LocalCluster`` starts the local API server (or attaches to one at ``api_url``), the resourceclaim
controller and the workload controllers (sharing informers, as in kube-controller-manager), the
scheduler and one kubelet per :class:`NodeSpec`, each with its own API client, all as threads.
``stop`` (or leaving the ``with`` block) ends every thread and removes every socket it created.
The real InstaSlice controller and kubelet plugins are not started here: they run as their own
processes against :attr:`LocalCluster.url` and the kubelets' directories.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from localcluster.apiserver import LocalApiServer
from localcluster.cluster.claimcontroller import ResourceClaimController
from localcluster.cluster.client import LocalClusterClient, connect
from localcluster.cluster.kubelet import Kubelet, NodeSpec
from localcluster.cluster.loop import InformerFactory
from localcluster.cluster.scheduler import Scheduler
from localcluster.cluster.workloads import WorkloadControllers

log = logging.getLogger(__name__)

T = TypeVar("T")


class LocalCluster:
    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        root: Path,
        *,
        api_url: str | None = None,
        workloads: bool = True,
    ) -> None:
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"node names must be unique: {names}")
        self.nodes = tuple(nodes)
        self.root = Path(root)
        self._api_url = api_url
        self._with_workloads = workloads
        self._server: LocalApiServer | None = None
        self._clients: list[LocalClusterClient] = []
        self._stops: list[Callable[[], None]] = []
        self._kubelets: dict[str, Kubelet] = {}
        self.api: LocalClusterClient | None = None
        """A client for callers (tests, the demo); closed by ``stop``."""
        self.kubeconfig: Path | None = None

    @property
    def url(self) -> str:
        if self._server is not None:
            return self._server.url
        if self._api_url is None:
            raise RuntimeError("the cluster is not started")
        return self._api_url

    @property
    def apiserver(self) -> LocalApiServer | None:
        """The embedded API server (None when attached to another one)."""
        return self._server

    def kubelet(self, node: str) -> Kubelet:
        return self._kubelets[node]

    def start(self) -> LocalCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _client(self, agent: str) -> LocalClusterClient:
        client = connect(self.url, user_agent=agent)
        self._clients.append(client)
        return client

    def _start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self._api_url is None:
            self._server = LocalApiServer(graceful_pod_deletion=True).start()
            self._stops.append(self._server.stop)
            self.kubeconfig = self._server.write_kubeconfig(self.root / "kubeconfig")
        self.api = self._client("localcluster")

        manager_api = self._client("kube-controller-manager")
        manager_informers = InformerFactory(manager_api, name="controller-manager")
        claims = ResourceClaimController(api=manager_api, informers=manager_informers)
        controllers: list[ResourceClaimController | WorkloadControllers] = [claims]
        if self._with_workloads:
            controllers.append(WorkloadControllers(api=manager_api, informers=manager_informers))

        scheduler_api = self._client("kube-scheduler")
        scheduler_informers = InformerFactory(scheduler_api, name="scheduler")
        scheduler = Scheduler(api=scheduler_api, informers=scheduler_informers)

        for index, spec in enumerate(self.nodes):
            kubelet = Kubelet(
                spec=spec,
                root=self.root / spec.name,
                api=self._client(f"kubelet/{spec.name}"),
                pod_ip_prefix=f"10.244.{index}.",
            )
            kubelet.start()
            self._stops.append(kubelet.stop)
            self._kubelets[spec.name] = kubelet

        for factory, parts in (
            (manager_informers, controllers),
            (scheduler_informers, [scheduler]),
        ):
            factory.start()
            self._stops.append(factory.stop)
            if not factory.wait_for_sync():
                raise TimeoutError("informers did not sync")
            for part in parts:
                part.start()
                self._stops.append(part.stop)
        for kubelet in self._kubelets.values():
            if not kubelet.wait_for_sync(10.0):
                raise TimeoutError(f"kubelet {kubelet.name} did not sync")
        log.info("local cluster up at %s with nodes %s", self.url, ", ".join(self._kubelets))

    def stop(self) -> None:
        # Controllers before informers, everything before the clients and the API server.
        for stop in reversed(self._stops):
            try:
                stop()
            except Exception:
                log.exception("stopping %s failed", stop)
        self._stops.clear()
        self._kubelets.clear()
        for client in self._clients:
            client.close()
        self._clients.clear()
        self.api = None
        self._server = None

    def wait_for(
        self,
        predicate: Callable[[], T | None],
        timeout: float = 10.0,
        *,
        interval: float = 0.05,
        message: str = "",
    ) -> T:
        """Poll ``predicate`` until it returns something truthy, and return that."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise TimeoutError(message or f"condition not met within {timeout}s")
            time.sleep(interval)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
