"""The whole InstaSlice system on one machine: what ``make demo`` and the end-to-end tests run.

:class:`InstaSliceStack` starts a :class:`~localcluster.cluster.runner.LocalCluster` (API server,
claim and workload controllers, scheduler, one emulated kubelet per node) in this process, then the
**real** daemons as separate processes, exactly as a cluster runs them:

* one ``instaslice-kubelet-plugin`` per node (emulated GPUs whose state file outlives the process,
  like MIG instances outlive a crashed plugin), with the kubelet's directories of its node;
* one ``instaslice-controller`` (and the webhook process it starts), its pod webhook on
  ``https://127.0.0.1:<port>`` registered with
  the API server through the MutatingWebhookConfiguration of ``deploy/base/webhook.yaml`` (the
  same rules, ``clientConfig.url`` instead of the in-cluster Service, and a CA made here);
* the DeviceClasses of ``deploy/base/deviceclasses.yaml``.

Everything lives under one root directory (sockets, checkpoints, CDI specs, certificates, logs);
``stop`` ends every process and thread and, when the root was made here, removes it.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from api import names
from driver.cluster.port import JsonObject
from driver.gpu.backend import MigInstance
from driver.gpu.emulated import EmulatedGpuBackend
from localcluster.cluster.client import LocalClusterClient
from localcluster.cluster.kubelet import RUN_SECONDS_ANNOTATION, Kubelet, NodeSpec
from localcluster.cluster.runner import LocalCluster
from localcluster.daemonstack import (
    DEPLOY_BASE,
    REPO_ROOT,
    WEBHOOK_PATH,
    DaemonStack,
    NodePaths,
    controller_args,
    free_port,
    plugin_args,
    webhook_configuration,
    write_webhook_certificates,
)
from localcluster.manifests import (
    Outcome,
    apply_object,
    load_file,
)
from localcluster.processes import ManagedProcess

log = logging.getLogger(__name__)

__all__ = [
    "DEPLOY_BASE",
    "SAMPLES_DIR",
    "WEBHOOK_PATH",
    "InstaSliceStack",
    "NodePaths",
    "StackConfig",
    "free_port",
    "webhook_configuration",
    "write_webhook_certificates",
]


SAMPLES_DIR = REPO_ROOT / "samples"
DEFAULT_GPUS = "2xA100-40GB"
READY_TIMEOUT_S = 60.0
LOCAL_WEBHOOK_TIMEOUT_S = 15
"""Seconds kube-apiserver (here: the local API server) waits for our webhook (deploy: 3 and 5)."""


@dataclass(frozen=True, slots=True)
class StackConfig:
    nodes: int = 2
    gpus: str = DEFAULT_GPUS
    """Emulated GPUs per node, as ``--emulated-gpus`` takes them (``2xA100-40GB``)."""
    node_prefix: str = "node-"
    log_level: str = "INFO"
    leader_elect: bool = True
    lease_duration_s: int = 4
    """Short, so a controller started after one was killed takes over within seconds."""
    inventory_poll_s: float = 30.0

    def node_names(self) -> list[str]:
        return [f"{self.node_prefix}{i}" for i in range(self.nodes)]


class InstaSliceStack(DaemonStack):
    poll_interval_s = 0.05

    def __init__(self, config: StackConfig | None = None, *, root: Path | None = None) -> None:
        self.config = config or StackConfig()
        self._owns_root = root is None
        # Short paths: unix socket names are limited to 107 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="instaslice-")) if root is None else Path(root)
        self.cluster = LocalCluster(
            [
                NodeSpec(name=name, cdi_dirs=(self.node_paths(name).cdi_root,))
                for name in self.config.node_names()
            ],
            self.root / "cluster",
        )
        self.webhook_port = 0
        self.controller_metrics_port = 0
        self.controller: ManagedProcess | None = None
        self.plugins: dict[str, ManagedProcess] = {}
        self._ca_bundle = b""

    # --- paths and parts ------------------------------------------------------------------------

    @property
    def api(self) -> LocalClusterClient:
        if self.cluster.api is None:
            raise RuntimeError("the stack is not started")
        return self.cluster.api

    @property
    def url(self) -> str:
        return self.cluster.url

    @property
    def kubeconfig(self) -> Path | None:
        return self.cluster.kubeconfig

    @property
    def node_names(self) -> list[str]:
        return self.config.node_names()

    def node_paths(self, node: str) -> NodePaths:
        base = self.root / "nodes" / node
        return NodePaths(
            state_dir=base / "instaslice",
            cdi_root=base / "cdi",
            emulated_state_file=base / "gpus" / "emulated-gpus.json",
        )

    def kubelet(self, node: str) -> Kubelet:
        return self.cluster.kubelet(node)

    timeout_scale = 1.0
    """Waits in scenarios shared with the real stack are multiplied by this."""

    def apply(self, objects: Iterable[JsonObject]) -> list[Outcome]:
        """Create or update ``objects`` as ``kubectl apply`` would (kinds the local API server
        does not serve are skipped, and say so)."""
        return [apply_object(self.api, obj) for obj in objects]

    def exit_annotations(self, container: str, seconds: float) -> dict[str, str]:
        """Pod annotations that end the pod's containers ``seconds`` after they start (the
        local kubelet ends the whole pod; ``container`` matters on the real stack)."""
        del container
        return {RUN_SECONDS_ANNOTATION: f"{seconds:g}"}

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    # --- life cycle -----------------------------------------------------------------------------

    def start(self, *, timeout: float = READY_TIMEOUT_S) -> InstaSliceStack:
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        self.cluster.start()
        apply_object(
            self.api,
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": names.SYSTEM_NAMESPACE}},
        )
        for obj in load_file(DEPLOY_BASE / "deviceclasses.yaml"):
            apply_object(self.api, obj)
        cert_dir = self._make_certificates()
        self.webhook_port = free_port()
        self.controller_metrics_port = free_port()
        self._register_webhook()
        for node in self.node_names:
            self.plugins[node] = self._plugin_process(node)
            self.plugins[node].start()
        self.controller = self._controller_process(cert_dir)
        self.controller.start()
        # every plugin starts with its classic shim on: wait for it too, or a classic pod created
        # at once (the demo's samples) can reach a kubelet that does not serve nvidia.com/mig-* yet
        self.wait_ready(timeout=timeout, classic=True)

    def stop(self, *, keep_logs: Path | None = None) -> None:
        """Controller first (no new allocations), then plugins, then the cluster; idempotent.
        ``keep_logs``: copy the daemons' logs there before the root is removed."""
        if self.controller is not None:
            self.controller.stop()
        for process in self.plugins.values():
            process.stop()
        self.cluster.stop()
        if keep_logs is not None and self.logs_dir.is_dir():
            shutil.copytree(self.logs_dir, keep_logs, dirs_exist_ok=True)
        if self._owns_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> InstaSliceStack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- the daemons ----------------------------------------------------------------------------

    def daemons(self) -> list[ManagedProcess]:
        return [*self.plugins.values(), *([self.controller] if self.controller else [])]

    def _plugin_process(self, node: str, *, classic_shim: bool = True) -> ManagedProcess:
        paths = self.node_paths(node)
        paths.emulated_state_file.parent.mkdir(parents=True, exist_ok=True)
        args = plugin_args(
            node,
            connection=["--kube-api-url", self.url],
            gpus=self.config.gpus,
            paths=paths,
            kubelet=self.kubelet(node),
            inventory_poll_s=self.config.inventory_poll_s,
            log_level=self.config.log_level,
        )
        args += ["--classic-shim", "on" if classic_shim else "off"]
        return ManagedProcess(
            name=f"kubelet-plugin/{node}",
            module="kubeletplugin",
            args=args,
            log_file=self.logs_dir / f"kubelet-plugin-{node}.log",
        )

    def _controller_process(self, cert_dir: Path) -> ManagedProcess:
        args = controller_args(
            connection=["--kube-api-url", self.url],
            webhook_port=self.webhook_port,
            cert_dir=cert_dir,
            log_level=self.config.log_level,
            leader_elect=self.config.leader_elect,
            lease_duration_s=self.config.lease_duration_s,
            metrics_port=self.controller_metrics_port,
        )
        return ManagedProcess(
            name="controller",
            module="controller",
            args=args,
            log_file=self.logs_dir / "controller.log",
        )

    def restart_plugin(
        self, node: str, *, kill: bool = True, classic_shim: bool | None = None
    ) -> None:
        """Kill (or stop) the node's kubelet plugin and start it again; ``classic_shim`` on/off
        restarts it with ``--classic-shim`` switched (None: the flags it ran with)."""
        process = self.plugins[node]
        if kill:
            process.kill()
        else:
            process.stop()
        if classic_shim is not None:
            process = self._plugin_process(node, classic_shim=classic_shim)
            self.plugins[node] = process
        process.start()

    # --- webhook --------------------------------------------------------------------------------

    def _make_certificates(self) -> Path:
        """A CA and a serving certificate for 127.0.0.1 (``--cert-mode files``)."""
        cert_dir = self.root / "controller" / "webhook-certs"
        self._ca_bundle = write_webhook_certificates(cert_dir)
        return cert_dir

    def _register_webhook(self) -> None:
        url = f"https://127.0.0.1:{self.webhook_port}{WEBHOOK_PATH}"
        config = webhook_configuration(url=url, ca_bundle=self._ca_bundle)
        # deploy/base/webhook.yaml's rules, with more time per call: the pods-with-claims hook fails
        # open after its 3 s, and kube-scheduler then allocates such a pod itself, but this
        # cluster's scheduler only binds, so here a pod the webhook missed would never run, and a
        # loaded 2-core machine can take seconds for a first call. The real stack keeps the
        # deployed timeouts.
        for hook in config.get("webhooks") or []:
            hook["timeoutSeconds"] = LOCAL_WEBHOOK_TIMEOUT_S
        apply_object(self.api, config)

    # --- readiness ------------------------------------------------------------------------------

    def plugin_registered(self, node: str) -> bool:
        return self.kubelet(node).plugins.get(names.DRIVER_NAME) is not None

    def classic_resources(self, node: str) -> dict[str, int]:
        """``nvidia.com/mig-*`` resources the node's device-plugin shim registered (allocatable)."""
        return {
            name: allocatable
            for name, (_, allocatable) in self.kubelet(node).device_manager.resources().items()
            if name.startswith(names.CLASSIC_RESOURCE_PREFIX)
        }

    def wait_ready(self, *, timeout: float = READY_TIMEOUT_S, classic: bool = False) -> None:
        """Every plugin registered with its kubelet and its node's slices published, the webhook
        serving and (with leader election) a leader elected; with ``classic`` also every node's
        device-plugin shim registered."""
        nodes = set(self.node_names)
        self.wait_for(
            lambda: all(self.plugin_registered(n) for n in nodes),
            timeout=timeout,
            message="kubelet plugins did not register with their kubelets",
        )
        self.wait_for(
            lambda: self.published_nodes() >= nodes,
            timeout=timeout,
            message="kubelet plugins did not publish their ResourceSlices",
        )
        self.wait_for(
            self.webhook_serving, timeout=timeout, message="the controller's webhook is not serving"
        )
        if self.config.leader_elect:
            self.wait_for(self.leader, timeout=timeout, message="no controller became leader")
        if classic:
            self.wait_for(
                lambda: all(self.classic_resources(n) for n in nodes),
                timeout=timeout,
                message="no nvidia.com/mig-* resource registered by the device-plugin shim",
            )

    # --- what is on the GPUs --------------------------------------------------------------------

    def mig_instances(self, node: str) -> tuple[MigInstance, ...]:
        """The MIG instances that exist on ``node``'s emulated GPUs (read from the state file the
        plugin writes, as ``nvidia-smi`` reads the GPU)."""
        backend = EmulatedGpuBackend(
            node_name=node,
            spec=self.config.gpus,
            state_file=self.node_paths(node).emulated_state_file,
        )
        try:
            return backend.instances()
        finally:
            backend.close()

    def kubeconfig_hint(self) -> str:
        return f"export KUBECONFIG={self.kubeconfig}" if self.kubeconfig else ""
