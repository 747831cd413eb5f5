"""One emulated node with the kubelet plugin, the shim and a fake kubelet, on the local API server.

``ShimNode`` reuses the kubelet plugin's ``NodeHarness`` (directories under /tmp, emulated GPUs,
the plugin on them) and adds: the device-plugin directory and pod-resources socket, a
``FakeKubelet`` serving both, shims started on the plugin, and what the controller writes for a
classic pod — the pod (bound to the node) and its shadow claims, allocated to given devices.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from api.checkpoint import Checkpoint
from api.names import (
    DELETE_PROTECTION_FINALIZER,
    DRIVER_NAME,
    SHADOW_CLAIM_CONTAINER_ANNOTATION,
    SHADOW_CLAIM_LABEL,
    SHADOW_CLAIM_PROFILE_LABEL,
    classic_resource_name,
    profile_device_class,
)
from driver.checkpoint import CheckpointStore
from driver.cluster.events import EventRecorder
from driver.cluster.ops import owner_reference, pod_reference
from driver.cluster.port import PODS, RESOURCE_CLAIMS, JsonObject
from driver.errors import ApiNotFoundError
from kubeletplugin.deviceplugin import Shim, ShimConfig
from kubeletplugin.node.inventory import NodeInventory
from kubeletplugin.plugin import KubeletPlugin
from localcluster.apiserver import LocalApiServer
from tests.kubeletplugin.harness import NodeHarness, node_selector
from tests.shim.fake_kubelet import FakeKubelet, FakePod

R_1G = classic_resource_name("1g.5gb")
R_3G = classic_resource_name("3g.20gb")


@dataclass(frozen=True)
class Reserved:
    """A classic pod as the controller leaves it: the pod in the API and its shadow claims."""

    pod: FakePod
    claims: tuple[str, ...]
    """Names of its shadow claims, in the order given."""


class ShimNode:
    def __init__(self, apiserver: LocalApiServer) -> None:
        self.apiserver = apiserver
        self.node = NodeHarness(api_url=apiserver.url)
        self.node.create_node()
        self.api = self.node.api
        self.device_plugin_dir = self.node.root / "dp"
        self.pod_resources_socket = self.node.root / "pr.sock"
        self.kubelet = FakeKubelet(
            device_plugin_dir=self.device_plugin_dir,
            pod_resources_socket=self.pod_resources_socket,
        )
        self.kubelet.start()
        self.plugin: KubeletPlugin | None = None
        self.shim: Shim | None = None
        self._names = itertools.count(1)

    def close(self) -> None:
        if self.shim is not None:
            self.shim.stop()
        self.kubelet.close()
        self.node.close()

    # -- node side -------------------------------------------------------------------------

    def start(
        self,
        *,
        grace: float = 60.0,
        step_hook: Callable[[str], None] | None = None,
        watch_seconds: float = 0.05,
        inventory: Callable[[], NodeInventory] | None = None,
        events: EventRecorder | None = None,
        serve: bool = True,
    ) -> Shim:
        """Start the plugin (recovery first) and a shim on it, as ``__main__`` does; the shim
        reads the plugin's inventory unless ``inventory`` is given."""
        self.plugin = self.node.start_plugin(step_hook=step_hook)
        plugin = self.plugin
        self.shim = Shim(
            config=ShimConfig(
                node_name=self.node.node,
                device_plugin_dir=self.device_plugin_dir,
                pod_resources_socket=self.pod_resources_socket,
                watch_seconds=watch_seconds,
                resync_seconds=3600,
                unheld_grace_seconds=grace,
            ),
            state=plugin.state,
            checkpoint=plugin.store,
            api=self.api,
            inventory=inventory or (lambda: plugin.publisher.inventory),
            events=events,
        )
        self.shim.start(serve=serve)
        shim = self.shim
        if serve:
            wait_for(lambda: bool(shim.registered()) and all(shim.registered().values()))
            self.kubelet.wait_registered([s.resource_name for s in shim.resources])
        return shim

    def crash(self) -> None:
        """Stop shim and plugin without any further pass: state stays as a killed process left it."""
        assert self.shim is not None
        assert self.plugin is not None
        self.shim.stop()
        self.node.stop_plugin(self.plugin)
        self.shim = None
        self.plugin = None

    def instances(self) -> list[tuple[int, str, int]]:
        return sorted((gpu, profile, start) for gpu, profile, start, _ in self.node.instances())

    def checkpoint(self) -> Checkpoint:
        return CheckpointStore(self.node.state_dir / "checkpoint.json").load()

    def cdi_files(self) -> int:
        return len(self.node.cdi_files())

    # -- API side: what the controller writes for a classic pod ------------------------------

    def classic_pod(
        self,
        containers: Sequence[tuple[str, Mapping[str, int]]],
        *,
        name: str | None = None,
        namespace: str = "default",
        on_node: bool = True,
    ) -> FakePod:
        """A pod bound to the node whose containers ask classic MIG resources."""
        name = name or f"pod-{next(self._names)}"
        spec: JsonObject = {
            "containers": [
                {
                    "name": container,
                    "image": "busybox",
                    "resources": {"limits": {r: str(n) for r, n in asked.items()}},
                }
                for container, asked in containers
            ]
        }
        if on_node:
            spec["nodeName"] = self.node.node
        obj = self.api.create(
            PODS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace},
                "spec": spec,
            },
        )
        return FakePod(
            namespace=namespace,
            name=name,
            uid=obj["metadata"]["uid"],
            containers=tuple((c, dict(a)) for c, a in containers),
        )

    def shadow_claim(
        self, pod: FakePod, container: str, devices: Sequence[str], *, profile: str
    ) -> str:
        """A shadow claim for ``pod``'s container, allocated to ``devices`` on this node."""
        pod_obj = self.api.get(PODS, name=pod.name, namespace=pod.namespace)
        name = f"{pod.name}-{container}-mig-{next(self._names)}"
        claim = self.api.create(
            RESOURCE_CLAIMS,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {
                    "name": name,
                    "namespace": pod.namespace,
                    "labels": {
                        SHADOW_CLAIM_LABEL: pod.uid,
                        SHADOW_CLAIM_PROFILE_LABEL: profile.replace("+", "-"),
                    },
                    "annotations": {SHADOW_CLAIM_CONTAINER_ANNOTATION: container},
                    "ownerReferences": [owner_reference(PODS, pod_obj)],
                    "finalizers": [DELETE_PROTECTION_FINALIZER],
                },
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "mig",
                                "exactly": {
                                    "deviceClassName": profile_device_class(profile),
                                    "count": len(devices),
                                },
                            }
                        ]
                    }
                },
            },
        )
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "mig",
                            "driver": DRIVER_NAME,
                            "pool": self.node.node,
                            "device": d,
                        }
                        for d in devices
                    ]
                },
                "nodeSelector": node_selector(self.node.node),
                "allocationTimestamp": "2026-05-01T10:00:00Z",
            },
            "reservedFor": [pod_reference(pod_obj)],
        }
        self.api.update_status(RESOURCE_CLAIMS, claim)
        return name

    def reserve(
        self,
        containers: Sequence[tuple[str, str, Sequence[Sequence[str]]]],
        *,
        name: str | None = None,
        namespace: str = "default",
    ) -> Reserved:
        """A classic pod and its shadow claims: per container (name, profile, device groups), one
        claim per device group (``[["a"], ["b"]]``: two claims; ``[["a", "b"]]``: one of count 2)."""
        pod = self.classic_pod(
            [
                (container, {classic_resource_name(profile): sum(len(g) for g in groups)})
                for container, profile, groups in containers
            ],
            name=name,
            namespace=namespace,
        )
        claims = tuple(
            self.shadow_claim(pod, container, group, profile=profile)
            for container, profile, groups in containers
            for group in groups
        )
        return Reserved(pod=pod, claims=claims)

    def claim(self, pod: FakePod | Reserved, name: str) -> JsonObject:
        namespace = pod.namespace if isinstance(pod, FakePod) else pod.pod.namespace
        return self.api.get(RESOURCE_CLAIMS, name=name, namespace=namespace)

    def claims_of(self, pod: FakePod) -> list[JsonObject]:
        """Shadow claims standing for ``pod`` now (by label)."""
        items = self.api.list_objects(
            RESOURCE_CLAIMS,
            namespace=pod.namespace,
            label_selector=f"{SHADOW_CLAIM_LABEL}={pod.uid}",
        ).items
        return sorted(items, key=lambda c: c["metadata"]["name"])

    def delete_pod(self, pod: FakePod) -> None:
        """Delete the pod from the API server (garbage collection then deletes its claims)."""
        with contextlib.suppress(ApiNotFoundError):
            self.api.delete(PODS, name=pod.name, namespace=pod.namespace)
        self.apiserver.settle()


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def devices_of(claim: JsonObject) -> list[str]:
    return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]
