"""InstaSlice on a real Kubernetes control plane and real kubelets: the real-stack test tier.

``../shared/realstack/`` builds kube-apiserver, kube-scheduler, kube-controller-manager, etcd and the
kubelet from public source, and a fake CRI runtime that records what every container would have been
given. :class:`RealStack` runs our daemons on it the way a cluster does:

* the control plane is (re)started clean from the scripts' own directory;
* our namespace, RBAC (``deploy/base/rbac-*.yaml``) and DeviceClasses are applied; each daemon talks
  to the API server **as its own ServiceAccount** (a token from the TokenRequest API), so a missing
  grant fails here as it would in a cluster;
* one real kubelet per node (``run-node.sh``), one ``instaslice-kubelet-plugin`` per node on the
  host, pointed at that kubelet's directories, with emulated GPUs;
* ``instaslice-controller`` with its webhook reached by URL (certificate for 127.0.0.1).

Nodes may also join and leave a running stack (``add_node``, ``remove_node``), each with its own GPUs,
labels and provider id — what a cloud provider does for cluster-autoscaler (``tests/autoscale``).

It offers what the end-to-end scenarios use from :class:`localcluster.stack.InstaSliceStack`
(``api``, ``node_names``, ``node_paths``, ``kubelet(node).container_devices``, ``mig_instances``,
``view``, ``wait_for``, ``restart_plugin``...), so one scenario runs on both stacks. What a container
got is read from the fake runtime's records, with its CDI ids resolved by the CDI library itself
(``cdi-validate``).

Where the stack lives (defaults are the build scripts' own):

``INSTASLICE_REAL_K8S``       control plane directory (``${TMPDIR:-/tmp}/k8s``)
``INSTASLICE_REAL_NODES``     kubelet directory (``${TMPDIR:-/tmp}/k8s-node``)
``INSTASLICE_REAL_CDI``       the CDI validator (``${TMPDIR:-/tmp}/cdi-validate/bin/cdi-validate``)
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from api import names
from driver.cluster.kube import KubeClusterApi, load_configuration
from driver.cluster.port import EVENTS, NODES, JsonObject
from driver.errors import ApiNotFoundError, ConfigError
from driver.gpu.backend import MigInstance
from driver.gpu.emulated import EmulatedGpuBackend
from localcluster.daemonstack import (
    DEPLOY_BASE,
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
    resource_for,
)
from localcluster.processes import ManagedProcess

log = logging.getLogger(__name__)


READY_TIMEOUT_S = 120.0
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
EXIT_ANNOTATION_PREFIX = "fake-cri/exit."
"""The fake runtime ends a container that many seconds after it started: ``"<s>[:<code>]"``."""
_TOKEN_SECONDS = 6 * 3600
_KUBELET_ERROR = re.compile(r"^E\d{4} ")


def stack_path(env: str, *parts: str) -> Path:
    """``$env`` when set, else ``parts`` under ``$TMPDIR`` (``/tmp``): where ``../shared/realstack``
    put a piece of the stack."""
    value = os.environ.get(env)
    if value:
        return Path(value)
    return Path(os.environ.get("TMPDIR") or "/tmp").joinpath(*parts)


FAKE_RUNTIME_NODE = ("run-node.sh", "stop-node.sh", "bin/kubelet", "bin/fake-cri")
"""What a node of this tier needs under ``StackPaths.nodes``: kubelets with the fake runtime."""


@dataclass(frozen=True, slots=True)
class StackPaths:
    """Where ``../shared/realstack/`` put the control plane, the nodes and the CDI validator; both
    tiers on it (this one, and the deploy tier's containerd nodes) read it, each asking
    ``missing`` for the node pieces it runs on."""

    control_plane: Path
    nodes: Path
    cdi_validate: Path

    @classmethod
    def from_environment(cls) -> StackPaths:
        return cls(
            control_plane=stack_path("INSTASLICE_REAL_K8S", "k8s"),
            nodes=stack_path("INSTASLICE_REAL_NODES", "k8s-node"),
            cdi_validate=stack_path("INSTASLICE_REAL_CDI", "cdi-validate", "bin", "cdi-validate"),
        )

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane / "kubeconfig"

    @property
    def kubectl(self) -> Path:
        return self.control_plane / "bin" / "kubectl"

    def missing(
        self, node_pieces: Sequence[str], *, more: Sequence[Path] = (), tools: Sequence[str] = ()
    ) -> list[str]:
        """What is not built (empty when the tier can run), as paths or commands: of the control
        plane, ``node_pieces`` under ``nodes``, the paths ``more`` and the commands ``tools``."""
        wanted = [
            self.control_plane / "start.sh",
            self.control_plane / "stop.sh",
            self.control_plane / "bin" / "kube-apiserver",
            self.kubectl,
            self.kubeconfig,
            *(self.nodes / piece for piece in node_pieces),
            *more,
        ]
        found = [str(p) for p in wanted if not p.exists()]
        return found + [tool for tool in tools if shutil.which(tool) is None]


def _missing(paths: StackPaths) -> list[str]:
    return paths.missing(FAKE_RUNTIME_NODE, more=(paths.cdi_validate,))


def not_built(what: str, missing: Sequence[str], *, see: str) -> str | None:
    """One line saying that ``what`` cannot run for ``missing``, or None when nothing is."""
    if not missing:
        return None
    more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
    return f"{what} not built ({missing[0]} missing{more}): see {see}"


@dataclass(frozen=True, slots=True)
class RealStackConfig:
    nodes: int = 2
    gpus: str = "2xA100-40GB"
    node_prefix: str = "node-"
    log_level: str = "INFO"
    leader_elect: bool = True
    controllers: int = 1
    """Controller replicas (leader election decides which one allocates)."""
    lease_duration_s: int = 4
    inventory_poll_s: float = 30.0
    controller_args: tuple[str, ...] = ()
    plugin_args: tuple[str, ...] = ()
    control_plane_env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for ``start.sh`` (``KCM_EXTRA_FLAGS``, ``APISERVER_EXTRA_FLAGS``...)."""

    def node_names(self) -> list[str]:
        return [f"{self.node_prefix}{i}" for i in range(self.nodes)]


@dataclass(frozen=True, slots=True)
class ContainerRecord:
    """One CreateContainer request the fake runtime recorded."""

    pod_uid: str
    pod_namespace: str
    pod_name: str
    container: str
    cdi_devices: tuple[str, ...]
    envs: Mapping[str, str]


def _cri_bytes(value: Any) -> str:
    """A CRI ``KeyValue.value``: ``bytes`` in the 1.36 CRI API, so protojson wrote it base64."""
    text = str(value or "")
    try:
        return base64.b64decode(text, validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return text


def read_container_records(state_dir: Path) -> list[ContainerRecord]:
    """The live containers of one node, from ``cri-state/containers/<id>.json``."""
    records = []
    for path in sorted((state_dir / "containers").glob("*.json")):
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # removed or being written meanwhile
        config = raw.get("config") or {}
        sandbox = (raw.get("sandboxConfig") or raw.get("sandbox_config") or {}).get(
            "metadata"
        ) or {}
        cdi = config.get("CDIDevices") or config.get("cdiDevices") or config.get("cdi_devices")
        records.append(
            ContainerRecord(
                pod_uid=str(sandbox.get("uid") or ""),
                pod_namespace=str(sandbox.get("namespace") or ""),
                pod_name=str(sandbox.get("name") or ""),
                container=str((config.get("metadata") or {}).get("name") or ""),
                cdi_devices=tuple(str(d.get("name") or "") for d in cdi or []),
                envs={
                    str(e.get("key")): _cri_bytes(e.get("value")) for e in config.get("envs") or []
                },
            )
        )
    return records


class CdiValidator:
    """The CDI library (v1.1.0, what containerd and CRI-O use) through ``cdi-validate``."""

    def __init__(self, binary: Path) -> None:
        self.binary = binary

    def inject(self, cdi_dir: Path, devices: Sequence[str]) -> JsonObject:
        """What injecting ``devices`` from the specs in ``cdi_dir`` does to an empty OCI spec
        (``{"env": [...], "devices": [...]}``); ``ConfigError`` when the library refuses."""
        done = subprocess.run(
            [str(self.binary), str(cdi_dir), *devices],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            raise ConfigError(f"CDI injection of {list(devices)} failed: {done.stderr.strip()}")
        parsed = json.loads(done.stdout)
        if not isinstance(parsed, dict):
            raise ConfigError(f"cdi-validate printed {done.stdout!r}")
        return parsed


class RealKubelet:
    """One real kubelet (``run-node.sh``) and what its fake runtime recorded."""

    def __init__(self, *, name: str, paths: StackPaths, cdi: CdiValidator, cdi_root: Path):
        self.name = name
        self.dir = paths.nodes / name
        self._paths = paths
        self._cdi = cdi
        self._cdi_root = cdi_root

    @property
    def root(self) -> Path:
        return self.dir / "root"

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
    def pod_resources_socket(self) -> Path:
        return self.root / "pod-resources" / "kubelet.sock"

    @property
    def log_file(self) -> Path:
        return self.dir / "kubelet.log"

    def pid(self) -> int | None:
        try:
            return int((self.dir / "kubelet.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def running(self) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True

    def containers(self) -> list[ContainerRecord]:
        return read_container_records(self.dir / "cri-state")

    def container_devices(
        self, pod_uid: str, container: str
    ) -> tuple[tuple[str, ...], dict[str, str]]:
        """CDI ids and environment the container was created with, CDI edits applied by the CDI
        library (the env of the devices after the container's own); ``KeyError`` if none."""
        for record in self.containers():
            if record.pod_uid == pod_uid and record.container == container:
                envs = dict(record.envs)
                if record.cdi_devices:
                    injected = self._cdi.inject(self._cdi_root, record.cdi_devices)
                    for item in injected.get("env") or []:
                        key, _, value = str(item).partition("=")
                        envs[key] = value
                return record.cdi_devices, envs
        raise KeyError(f"pod {pod_uid} has no created container {container!r} on {self.name}")

    def error_lines(self) -> list[str]:
        """The kubelet's error-level log lines (klog ``E`` lines)."""
        try:
            text = self.log_file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if _KUBELET_ERROR.match(line)]


class RealStack(DaemonStack):
    """The control plane, real kubelets and our daemons; a context manager."""

    poll_interval_s = 0.1

    def __init__(
        self,
        config: RealStackConfig | None = None,
        *,
        paths: StackPaths | None = None,
        root: Path | None = None,
    ) -> None:
        self.config = config or RealStackConfig()
        self.paths = paths or StackPaths.from_environment()
        self._owns_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="instaslice-real-")) if root is None else root
        self.cdi = CdiValidator(self.paths.cdi_validate)
        self._api: KubeClusterApi | None = None
        self.webhook_port = 0
        self.controller_metrics_port = 0
        self.replica_metrics_ports: list[int] = []
        """``/metrics`` of each controller replica (127.0.0.1), the first one's included."""
        self.controllers: list[ManagedProcess] = []
        self.plugins: dict[str, ManagedProcess] = {}
        self._nodes_lock = threading.Lock()
        self._nodes: list[str] = []
        self._node_gpus: dict[str, str] = {}
        """Every node's emulated GPUs, kept after it left (what was left on them is still read)."""
        self._kubelets: dict[str, RealKubelet] = {}
        for name in self.config.node_names():
            self._join(name, gpus=self.config.gpus)
        self._ca_bundle = b""
        self._cert_dir = self.root / "controller" / "webhook-certs"
        self._credentials: dict[str, Path] = {}
        self._plugin_mode_args: list[str] = []
        self._controller_mode_args: list[str] = []
        self._indexes_starting: set[int] = set()

    # --- parts ----------------------------------------------------------------------------------

    @property
    def api(self) -> KubeClusterApi:
        if self._api is None:
            raise RuntimeError("the stack is not started")
        return self._api

    @property
    def controller(self) -> ManagedProcess | None:
        return self.controllers[0] if self.controllers else None

    @property
    def node_names(self) -> list[str]:
        """The nodes in the stack now (the configured ones, and those added and not removed)."""
        with self._nodes_lock:
            return list(self._nodes)

    def _join(self, node: str, *, gpus: str) -> None:
        with self._nodes_lock:
            if node in self._nodes:
                raise ConfigError(f"node {node} is already in the stack")
            self._nodes.append(node)
            self._node_gpus[node] = gpus
            self._kubelets[node] = RealKubelet(
                name=node, paths=self.paths, cdi=self.cdi, cdi_root=self.node_paths(node).cdi_root
            )

    @property
    def kubeconfig(self) -> Path:
        return self.paths.kubeconfig

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    def node_paths(self, node: str) -> NodePaths:
        base = self.root / "nodes" / node
        return NodePaths(
            state_dir=base / "instaslice",
            cdi_root=base / "cdi",
            emulated_state_file=base / "gpus" / "emulated-gpus.json",
        )

    def kubelet(self, node: str) -> RealKubelet:
        return self._kubelets[node]

    timeout_scale = 6.0
    """Real kubelets sync pods on their own loops and back off after a failed prepare (10 s,
    doubling): scenario waits get more time here."""

    # --- life cycle -----------------------------------------------------------------------------

    def start(self, *, timeout: float = READY_TIMEOUT_S) -> RealStack:
        missing = _missing(self.paths)
        if missing:
            raise ConfigError(f"the real stack is not built: missing {', '.join(missing)}")
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        self._run_script(
            [str(self.paths.control_plane / "start.sh"), "--clean"],
            env=dict(self.config.control_plane_env),
            what="control plane start",
            timeout=300,
        )
        self._api = KubeClusterApi(
            configuration=load_configuration(kubeconfig=str(self.paths.kubeconfig))
        )
        self.kubectl_apply(load_file(DEPLOY_BASE / "namespace.yaml"))
        self.kubectl_apply(load_file(DEPLOY_BASE / "rbac-controller.yaml"))
        self.kubectl_apply(load_file(DEPLOY_BASE / "rbac-kubelet-plugin.yaml"))
        self.kubectl_apply(load_file(DEPLOY_BASE / "deviceclasses.yaml"))
        controller_kubeconfig = self._service_account_kubeconfig("instaslice-controller")
        self._credentials = {"controller": controller_kubeconfig}
        for node in self.node_names:
            self.start_node(node)
        self._make_certificates()
        self.webhook_port = free_port()
        self.controller_metrics_port = free_port()
        self.replica_metrics_ports = [self.controller_metrics_port] + [
            free_port() for _ in range(1, self.config.controllers)
        ]
        self._register_webhook()
        for node in self.node_names:
            # a DaemonSet pod's token is bound to its pod, and so to its node: the 1.36
            # node-scoped checks (resourceclaims/driver associated-node:update) need that
            self._credentials[f"plugin/{node}"] = self._service_account_kubeconfig(
                "instaslice-kubelet-plugin", node=node
            )
            self.plugins[node] = self._plugin_process(node, self._credentials[f"plugin/{node}"])
            self.plugins[node].start()
        for index in range(self.config.controllers):
            process = self._controller_process(index, controller_kubeconfig)
            self.controllers.append(process)
            process.start()
        self.wait_ready(timeout=timeout)

    def stop(self, *, keep_logs: Path | None = None) -> None:
        """Controllers, plugins, kubelets (Nodes deleted), control plane; idempotent."""
        for process in self.controllers:
            process.stop()
        for process in self.plugins.values():
            process.stop()
        for node in self.node_names:
            self._save_kubelet_log(node)
            self.stop_node(node, delete=False, purge=True)
        if self._api is not None:
            self._api.close()
            self._api = None
        with contextlib.suppress(ConfigError):
            self._run_script(
                [str(self.paths.control_plane / "stop.sh")], what="control plane stop", timeout=60
            )
        if keep_logs is not None and self.logs_dir.is_dir():
            shutil.copytree(self.logs_dir, keep_logs, dirs_exist_ok=True)
        if self._owns_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> RealStack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- kubelets -------------------------------------------------------------------------------

    def start_node(
        self,
        node: str,
        *,
        labels: Mapping[str, str] | None = None,
        provider_id: str = "",
        index: int | None = None,
    ) -> None:
        """``run-node.sh``: fake runtime + kubelet, waits until the Node is Ready. ``labels`` are
        the kubelet's ``--node-labels``, ``provider_id`` its ``--provider-id`` (the Node's
        ``spec.providerID``), ``index`` picks its ports (the script picks a free one without it;
        nodes started at the same time need distinct ones)."""
        env = {"CLUSTER_KUBECONFIG": str(self.paths.kubeconfig)}
        if labels:
            env["NODE_LABELS"] = ",".join(f"{key}={value}" for key, value in labels.items())
        if provider_id:
            env["KUBELET_EXTRA_ARGS"] = f"--provider-id={provider_id}"
        argv = [str(self.paths.nodes / "run-node.sh"), node]
        argv += [str(index)] if index is not None else []
        self._run_script(argv, env=env, what=f"kubelet {node} start", timeout=180)

    def stop_node(self, node: str, *, delete: bool = False, purge: bool = False) -> None:
        if not (self.paths.nodes / node).is_dir():
            return
        args = [str(self.paths.nodes / "stop-node.sh"), node]
        args += ["--delete"] if delete else []
        args += ["--purge"] if purge else []
        with contextlib.suppress(ConfigError):
            self._run_script(args, what=f"kubelet {node} stop", timeout=60)

    def kill_kubelet(self, node: str) -> None:
        """SIGKILL the node's kubelet (its fake runtime keeps running, as containerd would)."""
        pid = self.kubelet(node).pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while self.kubelet(node).running() and time.monotonic() < deadline:
                time.sleep(0.1)

    def restart_kubelet(self, node: str) -> None:
        """Start the kubelet of a node whose kubelet was killed (``run-node.sh`` again)."""
        self.stop_node(node)
        self.start_node(node)

    def _save_kubelet_log(self, node: str) -> None:
        source = self.kubelet(node).log_file
        if source.is_file():
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                shutil.copyfile(source, self.logs_dir / f"kubelet-{node}.log")

    # --- our daemons ----------------------------------------------------------------------------

    def daemons(self) -> list[ManagedProcess]:
        with self._nodes_lock:
            return [*self.plugins.values(), *self.controllers]

    # --- nodes joining and leaving a running stack -------------------------------------------------

    def add_node(
        self,
        node: str,
        *,
        gpus: str,
        labels: Mapping[str, str] | None = None,
        provider_id: str = "",
        timeout: float = READY_TIMEOUT_S,
    ) -> None:
        """A node joins, as a cloud instance does: its kubelet (``labels``, ``provider_id``), then
        our kubelet plugin with ``gpus`` emulated. Returns once the Node is Ready without the
        ``node.kubernetes.io/not-ready`` taint (kube-controller-manager lifts it), the plugin has
        published its pool and, with the classic shim on, the kubelet lists the shim's resources.
        Several nodes may join at once (each gets its own kubelet ports)."""
        self._join(node, gpus=gpus)
        with self._nodes_lock:
            index = self._free_index()
            self._indexes_starting.add(index)
        try:
            self.start_node(node, labels=labels, provider_id=provider_id, index=index)
        finally:
            with self._nodes_lock:
                self._indexes_starting.discard(index)
        credentials = self._service_account_kubeconfig("instaslice-kubelet-plugin", node=node)
        plugin = self._plugin_process(node, credentials)
        with self._nodes_lock:
            self._credentials[f"plugin/{node}"] = credentials
            self.plugins[node] = plugin
        plugin.start()
        self.wait_for(
            lambda: node in self.published_nodes() and not self._not_ready_taint(node),
            timeout=timeout,
            message=f"node {node}: no published pool, or still tainted not-ready",
        )
        if self.classic_shim_on:
            self.wait_for(
                lambda: any(self.classic_resources(node).values()),
                timeout=timeout,
                message=f"node {node}: no nvidia.com/mig-* in its allocatable",
            )

    def remove_node(self, node: str) -> None:
        """A node leaves, as a cloud instance deleted by cluster-autoscaler: our plugin and its
        kubelet stop, the Node (and its Lease) is deleted — its ResourceSlices go with it, they
        are owned by it. What was left on its GPUs, CDI directory and checkpoint stays readable
        (``mig_instances``, ``node_paths``)."""
        with self._nodes_lock:
            if node in self._nodes:
                self._nodes.remove(node)
            plugin = self.plugins.pop(node, None)
        if plugin is not None:
            plugin.stop()
        self._save_kubelet_log(node)
        self.stop_node(node, delete=True, purge=True)

    @property
    def classic_shim_on(self) -> bool:
        """Whether the plugins serve the classic shim (``set_classic_shim``; on by default)."""
        return "off" not in self._plugin_mode_args

    def _free_index(self) -> int:
        """The lowest kubelet port index that no node directory and no starting node uses."""
        used = set(self._indexes_starting)
        for path in self.paths.nodes.glob("*/index"):
            with contextlib.suppress(OSError, ValueError):
                used.add(int(path.read_text().strip()))
        index = 0
        while index in used:
            index += 1
        return index

    def _not_ready_taint(self, node: str) -> bool:
        try:
            obj = self.api.get(NODES, name=node)
        except ApiNotFoundError:
            return True
        taints = (obj.get("spec") or {}).get("taints") or []
        return any(t.get("key") == NOT_READY_TAINT for t in taints)

    def _plugin_process(self, node: str, kubeconfig: Path) -> ManagedProcess:
        paths = self.node_paths(node)
        paths.emulated_state_file.parent.mkdir(parents=True, exist_ok=True)
        args = plugin_args(
            node,
            connection=["--kubeconfig", str(kubeconfig)],
            gpus=self._node_gpus[node],
            paths=paths,
            kubelet=self.kubelet(node),
            inventory_poll_s=self.config.inventory_poll_s,
            log_level=self.config.log_level,
        )
        args += [*self.config.plugin_args, *self._plugin_mode_args]
        return ManagedProcess(
            name=f"kubelet-plugin/{node}",
            module="kubeletplugin",
            args=args,
            log_file=self.logs_dir / f"kubelet-plugin-{node}.log",
        )

    def _controller_process(self, index: int, kubeconfig: Path) -> ManagedProcess:
        # every replica serves the webhook; kube-apiserver calls the first one's port
        port = self.webhook_port if index == 0 else free_port()
        args = controller_args(
            connection=["--kubeconfig", str(kubeconfig)],
            webhook_port=port,
            cert_dir=self._cert_dir,
            log_level=self.config.log_level,
            leader_elect=self.config.leader_elect,
            lease_duration_s=self.config.lease_duration_s,
            extra=[*self.config.controller_args, *self._controller_mode_args],
            metrics_port=self.replica_metrics_ports[index],
        )
        suffix = "" if index == 0 else f"-{index}"
        return ManagedProcess(
            name=f"controller{suffix}",
            module="controller",
            args=args,
            log_file=self.logs_dir / f"controller{suffix}.log",
        )

    def restart_plugin(self, node: str, *, kill: bool = True) -> None:
        process = self.plugins[node]
        if kill:
            process.kill()
        else:
            process.stop()
        process.start()

    def replace_plugin(self, node: str) -> None:
        """The node's plugin as a new DaemonSet pod: stopped, a new token bound to the Node as it
        is now, started. A Node deleted and registered again is a new object: the old token,
        bound to the old one, is refused (401) for good."""
        self.plugins[node].stop()
        self._credentials[f"plugin/{node}"] = self._service_account_kubeconfig(
            "instaslice-kubelet-plugin", node=node
        )
        self.plugins[node].start()

    # --- allocation modes: the steps of docs/deploy.md "Switching modes" -------------------------

    def set_extended_resource_names(self, *, on: bool) -> None:
        """Our DeviceClasses with ``extendedResourceName`` (the component of scheduler mode) or as
        ``deploy/base`` has them (``kubectl apply``: the field is removed again)."""
        classes = load_file(DEPLOY_BASE / "deviceclasses.yaml")
        if on:
            component = DEPLOY_BASE.parent / "components" / "extended-resource-names"
            patches = {
                str(p["metadata"]["name"]): p["spec"]
                for p in load_file(component / "deviceclass-patches.yaml")
            }
            for device_class in classes:
                device_class["spec"].update(patches.get(str(device_class["metadata"]["name"]), {}))
        self.kubectl_apply(classes)

    def set_classic_shim(self, *, on: bool) -> None:
        """Every kubelet plugin restarted (stopped gracefully) with ``--classic-shim on|off``."""
        self._plugin_mode_args = ["--classic-shim", "on" if on else "off"]
        for node in self.node_names:
            self.plugins[node].stop()
            self.plugins[node] = self._plugin_process(node, self._credentials[f"plugin/{node}"])
            self.plugins[node].start()

    def set_allocation_mode(self, mode: str, *, handoff_after: float | None = None) -> None:
        """Every controller replica restarted with ``--allocation-mode <mode>`` (and
        ``--handoff-after`` when given; the default otherwise)."""
        args = ["--allocation-mode", mode]
        if handoff_after is not None:
            args += ["--handoff-after", str(handoff_after)]
        self.restart_controllers(args)

    def restart_controllers(self, args: Sequence[str] = ()) -> None:
        """Every controller replica restarted with ``args`` after the configured ones (empty:
        the configured ones alone)."""
        self._controller_mode_args = list(args)
        for process in self.controllers:
            process.stop()
        self.controllers = [
            self._controller_process(index, self._credentials["controller"])
            for index in range(self.config.controllers)
        ]
        for process in self.controllers:
            process.start()

    def set_webhook(self, *, on: bool) -> None:
        """The MutatingWebhookConfiguration registered, or deleted (scheduler mode has none)."""
        if on:
            self._register_webhook()
            return
        name = str(self.webhook_configuration()["metadata"]["name"])
        with contextlib.suppress(ConfigError):
            self._kubectl(["delete", "mutatingwebhookconfiguration", name, "--ignore-not-found"])

    # --- credentials and the webhook ------------------------------------------------------------

    def _service_account_kubeconfig(self, account: str, *, node: str | None = None) -> Path:
        """A kubeconfig that authenticates as ``instaslice-system/<account>`` (TokenRequest),
        with ``node`` a token bound to that Node (its node name travels with the identity)."""
        args = ["create", "token", account, "-n", names.SYSTEM_NAMESPACE]
        args.append(f"--duration={_TOKEN_SECONDS}s")
        if node is not None:
            args += ["--bound-object-kind", "Node", "--bound-object-name", node]
        token = self._kubectl(args).strip()
        admin = yaml.safe_load(self.paths.kubeconfig.read_text(encoding="utf-8"))
        cluster = admin["clusters"][0]["cluster"]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "real", "cluster": cluster}],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [{"name": "real", "context": {"cluster": "real", "user": account}}],
            "current-context": "real",
        }
        path = self.root / "credentials" / f"{account}{f'-{node}' if node else ''}.kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        path.chmod(0o600)
        return path

    def _make_certificates(self) -> None:
        self._ca_bundle = write_webhook_certificates(
            self._cert_dir, common_name="instaslice-real-ca"
        )

    def webhook_configuration(self, source: Path | None = None) -> JsonObject:
        """``deploy/base/webhook.yaml``'s configuration, pointed at our webhook's URL."""
        return webhook_configuration(
            url=f"https://127.0.0.1:{self.webhook_port}{WEBHOOK_PATH}",
            ca_bundle=self._ca_bundle,
            source=source or DEPLOY_BASE / "webhook.yaml",
        )

    def _register_webhook(self) -> None:
        apply_object(self.api, self.webhook_configuration())

    # --- applying objects -----------------------------------------------------------------------

    def apply(self, objects: Iterable[JsonObject]) -> list[Outcome]:
        """Kinds our client knows go through it (the API server's own errors come back as
        ``ClusterError``); any other kind (ResourceQuota, RBAC...) through ``kubectl apply``."""
        outcomes = []
        others = []
        for obj in objects:
            if resource_for(obj) is None:
                others.append(obj)
            else:
                outcomes.append(apply_object(self.api, obj))
        if others:
            self.kubectl_apply(others)
        return outcomes

    def kubectl_apply(self, objects: Sequence[JsonObject]) -> None:
        text = yaml.safe_dump_all(list(objects))
        self._kubectl(["apply", "-f", "-"], stdin=text)

    def kubectl(self, args: Sequence[str]) -> str:
        """The matching kubectl as cluster admin; ``ConfigError`` with its message on failure."""
        return self._kubectl(args)

    def events(self, namespace: str) -> list[JsonObject]:
        return self.api.list_objects(EVENTS, namespace=namespace).items

    def _kubectl(self, args: Sequence[str], *, stdin: str | None = None) -> str:
        done = subprocess.run(
            [str(self.paths.kubectl), "--kubeconfig", str(self.paths.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise ConfigError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def _run_script(
        self,
        argv: Sequence[str],
        *,
        what: str,
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        path_env = f"{self.paths.control_plane / 'bin'}:{os.environ.get('PATH', '')}"
        full_env = {
            **os.environ,
            "KUBECONFIG": str(self.paths.kubeconfig),
            "PATH": path_env,
            **(env or {}),
        }
        with (self.logs_dir / "scripts.log").open("a", encoding="utf-8") as out:
            out.write(f"--- {what}: {' '.join(argv)}\n")
            out.flush()
            try:
                done = subprocess.run(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=full_env,
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired as exc:
                raise ConfigError(f"{what} did not finish within {timeout:.0f}s") from exc
        if done.returncode != 0:
            tail = (self.logs_dir / "scripts.log").read_text(errors="replace").splitlines()[-20:]
            raise ConfigError(f"{what} failed ({done.returncode}):\n" + "\n".join(tail))

    # --- readiness ------------------------------------------------------------------------------

    def plugin_registered(self, node: str) -> bool:
        """The kubelet accepted our DRA plugin: it logs the registration of our driver."""
        try:
            text = self.kubelet(node).log_file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
        return f'pluginName="{names.DRIVER_NAME}"' in text or (
            names.DRIVER_NAME in text and "Register" in text
        )

    def classic_resources(self, node: str) -> dict[str, int]:
        """``nvidia.com/mig-*`` in the Node's status.allocatable (the kubelet's device manager)."""
        try:
            obj = self.api.get(NODES, name=node)
        except ApiNotFoundError:
            return {}
        allocatable = (obj.get("status") or {}).get("allocatable") or {}
        return {
            name: int(value)
            for name, value in allocatable.items()
            if name.startswith(names.CLASSIC_RESOURCE_PREFIX)
        }

    def wait_ready(self, *, timeout: float = READY_TIMEOUT_S, classic: bool = True) -> None:
        nodes = set(self.node_names)
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
                lambda: all(any(self.classic_resources(n).values()) for n in nodes),
                timeout=timeout,
                message="no nvidia.com/mig-* resource in the Nodes' allocatable",
            )

    # --- what is on the GPUs --------------------------------------------------------------------

    def mig_instances(self, node: str) -> tuple[MigInstance, ...]:
        state = self.node_paths(node).emulated_state_file
        if not state.exists():
            return ()
        backend = EmulatedGpuBackend(node_name=node, spec=self._node_gpus[node], state_file=state)
        try:
            return backend.instances()
        finally:
            backend.close()

    def kubelet_errors(self) -> dict[str, list[str]]:
        """Each node's kubelet error lines."""
        return {node: self.kubelet(node).error_lines() for node in self.node_names}

    def exit_annotations(self, container: str, seconds: float) -> dict[str, str]:
        """Pod annotations that make ``container`` exit 0 after ``seconds`` (fake runtime)."""
        return {f"{EXIT_ANNOTATION_PREFIX}{container}": f"{seconds:g}"}


def describe_missing(paths: StackPaths | None = None) -> str | None:
    """One line saying why the real stack cannot run here, or None when it can."""
    return not_built(
        "real stack",
        _missing(paths or StackPaths.from_environment()),
        see="../shared/realstack/README.md and docs/design.md, the real-stack tier",
    )
