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

import base64
import copy
import logging
import shutil
import socket
import ssl
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from api import names
from controller.certs import generate_ca, issue_serving_certificate
from controller.statussource import mig_uuids_from_checkpoints, read_view
from controller.statusview import ClusterView
from driver.checkpoint import CHECKPOINT_FILE_NAME
from driver.cluster.port import LEASES, RESOURCE_SLICES, JsonObject
from driver.errors import ApiNotFoundError, ConfigError
from driver.gpu.backend import MigInstance
from driver.gpu.emulated import EmulatedGpuBackend
from driver.resourceslices import complete_pools
from localcluster.cluster.client import LocalClusterClient
from localcluster.cluster.kubelet import RUN_SECONDS_ANNOTATION, Kubelet, NodeSpec
from localcluster.cluster.runner import LocalCluster
from localcluster.manifests import (
    MUTATING_WEBHOOK_CONFIGURATIONS,
    Outcome,
    apply_object,
    load_file,
)
from localcluster.processes import ManagedProcess

log = logging.getLogger(__name__)

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parent.parent
DEPLOY_BASE = REPO_ROOT / "deploy" / "base"
SAMPLES_DIR = REPO_ROOT / "samples"
WEBHOOK_PATH = "/mutate-v1-pod"
DEFAULT_GPUS = "2xA100-40GB"
READY_TIMEOUT_S = 60.0


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


@dataclass(frozen=True, slots=True)
class NodePaths:
    """Where one node's plugin keeps its state, besides the kubelet's own directories."""

    state_dir: Path
    cdi_root: Path
    emulated_state_file: Path

    @property
    def checkpoint(self) -> Path:
        return self.state_dir / CHECKPOINT_FILE_NAME


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class InstaSliceStack:
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
        self._register_webhook()
        for node in self.node_names:
            self.plugins[node] = self._plugin_process(node)
            self.plugins[node].start()
        self.controller = self._controller_process(cert_dir)
        self.controller.start()
        self.wait_ready(timeout=timeout)

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

    def _plugin_process(self, node: str, *, classic_shim: bool = True) -> ManagedProcess:
        kubelet = self.kubelet(node)
        paths = self.node_paths(node)
        paths.emulated_state_file.parent.mkdir(parents=True, exist_ok=True)
        args = [
            "--node-name", node,
            "--gpu-backend", "emulated",
            "--emulated-gpus", self.config.gpus,
            "--emulated-state-file", str(paths.emulated_state_file),
            "--kube-api-url", self.url,
            "--plugin-registry-dir", str(kubelet.registry_dir),
            "--plugin-dir", str(kubelet.plugins_dir / names.DRIVER_NAME),
            "--device-plugin-dir", str(kubelet.device_plugins_dir),
            "--pod-resources-socket", str(kubelet.pod_resources_socket),
            "--cdi-root", str(paths.cdi_root),
            "--state-dir", str(paths.state_dir),
            "--metrics-address", "",
            "--healthz-address", "",
            "--inventory-poll-seconds", str(self.config.inventory_poll_s),
            "--log-level", self.config.log_level,
            "--classic-shim", "on" if classic_shim else "off",
        ]  # fmt: skip
        return ManagedProcess(
            name=f"kubelet-plugin/{node}",
            module="kubeletplugin",
            args=args,
            log_file=self.logs_dir / f"kubelet-plugin-{node}.log",
        )

    def _controller_process(self, cert_dir: Path) -> ManagedProcess:
        lease = self.config.lease_duration_s
        args = [
            "--kube-api-url", self.url,
            "--webhook-port", str(self.webhook_port),
            "--webhook-cert-dir", str(cert_dir),
            "--cert-mode", "files",
            "--metrics-address", "",
            "--healthz-address", "",
            "--log-level", self.config.log_level,
        ]  # fmt: skip
        if self.config.leader_elect:
            args += [
                "--leader-elect",
                "--lease-duration", str(lease),
                "--renew-deadline", str(max(lease - 1, 1) * 0.75),
                "--retry-period", "0.5",
            ]  # fmt: skip
        else:
            args.append("--no-leader-elect")
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
        restarts it with ``--classic-shim`` switched (None: the same flags as before)."""
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
        apply_object(self.api, webhook_configuration(url=url, ca_bundle=self._ca_bundle))

    def webhook_serving(self) -> bool:
        context = ssl.create_default_context(cadata=self._ca_bundle.decode())
        try:
            with (
                socket.create_connection(("127.0.0.1", self.webhook_port), timeout=1.0) as raw,
                context.wrap_socket(raw, server_hostname="127.0.0.1"),
            ):
                return True
        except (OSError, ssl.SSLError):
            return False

    # --- readiness ------------------------------------------------------------------------------

    def wait_for(
        self,
        predicate: Callable[[], T | None],
        *,
        timeout: float = 30.0,
        interval: float = 0.05,
        message: str = "",
    ) -> T:
        """Poll ``predicate`` until it returns something truthy; a daemon that died meanwhile
        ends the wait at once with its log tail."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            self.check_daemons()
            if time.monotonic() >= deadline:
                raise TimeoutError(message or f"condition not met within {timeout}s")
            time.sleep(interval)

    def check_daemons(self) -> None:
        for process in [*self.plugins.values(), *([self.controller] if self.controller else [])]:
            if process.starts and not process.running():
                raise RuntimeError(
                    f"{process.name} exited with status {process.returncode()}; last lines of "
                    f"{process.log_file}:\n{process.log_tail()}"
                )

    def published_nodes(self) -> set[str]:
        slices = self.api.list_objects(
            RESOURCE_SLICES, field_selector=f"spec.driver={names.DRIVER_NAME}"
        ).items
        return set(complete_pools(slices))

    def plugin_registered(self, node: str) -> bool:
        return self.kubelet(node).plugins.get(names.DRIVER_NAME) is not None

    def classic_resources(self, node: str) -> dict[str, int]:
        """``nvidia.com/mig-*`` resources the node's device-plugin shim registered (allocatable)."""
        return {
            name: allocatable
            for name, (_, allocatable) in self.kubelet(node).device_manager.resources().items()
            if name.startswith(names.CLASSIC_RESOURCE_PREFIX)
        }

    def leader(self) -> str | None:
        try:
            lease = self.api.get(
                LEASES, name=names.LEADER_LEASE_NAME, namespace=names.SYSTEM_NAMESPACE
            )
        except ApiNotFoundError:
            return None
        holder = (lease.get("spec") or {}).get("holderIdentity")
        return str(holder) if holder else None

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

    def view(self) -> ClusterView:
        """The slice map, with the MIG UUIDs the plugins' checkpoints record."""
        return read_view(self.api, mig_uuids=self.mig_uuids())

    def mig_uuids(self) -> dict[tuple[str, str], str]:
        return mig_uuids_from_checkpoints(self.node_paths(n).checkpoint for n in self.node_names)

    def kubeconfig_hint(self) -> str:
        return f"export KUBECONFIG={self.kubeconfig}" if self.kubeconfig else ""


def write_webhook_certificates(cert_dir: Path) -> bytes:
    """A CA and a serving certificate for 127.0.0.1 (``tls.crt``, ``tls.key``, ``ca.crt`` in
    ``cert_dir``, as ``--cert-mode files`` reads them); returns the CA's PEM for the caBundle."""
    now = datetime.now(UTC)
    ca_cert, ca_key = generate_ca(
        common_name="instaslice-local-ca", now=now, validity=timedelta(days=1)
    )
    cert, key = issue_serving_certificate(
        ca_cert_pem=ca_cert,
        ca_key_pem=ca_key,
        dns_names=["localhost"],
        ip_addresses=["127.0.0.1"],
        now=now,
        validity=timedelta(days=1),
    )
    cert_dir.mkdir(parents=True, exist_ok=True)
    (cert_dir / "tls.key").write_bytes(key)
    (cert_dir / "tls.key").chmod(0o600)
    (cert_dir / "tls.crt").write_bytes(cert)
    (cert_dir / "ca.crt").write_bytes(ca_cert)
    return ca_cert


def webhook_configuration(*, url: str, ca_bundle: bytes) -> JsonObject:
    """The MutatingWebhookConfiguration of ``deploy/base/webhook.yaml`` (same rules), calling
    ``url`` — a webhook on this machine, as kube-apiserver reaches it — instead of the Service."""
    configs = [
        o
        for o in load_file(DEPLOY_BASE / "webhook.yaml")
        if o.get("kind") == MUTATING_WEBHOOK_CONFIGURATIONS.kind
    ]
    if len(configs) != 1:
        raise ConfigError(f"{DEPLOY_BASE / 'webhook.yaml'} must hold one webhook configuration")
    config = copy.deepcopy(configs[0])
    for hook in config.get("webhooks") or []:
        hook["clientConfig"] = {"url": url, "caBundle": base64.b64encode(ca_bundle).decode()}
    return config
