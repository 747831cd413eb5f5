"""The kubelet's DRA manager for one emulated node: prepare a pod's claims before its containers
start, unprepare them once it has stopped.

As the kubelet does: each claim is read from the API server and must be allocated, reserved for the
pod (``status.reservedFor``) and — when generated from a template — owned by it; the claims not yet
prepared on this node are sent in one ``NodePrepareResources`` per driver (namespace, uid, name
only); a claim shared by several pods is prepared once and unprepared when its last pod on the node
is done. Any failure raises :class:`PrepareError` and the caller retries with backoff (the pod stays
``ContainerCreating``). A container gets the CDI devices of the claims its ``resources.claims``
names, narrowed to the request when one is given.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import grpc

from driver.cluster.port import (
    RESOURCE_CLAIMS,
    ClusterApi,
    JsonObject,
    name_of,
    namespace_of,
    uid_of,
)
from driver.errors import ApiNotFoundError, ClusterError
from localcluster.cluster.pluginwatcher import DraClaim, DraPluginRegistry, PreparedDevice
from localcluster.cluster.podutil import (
    ClaimNotCreatedError,
    allocation,
    is_owned_by,
    is_reserved_for,
    pod_claim_refs,
)

log = logging.getLogger(__name__)


class PrepareError(Exception):
    """Preparing or unpreparing failed; retry later."""


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One prepared device as a container (and pod-resources) sees it."""

    claim_namespace: str
    claim_name: str
    driver: str
    device: PreparedDevice


@dataclass(slots=True)
class _ClaimInfo:
    claim: DraClaim
    drivers: tuple[str, ...]
    pods: set[str] = field(default_factory=set)
    prepared: dict[str, tuple[PreparedDevice, ...]] = field(default_factory=dict)


class DraManager:
    def __init__(self, *, api: ClusterApi, plugins: DraPluginRegistry) -> None:
        self._api = api
        self._plugins = plugins
        self._lock = threading.Lock()
        self._claims: dict[str, _ClaimInfo] = {}  # claim uid
        self._pod_claims: dict[str, dict[str, str]] = {}  # pod uid -> pod claim name -> claim uid

    def prepare(self, pod: JsonObject) -> None:
        pod_uid = uid_of(pod)
        try:
            refs = pod_claim_refs(pod)
        except ClaimNotCreatedError as exc:
            raise PrepareError(str(exc)) from exc
        infos: list[_ClaimInfo] = []
        for ref in refs:
            claim = self._fetch(namespace_of(pod) or "", ref.claim_name)
            if ref.generated and not is_owned_by(claim, pod):
                raise PrepareError(
                    f"ResourceClaim {ref.claim_name} was not created for pod {name_of(pod)}"
                )
            alloc = allocation(claim)
            if alloc is None:
                raise PrepareError(f"claim {ref.claim_name} is not allocated")
            if not is_reserved_for(claim, pod):
                raise PrepareError(
                    f"pod {name_of(pod)} ({pod_uid}) is not allowed to use resource claim "
                    f"{ref.claim_name} ({uid_of(claim)})"
                )
            results = (alloc.get("devices") or {}).get("results") or []
            drivers = tuple(sorted({str(r.get("driver")) for r in results}))
            with self._lock:
                info = self._claims.get(uid_of(claim))
                if info is None:
                    identity = DraClaim(namespace_of(claim) or "", uid_of(claim), name_of(claim))
                    info = _ClaimInfo(claim=identity, drivers=drivers)
                    self._claims[uid_of(claim)] = info
                info.pods.add(pod_uid)
                self._pod_claims.setdefault(pod_uid, {})[ref.pod_claim] = uid_of(claim)
            infos.append(info)
        errors: list[str] = []
        for driver in sorted({d for info in infos for d in info.drivers}):
            with self._lock:
                todo = [i for i in infos if driver in i.drivers and driver not in i.prepared]
            if todo:
                errors += self._prepare_with(driver, todo)
        if errors:
            raise PrepareError("; ".join(errors))

    def _fetch(self, namespace: str, name: str) -> JsonObject:
        try:
            return self._api.get(RESOURCE_CLAIMS, name=name, namespace=namespace)
        except ApiNotFoundError as exc:
            raise PrepareError(
                f"failed to fetch ResourceClaim {namespace}/{name}: not found"
            ) from exc
        except ClusterError as exc:
            raise PrepareError(f"failed to fetch ResourceClaim {namespace}/{name}: {exc}") from exc

    def _prepare_with(self, driver: str, infos: list[_ClaimInfo]) -> list[str]:
        plugin = self._plugins.get(driver)
        if plugin is None:
            return [f"DRA driver {driver} is not registered"]
        try:
            results = plugin.prepare([i.claim for i in infos])
        except grpc.RpcError as exc:
            return [f"NodePrepareResources of {driver} failed: {exc.code()}: {exc.details()}"]
        errors: list[str] = []
        for info in infos:
            result = results[info.claim.uid]
            if result.error:
                errors.append(
                    f"NodePrepareResources of {driver} failed for claim "
                    f"{info.claim.namespace}/{info.claim.name}: {result.error}"
                )
                continue
            with self._lock:
                info.prepared[driver] = result.devices
            log.info("prepared claim %s/%s with %s", info.claim.namespace, info.claim.name, driver)
        return errors

    def unprepare(self, pod_uid: str) -> None:
        """Release the pod's claims; unprepare those no other pod on the node uses."""
        with self._lock:
            claim_uids = sorted(set(self._pod_claims.get(pod_uid, {}).values()))
            last = [
                self._claims[u]
                for u in claim_uids
                if u in self._claims and self._claims[u].pods <= {pod_uid}
            ]
        errors: list[str] = []
        for driver in sorted({d for info in last for d in info.drivers}):
            errors += self._unprepare_with(driver, [i for i in last if driver in i.drivers])
        if errors:
            raise PrepareError("; ".join(errors))
        with self._lock:
            for claim_uid in claim_uids:
                info = self._claims.get(claim_uid)
                if info is None:
                    continue
                info.pods.discard(pod_uid)
                if not info.pods:
                    del self._claims[claim_uid]
            self._pod_claims.pop(pod_uid, None)

    def _unprepare_with(self, driver: str, infos: list[_ClaimInfo]) -> list[str]:
        plugin = self._plugins.get(driver)
        if plugin is None:
            return [f"DRA driver {driver} is not registered"]
        try:
            results = plugin.unprepare([i.claim for i in infos])
        except grpc.RpcError as exc:
            return [f"NodeUnprepareResources of {driver} failed: {exc.code()}: {exc.details()}"]
        errors: list[str] = []
        for info in infos:
            error = results[info.claim.uid]
            if error:
                errors.append(
                    f"NodeUnprepareResources of {driver} failed for claim "
                    f"{info.claim.namespace}/{info.claim.name}: {error}"
                )
            else:
                with self._lock:
                    info.prepared.pop(driver, None)
                log.info("unprepared claim %s/%s", info.claim.namespace, info.claim.name)
        return errors

    def container_devices(self, pod: JsonObject, container: JsonObject) -> list[ClaimDevice]:
        """The prepared devices of the claims ``container.resources.claims`` names, in order."""
        with self._lock:
            by_pod_claim = dict(self._pod_claims.get(uid_of(pod), {}))
            infos = {u: self._claims[u] for u in by_pod_claim.values() if u in self._claims}
        devices: list[ClaimDevice] = []
        for entry in (container.get("resources") or {}).get("claims") or []:
            info = infos.get(by_pod_claim.get(str(entry.get("name")), ""))
            if info is None:
                continue
            request = str(entry.get("request") or "")
            for driver in info.drivers:
                for device in info.prepared.get(driver, ()):
                    if request and device.request_names and request not in device.request_names:
                        continue
                    devices.append(
                        ClaimDevice(info.claim.namespace, info.claim.name, driver, device)
                    )
        return devices
