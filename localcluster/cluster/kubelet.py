"""One emulated kubelet: a Node object, the plugin sockets of a real node, and the pod lifecycle as
device and DRA plugins see it.

Its root holds the kubelet's directories: ``plugins_registry/`` (watched for DRA plugins),
``plugins/`` (where plugins put their own sockets), ``device-plugins/`` (``kubelet.sock``) and
``pod-resources/`` (``kubelet.sock``). For each pod bound to the node it does what the kubelet does
before and after the containers run:

1. admit, one pod at a time as ``HandlePodAdditions`` does: the pod joins the "pod manager" (the
   pods pod-resources lists) at the start of its own admission turn, not when it is bound, then
   device-plugin ``Allocate`` per container; not enough devices or a failing plugin rejects the
   pod (phase ``Failed``, reason ``UnexpectedAdmissionError``). So while a plugin serves a pod's
   ``Allocate``, pod-resources lists that pod (the container still without devices) and no pod
   admitted after it;
2. ``NodePrepareResources`` for its DRA claims, retried with backoff while the pod waits in
   ``ContainerCreating``;
3. "start" the containers: ``PreStartContainer`` where asked, the CDI ids and environment each
   container gets recorded (:meth:`Kubelet.container_devices`), status ``Running``;
4. on termination — deletion, or completion after the ``localcluster.instaslice.dev/run-seconds``
   annotation's seconds for ``restartPolicy: Never/OnFailure`` pods — containers stop, DRA claims
   are unprepared (before the status changes, as the kubelet does), device ids are released, then
   the pod is marked ``Succeeded`` or, if it was deleted, removed (``gracePeriodSeconds=0``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from driver.cluster.clock import Clock, SystemClock
from driver.cluster.events import WARNING, EventRecorder
from driver.cluster.port import (
    NODES,
    PODS,
    JsonObject,
    format_time,
    name_of,
    namespace_of,
    object_key,
    uid_of,
)
from driver.errors import AlreadyExistsError, ApiNotFoundError, ConflictError
from localcluster.cluster import podstatus
from localcluster.cluster.cdiresolver import CdiResolutionError, CdiResolver
from localcluster.cluster.client import ControlPlaneApi
from localcluster.cluster.devicemanager import AdmissionError, ContainerAllocation, DeviceManager
from localcluster.cluster.dramanager import ClaimDevice, DraManager, PrepareError
from localcluster.cluster.grpcutil import UnixServer
from localcluster.cluster.loop import InformerFactory, KeyedLoop
from localcluster.cluster.nodeobject import node_object
from localcluster.cluster.pluginwatcher import DraPluginRegistry, PluginWatcher
from localcluster.cluster.podresources import PodResourcesServicer
from localcluster.cluster.podutil import is_deleting, is_terminal
from protos.podresources.v1 import api_pb2_grpc as pr_grpc

log = logging.getLogger(__name__)

RUN_SECONDS_ANNOTATION = "localcluster.instaslice.dev/run-seconds"
"""On a ``restartPolicy: Never``/``OnFailure`` pod: its containers exit 0 after this many seconds."""
_ATTEMPTS = 5
_NODE_KEY = "node"


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """An emulated node: its name and what it offers besides device-plugin resources."""

    name: str
    cpu: str = "16"
    memory: str = "64Gi"
    pods: int = 110
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Mapping[str, str]] = ()
    cdi_dirs: Sequence[Path] = ()
    """Where the node's container runtime finds CDI specs; empty: CDI names are not resolved."""


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    """What one started container got: CDI device names and its environment."""

    cdi_ids: tuple[str, ...]
    envs: dict[str, str]


@dataclass(slots=True)
class _PodState:
    uid: str
    key: str
    phase: str = "pending"  # pending (bound, not admitted yet) | admitted | running | done
    waiting_written: bool = False
    finish_at: float | None = None
    containers: dict[str, ContainerDevices] = field(default_factory=dict)


class Kubelet:
    def __init__(
        self,
        *,
        spec: NodeSpec,
        root: Path,
        api: ControlPlaneApi,
        clock: Clock | None = None,
        host_ip: str = "127.0.0.1",
        pod_ip_prefix: str = "10.244.0.",
        workers: int = 4,
    ) -> None:
        self.spec = spec
        self.root = root
        self._api = api
        self._clock = clock or SystemClock()
        self._host_ip = host_ip
        self._pod_ip_prefix = pod_ip_prefix
        self._cdi = CdiResolver(spec.cdi_dirs) if spec.cdi_dirs else None
        self._informers = InformerFactory(api, name=f"kubelet-{spec.name}")
        self._pods = self._informers.informer(PODS, field_selector=f"spec.nodeName={spec.name}")
        self.plugins = DraPluginRegistry()
        self.plugin_watcher = PluginWatcher(directory=self.registry_dir, registry=self.plugins)
        self.device_manager = DeviceManager(
            directory=self.device_plugins_dir, on_change=lambda: self._node_loop.add(_NODE_KEY)
        )
        self.dra = DraManager(api=api, plugins=self.plugins)
        self._pod_resources = UnixServer(
            path=self.pod_resources_dir / "kubelet.sock",
            register=lambda s: pr_grpc.add_PodResourcesListerServicer_to_server(
                PodResourcesServicer(self), s
            ),
            name=f"pod-resources-{spec.name}",
        )
        self._events = EventRecorder(
            api=api, component="kubelet", host=spec.name, clock=self._clock
        )
        self._loop = KeyedLoop(name=f"kubelet-{spec.name}", sync=self._sync, workers=workers)
        self._node_loop = KeyedLoop(
            name=f"kubelet-{spec.name}-node", sync=lambda _: self._sync_node()
        )
        self._lock = threading.Lock()
        self._states: dict[str, _PodState] = {}  # pod key
        self._ips = 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def registry_dir(self) -> Path:
        return self.root / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.root / "plugins"

    @property
    def device_plugins_dir(self) -> Path:
        return self.root / "device-plugins"

    @property
    def pod_resources_dir(self) -> Path:
        return self.root / "pod-resources"

    @property
    def pod_resources_socket(self) -> Path:
        return self.pod_resources_dir / "kubelet.sock"

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        for directory in (self.registry_dir, self.plugins_dir, self.pod_resources_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self._sync_node()
        self.device_manager.start()
        self._pod_resources.start()
        self.plugin_watcher.start()
        self._pods.add_handler(
            on_add=self._enqueue, on_update=lambda _, p: self._enqueue(p), on_delete=self._enqueue
        )
        self._node_loop.start()
        self._loop.start()
        self._informers.start()

    def stop(self) -> None:
        self._loop.stop()
        self._node_loop.stop()
        self._informers.stop()
        self.plugin_watcher.stop()
        self._pod_resources.stop()
        self.device_manager.stop()
        self.plugins.close()

    def restart_device_manager(self) -> None:
        """Simulate a kubelet restart for device plugins: they must register again."""
        self.device_manager.restart()

    def wait_for_sync(self, timeout: float) -> bool:
        return self._informers.wait_for_sync(timeout)

    # --- what tests and pod-resources read ------------------------------------------------------

    def container_devices(
        self, pod_uid: str, container: str
    ) -> tuple[tuple[str, ...], dict[str, str]]:
        """CDI ids and environment the container started with; ``KeyError`` if not started."""
        with self._lock:
            for state in self._states.values():
                if state.uid == pod_uid:
                    got = state.containers[container]
                    return got.cdi_ids, dict(got.envs)
        raise KeyError(f"pod {pod_uid} has no started container {container!r} on {self.name}")

    def active_pods(self) -> list[JsonObject]:
        """The pod manager's live pods: admitted (or being admitted), not finished."""
        with self._lock:
            admitted = {s.uid for s in self._states.values() if s.phase in ("admitted", "running")}
        pods = [
            p
            for p in self._pods.list()
            if uid_of(p) in admitted and not is_terminal(p) and not is_deleting(p)
        ]
        return sorted(pods, key=object_key)

    def waiting_for_admission(self) -> list[str]:
        """Keys (``namespace/name``) of pods bound here that wait for their admission turn."""
        with self._lock:
            return sorted(s.key for s in self._states.values() if s.phase == "pending")

    def device_allocations(self, pod_uid: str, container: str) -> list[ContainerAllocation]:
        return self.device_manager.container_allocations(pod_uid, container)

    def claim_devices(self, pod: JsonObject, container: JsonObject) -> list[ClaimDevice]:
        return self.dra.container_devices(pod, container)

    def allocatable_devices(self) -> dict[str, list[str]]:
        return self.device_manager.healthy_devices()

    # --- node -----------------------------------------------------------------------------------

    def _sync_node(self) -> None:
        for attempt in range(_ATTEMPTS):
            desired = node_object(
                self.spec, self.device_manager.resources(), host_ip=self._host_ip, now=self._now()
            )
            try:
                current = self._api.get(NODES, name=self.name)
            except ApiNotFoundError:
                try:
                    self._api.create(NODES, desired)
                    return
                except AlreadyExistsError:
                    continue
            updated = {
                **current,
                "status": _merge_status(current.get("status") or {}, desired["status"]),
            }
            labels = {**(current["metadata"].get("labels") or {}), **desired["metadata"]["labels"]}
            try:
                if labels != current["metadata"].get("labels"):
                    current = self._api.update(
                        NODES, {**current, "metadata": {**current["metadata"], "labels": labels}}
                    )
                    updated = {**current, "status": updated["status"]}
                if updated["status"] != current.get("status"):
                    self._api.update_status(NODES, updated)
                return
            except ConflictError:
                if attempt == _ATTEMPTS - 1:
                    raise

    # --- pods -----------------------------------------------------------------------------------

    def _enqueue(self, pod: JsonObject) -> None:
        self._loop.add(object_key(pod))

    def _now(self) -> str:
        return format_time(self._clock.now())

    def _sync(self, key: str) -> None:
        pod = self._pods.get_by_key(key)
        with self._lock:
            state = self._states.get(key)
        if state is not None and (pod is None or uid_of(pod) != state.uid):
            self._release(state)  # gone without graceful deletion, or replaced under its name
            with self._lock:
                self._states.pop(key, None)
            state = None
        if pod is None:
            return
        if is_deleting(pod):
            if state is not None:
                self._release(state)
            with contextlib.suppress(ApiNotFoundError, ConflictError):
                self._api.delete_pod_now(
                    namespace=namespace_of(pod) or "", name=name_of(pod), uid=uid_of(pod)
                )
            with self._lock:
                self._states.pop(key, None)
            return
        if is_terminal(pod):
            if state is not None and state.phase != "done":
                self._release(state)
                state.phase = "done"
            return
        if state is None:
            state = _PodState(uid=uid_of(pod), key=key)
            with self._lock:
                self._states[key] = state
        if state.phase == "pending" and not self._admit(pod, state):
            return
        if state.phase == "admitted":
            self._start(pod, state)
        if state.phase == "running" and state.finish_at is not None:
            remaining = state.finish_at - self._clock.monotonic()
            if remaining > 0:
                self._loop.add_after(key, remaining)
            else:
                self._finish(pod, state)

    def _admit(self, pod: JsonObject, state: _PodState) -> bool:
        def admitting() -> None:
            with self._lock:
                state.phase = "admitted"

        try:
            self.device_manager.allocate(pod, admitting=admitting)
        except AdmissionError as exc:
            message = f"Allocate failed due to {exc}, which is unexpected"
            log.info("pod %s rejected: %s", state.key, message)
            state.phase = "done"
            self._write_status(
                pod,
                lambda p: podstatus.rejected_status(
                    p, reason="UnexpectedAdmissionError", message=message
                ),
            )
            self._events.record(
                pod, event_type=WARNING, reason="UnexpectedAdmissionError", message=message
            )
            return False
        except Exception:
            with self._lock:
                state.phase = "pending"  # not admitted after all: the next sync tries again
            raise
        return True

    def _start(self, pod: JsonObject, state: _PodState) -> None:
        if not state.waiting_written:
            self._write_status(
                pod,
                lambda p: podstatus.waiting_status(
                    p, now=self._now(), host_ip=self._host_ip, reason="ContainerCreating"
                ),
            )
            state.waiting_written = True
        try:
            self.dra.prepare(pod)
        except PrepareError as exc:
            self._events.record(
                pod, event_type=WARNING, reason="FailedPrepareDynamicResources", message=str(exc)
            )
            raise
        spec = pod.get("spec") or {}
        started: dict[str, ContainerDevices] = {}
        try:
            for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
                started[str(container.get("name"))] = self._start_container(pod, container)
        except CdiResolutionError as exc:
            problem = str(exc)
            self._write_status(
                pod,
                lambda p: podstatus.waiting_status(
                    p,
                    now=self._now(),
                    host_ip=self._host_ip,
                    reason="CreateContainerError",
                    message=problem,
                ),
            )
            self._events.record(pod, event_type=WARNING, reason="Failed", message=problem)
            raise
        with self._lock:
            state.containers = started
            self._ips += 1
            pod_ip = f"{self._pod_ip_prefix}{self._ips % 250 + 2}"
        self._write_status(
            pod,
            lambda p: podstatus.running_status(
                p, now=self._now(), host_ip=self._host_ip, pod_ip=pod_ip
            ),
        )
        state.phase = "running"
        log.info("pod %s running on %s", state.key, self.name)
        run_seconds = (pod["metadata"].get("annotations") or {}).get(RUN_SECONDS_ANNOTATION)
        if run_seconds is not None and spec.get("restartPolicy") in ("Never", "OnFailure"):
            state.finish_at = self._clock.monotonic() + float(run_seconds)

    def _start_container(self, pod: JsonObject, container: JsonObject) -> ContainerDevices:
        name = str(container.get("name"))
        self.device_manager.pre_start(uid_of(pod), name)
        allocations = self.device_manager.container_allocations(uid_of(pod), name)
        cdi_ids = [d for a in allocations for d in a.cdi_devices]
        cdi_ids += [
            i for d in self.dra.container_devices(pod, container) for i in d.device.cdi_device_ids
        ]
        env: dict[str, str] = {
            str(e["name"]): str(e.get("value") or "")
            for e in container.get("env") or []
            if "valueFrom" not in e
        }
        for allocation in allocations:
            env.update(allocation.envs)
        if self._cdi is not None:
            for entry in self._cdi.environment(cdi_ids):
                key, _, value = entry.partition("=")
                env[key] = value
        return ContainerDevices(cdi_ids=tuple(cdi_ids), envs=env)

    def _finish(self, pod: JsonObject, state: _PodState) -> None:
        self._release(state)  # DRA unprepare before the status changes, as the kubelet does
        self._write_status(pod, lambda p: podstatus.succeeded_status(p, now=self._now()))
        state.phase = "done"
        log.info("pod %s succeeded on %s", state.key, self.name)

    def _release(self, state: _PodState) -> None:
        self.dra.unprepare(state.uid)
        self.device_manager.release(state.uid)

    def _write_status(self, pod: JsonObject, build: podstatus.StatusBuilder) -> None:
        current = pod
        for attempt in range(_ATTEMPTS):
            if uid_of(current) != uid_of(pod):
                return
            try:
                self._api.update_status(PODS, {**current, "status": build(current)})
                return
            except ConflictError:
                if attempt == _ATTEMPTS - 1:
                    raise
                try:
                    current = self._api.get(PODS, name=name_of(pod), namespace=namespace_of(pod))
                except ApiNotFoundError:
                    return
            except ApiNotFoundError:
                return


def _merge_status(current: JsonObject, desired: JsonObject) -> JsonObject:
    """Our fields over the stored status; resources we do not know stay as they are."""
    keep = ("capacity", "allocatable") + (("conditions",) if current.get("conditions") else ())
    merged = {**current, **{k: v for k, v in desired.items() if k not in keep}}
    for field_name in ("capacity", "allocatable"):
        merged[field_name] = {**(current.get(field_name) or {}), **desired[field_name]}
    return merged
