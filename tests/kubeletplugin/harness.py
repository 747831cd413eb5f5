"""Drive the kubelet plugin the way the kubelet does, on a local API server with emulated GPUs.

``NodeHarness`` owns one node's directories (short, under /tmp: unix socket paths are limited to
107 bytes), builds plugin instances on them (a new instance on the same directories is a restarted
plugin), and writes claims into the API server as the controller would allocate them.
``Kubelet`` finds the plugin through its registration socket, asks ``GetInfo`` and dials the DRA
endpoint it names, with the generated stubs of either API version.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from api.names import DRIVER_NAME
from driver.cdi import DeviceMajors
from driver.cdi_common import NO_COMMON_EDITS, CommonEdits
from driver.cluster.kube import KubeClusterApi, configuration_for_url
from driver.cluster.port import NODES, RESOURCE_CLAIMS, JsonObject
from driver.cluster.throttle import ClientSettings
from driver.errors import ConflictError
from driver.gpu.backend import GpuBackend
from driver.gpu.emulated import EmulatedGpuBackend
from kubeletplugin.health.settings import XidPolicy
from kubeletplugin.plugin import KubeletPlugin, PluginConfig
from protos.dra.v1 import api_pb2 as v1
from protos.dra.v1 import api_pb2_grpc as v1_grpc
from protos.dra.v1beta1 import api_pb2 as v1beta1
from protos.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from protos.drahealth.v1alpha1 import api_pb2 as health_pb2
from protos.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from protos.pluginregistration import api_pb2 as reg
from protos.pluginregistration import api_pb2_grpc as reg_grpc


class Crash(BaseException):
    """Stands for the process dying: not an ``Exception``, so no rollback code runs."""


def crash_at(step: str) -> Callable[[str], None]:
    def hook(current: str) -> None:
        if current == step:
            raise Crash(step)

    return hook


def make_api(url: str) -> KubeClusterApi:
    return KubeClusterApi(
        configuration=configuration_for_url(url),
        settings=ClientSettings(qps=0, request_timeout=10.0),
    )


def node_selector(node: str) -> JsonObject:
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }


@dataclass(frozen=True)
class ClaimHandle:
    uid: str
    namespace: str
    name: str

    def v1(self) -> v1.Claim:
        return v1.Claim(uid=self.uid, namespace=self.namespace, name=self.name)

    def v1beta1(self) -> v1beta1.Claim:
        return v1beta1.Claim(uid=self.uid, namespace=self.namespace, name=self.name)


@dataclass(frozen=True)
class Answer:
    devices: tuple[tuple[tuple[str, ...], str, str, tuple[str, ...]], ...]
    """(request names, pool, device, CDI ids) per device."""
    error: str


class Kubelet:
    """The kubelet's side: plugin discovery through the registry dir, then DRA calls."""

    def __init__(self, registry_dir: Path) -> None:
        sockets = sorted(registry_dir.glob("*-reg.sock"))
        assert len(sockets) == 1, sockets
        with grpc.insecure_channel(f"unix://{sockets[0]}") as channel:
            self.info = reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=5)
            reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=True), timeout=5
            )
        assert self.info.type == "DRAPlugin"
        assert self.info.name == DRIVER_NAME
        self._channel = grpc.insecure_channel(f"unix://{self.info.endpoint}")
        self.v1 = v1_grpc.DRAPluginStub(self._channel)
        self.v1beta1 = v1beta1_grpc.DRAPluginStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def watch_health(self) -> HealthWatch:
        """Open ``NodeWatchResources`` on the DRA endpoint, as the kubelet does after registering."""
        return HealthWatch(self.info.endpoint)

    def prepare(self, claims: Sequence[ClaimHandle], *, version: str = "v1") -> dict[str, Answer]:
        if version == "v1":
            response: Any = self.v1.NodePrepareResources(
                v1.NodePrepareResourcesRequest(claims=[c.v1() for c in claims]), timeout=30
            )
        else:
            response = self.v1beta1.NodePrepareResources(
                v1beta1.NodePrepareResourcesRequest(claims=[c.v1beta1() for c in claims]),
                timeout=30,
            )
        return {
            uid: Answer(
                devices=tuple(
                    (tuple(d.request_names), d.pool_name, d.device_name, tuple(d.cdi_device_ids))
                    for d in result.devices
                ),
                error=result.error,
            )
            for uid, result in response.claims.items()
        }

    def unprepare(self, claims: Sequence[ClaimHandle], *, version: str = "v1") -> dict[str, str]:
        if version == "v1":
            response: Any = self.v1.NodeUnprepareResources(
                v1.NodeUnprepareResourcesRequest(claims=[c.v1() for c in claims]), timeout=30
            )
        else:
            response = self.v1beta1.NodeUnprepareResources(
                v1beta1.NodeUnprepareResourcesRequest(claims=[c.v1beta1() for c in claims]),
                timeout=30,
            )
        return {uid: result.error for uid, result in response.claims.items()}


class NodeHarness:
    def __init__(self, *, api_url: str, node: str = "node-a", gpus: str = "2xA100-40GB") -> None:
        self.root = Path(tempfile.mkdtemp(dir="/tmp", prefix="isk-"))
        self.node = node
        self.gpus = gpus
        self.api = make_api(api_url)
        self.registry_dir = self.root / "reg"
        self.plugin_dir = self.root / "plug"
        self.cdi_root = self.root / "cdi"
        self.state_dir = self.root / "state"
        self.emulated_state = self.root / "emulated.json"
        self._running: list[tuple[KubeletPlugin, GpuBackend]] = []
        self.xid_policy = XidPolicy()
        """``XidPolicy(ignore_all=True)`` runs no XID watch: a plugin then stops at once instead
        of after its watch's one-second wait (for tests that restart it many times)."""
        self._kubelets: list[Kubelet] = []
        self._counter = 0

    def close(self) -> None:
        for kubelet in self._kubelets:
            kubelet.close()
        for plugin, backend in self._running:
            plugin.stop()
            backend.close()
        self.api.close()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- node side -------------------------------------------------------------------------

    def create_node(self, name: str | None = None) -> JsonObject:
        return self.api.create(
            NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name or self.node}}
        )

    def backend(
        self, *, fault_hook: Callable[[str], None] | None = None, gpus: str | None = None
    ) -> EmulatedGpuBackend:
        return EmulatedGpuBackend(
            node_name=self.node,
            spec=gpus or self.gpus,
            state_file=self.emulated_state,
            fault_hook=fault_hook,
        )

    def start_plugin(
        self,
        *,
        fault_hook: Callable[[str], None] | None = None,
        step_hook: Callable[[str], None] | None = None,
        boot_id: str = "boot-1",
        backend: GpuBackend | None = None,
        http: bool = False,
        cdi_common: CommonEdits = NO_COMMON_EDITS,
        emulated: bool = True,
        majors: DeviceMajors | None = None,
        registration_wait_seconds: float = 0.0,
    ) -> KubeletPlugin:
        backend = backend or self.backend(fault_hook=fault_hook)
        plugin = KubeletPlugin(
            config=PluginConfig(
                node_name=self.node,
                plugin_registry_dir=self.registry_dir,
                plugin_dir=self.plugin_dir,
                cdi_root=self.cdi_root,
                state_dir=self.state_dir,
                emulated=emulated,
                healthz_address="127.0.0.1:0" if http else "",
                metrics_address="127.0.0.1:0" if http else "",
                inventory_poll_seconds=3600,
                cdi_common=cdi_common,
                registration_wait_seconds=registration_wait_seconds,
                xid_policy=self.xid_policy,
            ),
            backend=backend,
            api=self.api,
            boot_id=boot_id,
            step_hook=step_hook,
            majors=majors,
        )
        self._running.append((plugin, backend))
        self.last_report = plugin.start()
        return plugin

    def stop_plugin(self, plugin: KubeletPlugin) -> None:
        """Stop serving (a crash leaves state as a stop does: stop never touches it)."""
        for entry in list(self._running):
            if entry[0] is plugin:
                self._running.remove(entry)
                plugin.stop()
                entry[1].close()

    def kubelet(self) -> Kubelet:
        kubelet = Kubelet(self.registry_dir)
        self._kubelets.append(kubelet)
        return kubelet

    def instances(self) -> list[tuple[int, str, int, int]]:
        """(GPU, profile, start, GI id) of every MIG instance in the emulated state file."""
        backend = self.backend()
        try:
            return [
                (i.gpu_index, i.profile, i.placement.start, i.gi_id) for i in backend.instances()
            ]
        finally:
            backend.close()

    def cdi_files(self) -> list[Path]:
        return sorted(self.cdi_root.glob("*.json")) if self.cdi_root.is_dir() else []

    # -- API side (what the controller writes) ----------------------------------------------

    def claim(
        self,
        devices: Sequence[str | tuple[str, str]],
        *,
        name: str | None = None,
        namespace: str = "default",
        node: str | None = None,
        pool: str | None = None,
        allocation_config: list[JsonObject] | None = None,
        spec_config: list[JsonObject] | None = None,
        allocate: bool = True,
        driver: str = DRIVER_NAME,
    ) -> ClaimHandle:
        """A claim allocated (as the controller does) to ``devices``: device names, or
        (request, device) pairs; requests are declared with their counts."""
        pairs = [d if isinstance(d, tuple) else ("gpu", d) for d in devices]
        self._counter += 1
        name = name or f"claim-{self._counter}"
        requests: dict[str, int] = {}
        for request, _ in pairs:
            requests[request.split("/")[0]] = requests.get(request.split("/")[0], 0) + 1
        spec: JsonObject = {
            "devices": {
                "requests": [
                    {
                        "name": request,
                        "exactly": {"deviceClassName": DRIVER_NAME, "count": count},
                    }
                    for request, count in requests.items()
                ]
            }
        }
        if spec_config is not None:
            spec["devices"]["config"] = spec_config
        claim = self.api.create(
            RESOURCE_CLAIMS,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": namespace},
                "spec": spec,
            },
        )
        if allocate:
            devices_part: JsonObject = {
                "results": [
                    {
                        "request": request,
                        "driver": driver,
                        "pool": pool or node or self.node,
                        "device": device,
                    }
                    for request, device in pairs
                ]
            }
            if allocation_config is not None:
                devices_part["config"] = allocation_config
            claim["status"] = {
                "allocation": {
                    "devices": devices_part,
                    "nodeSelector": node_selector(node or self.node),
                    "allocationTimestamp": "2026-05-01T10:00:00Z",
                }
            }
            claim = self.api.update_status(RESOURCE_CLAIMS, claim)
        return ClaimHandle(
            uid=claim["metadata"]["uid"], namespace=namespace, name=claim["metadata"]["name"]
        )

    def _write_status(self, claim: ClaimHandle, change: Callable[[JsonObject], None]) -> None:
        """Read, change and write the claim's status, again on a conflict: the plugin itself writes
        ``status.devices`` in the background after a prepare, as other writers may in a cluster."""
        for _ in range(10):
            obj = self.api.get(RESOURCE_CLAIMS, name=claim.name, namespace=claim.namespace)
            change(obj)
            try:
                self.api.update_status(RESOURCE_CLAIMS, obj)
            except ConflictError:
                continue
            return
        raise AssertionError(f"claim {claim.name}: status write kept conflicting")

    def reallocate(self, claim: ClaimHandle, devices: Sequence[str]) -> None:
        """Clear the claim's allocation and write a new one (same UID), as after a release."""
        obj = self.api.get(RESOURCE_CLAIMS, name=claim.name, namespace=claim.namespace)
        allocation = obj["status"]["allocation"]
        allocation["devices"]["results"] = [
            {"request": "gpu", "driver": DRIVER_NAME, "pool": self.node, "device": d}
            for d in devices
        ]

        def clear(o: JsonObject) -> None:
            o["status"] = {}

        def allocate(o: JsonObject) -> None:
            o["status"] = {"allocation": allocation}

        self._write_status(claim, clear)
        self._write_status(claim, allocate)

    def reserve_for_pod(self, claim: ClaimHandle, *, pod: str, uid: str) -> None:
        def reserve(o: JsonObject) -> None:
            o["status"]["reservedFor"] = [{"resource": "pods", "name": pod, "uid": uid}]

        self._write_status(claim, reserve)

    def delete_claim(self, claim: ClaimHandle) -> None:
        self.api.delete(RESOURCE_CLAIMS, name=claim.name, namespace=claim.namespace)


class HealthWatch:
    """One ``NodeWatchResources`` stream read in a thread, as the kubelet's health client does:
    every response is kept; ``ended`` is set when the stream ends (with ``status`` its code)."""

    def __init__(self, endpoint: str) -> None:
        self._channel = grpc.insecure_channel(f"unix://{endpoint}")
        stub = health_grpc.DRAResourceHealthStub(self._channel)
        self._call = stub.NodeWatchResources(health_pb2.NodeWatchResourcesRequest())
        self._cond = threading.Condition()
        self.responses: list[health_pb2.NodeWatchResourcesResponse] = []
        self.ended = threading.Event()
        self.status: grpc.StatusCode | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for response in self._call:
                with self._cond:
                    self.responses.append(response)
                    self._cond.notify_all()
            self.status = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            self.status = exc.code()
        finally:
            self.ended.set()
            with self._cond:
                self._cond.notify_all()

    def health(self) -> dict[str, tuple[str, str]]:
        """Device name → (health name, message) of the latest response."""
        with self._cond:
            latest = self.responses[-1] if self.responses else None
        if latest is None:
            return {}
        return {
            d.device.device_name: (health_pb2.HealthStatus.Name(d.health), d.message)
            for d in latest.devices
        }

    def wait_for(
        self, check: Callable[[dict[str, tuple[str, str]]], bool], *, what: str, timeout: float = 10
    ) -> dict[str, tuple[str, str]]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                current = self.health()
                if self.responses and check(current):
                    return current
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.ended.is_set():
                    raise AssertionError(f"health stream: timed out waiting for {what}")
                self._cond.wait(remaining)

    def cancel(self) -> None:
        self._call.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leaves RpcContext.cancel untyped
        self.ended.wait(10)
        self._channel.close()
