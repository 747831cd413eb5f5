"""The skeleton of a controller that owns pods (ReplicaSet, Job, StatefulSet): owner and pod
informers, a keyed work loop, pod events routed to the owning object's key, and expectations."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod

from driver.cluster.informer import Informer
from driver.cluster.port import (
    PODS,
    JsonObject,
    Resource,
    key_for,
    namespace_of,
    object_key,
    uid_of,
)
from localcluster.cluster.client import ControlPlaneApi
from localcluster.cluster.loop import InformerFactory, KeyedLoop, ensure_index
from localcluster.cluster.podutil import is_deleting
from localcluster.cluster.workloads.common import (
    BY_CONTROLLER,
    Expectations,
    controller_of,
    controller_uids,
)

log = logging.getLogger(__name__)


class PodOwnerController(ABC):
    resource: Resource

    def __init__(self, *, api: ControlPlaneApi, informers: InformerFactory, workers: int = 2):
        self._api = api
        self._owners: Informer = informers.informer(self.resource)
        self._pods: Informer = informers.informer(PODS)
        self._loop = KeyedLoop(
            name=f"{self.resource.plural}-controller", sync=self._sync_key, workers=workers
        )
        self.expectations = Expectations()

    def start(self) -> None:
        ensure_index(self._pods, BY_CONTROLLER, controller_uids)
        self._owners.add_handler(
            on_add=self._enqueue,
            on_update=lambda _, o: self._enqueue(o),
            on_delete=lambda o: self.expectations.forget(object_key(o)),
        )
        self._pods.add_handler(
            on_add=self._on_pod_add, on_update=self._on_pod_update, on_delete=self._on_pod_delete
        )
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()

    def _enqueue(self, owner: JsonObject) -> None:
        self._loop.add(object_key(owner))

    def _owner_key(self, pod: JsonObject) -> str | None:
        ref = controller_of(pod, self.resource)
        if ref is None:
            return None
        return key_for(name=str(ref.get("name")), namespace=namespace_of(pod))

    def _on_pod_add(self, pod: JsonObject) -> None:
        key = self._owner_key(pod)
        if key is not None:
            self.expectations.created(key)
            self._loop.add(key)

    def _on_pod_update(self, old: JsonObject, pod: JsonObject) -> None:
        key = self._owner_key(pod)
        if key is None:
            return
        if is_deleting(pod) and not is_deleting(old):
            self.expectations.deleted(key, uid_of(pod))
        self._loop.add(key)

    def _on_pod_delete(self, pod: JsonObject) -> None:
        key = self._owner_key(pod)
        if key is not None:
            self.expectations.deleted(key, uid_of(pod))
            self._loop.add(key)

    def owned_pods(self, owner: JsonObject) -> list[JsonObject]:
        return [
            p
            for p in self._pods.by_index(BY_CONTROLLER, uid_of(owner))
            if namespace_of(p) == namespace_of(owner)
        ]

    def _sync_key(self, key: str) -> None:
        owner = self._owners.get_by_key(key)
        if owner is None:
            self.expectations.forget(key)
            return
        if is_deleting(owner):
            return
        self.sync(owner, key)

    @abstractmethod
    def sync(self, owner: JsonObject, key: str) -> None: ...

    def create_pods(self, key: str, pods: list[JsonObject]) -> None:
        """Create ``pods`` under expectations; a refused create lowers them again and raises."""
        if not pods:
            return
        self.expectations.expect(key, adds=len(pods))
        failure: Exception | None = None
        for pod in pods:
            try:
                self._api.create(PODS, pod, namespace=namespace_of(pod))
            except Exception as exc:  # the webhook or validation refused: retry later
                self.expectations.created(key)
                failure = exc
        if failure is not None:
            raise failure
