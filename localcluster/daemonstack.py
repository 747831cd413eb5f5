"""What the local stack (``stack.InstaSliceStack``) and the real-stack tier (``realstack.RealStack``)
share: our daemons' command lines, the webhook's certificate and registration, and the checks on a
running system (daemons alive, slices published, leader elected, webhook serving, the slice map).

The two stacks differ in the cluster they run on (this process's emulation, or a real control plane
and kubelets) and in how the daemons reach it (``--kube-api-url``, or a ServiceAccount's kubeconfig);
everything else about running the daemons is here, once.
"""

from __future__ import annotations

import base64
import copy
import socket
import ssl
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import ClassVar, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

from api import names
from controller.webhook.certificates import generate_ca, issue_serving_certificate
from driver.checkpoint import CHECKPOINT_FILE_NAME
from driver.cluster.port import LEASES, RESOURCE_SLICES, ClusterApi, JsonObject
from driver.daemon.http import scrape_loopback
from driver.errors import ApiNotFoundError, ConfigError
from driver.resourceslices import complete_pools
from instaslice.status import ClusterView, mig_uuids_from_checkpoints, read_view
from localcluster.manifests import MUTATING_WEBHOOK_CONFIGURATIONS, load_file
from localcluster.processes import ManagedProcess
from localcluster.tlsclient import wrap_client

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parent.parent
DEPLOY_BASE = REPO_ROOT / "deploy" / "base"
WEBHOOK_PATH = "/mutate-v1-pod"


@dataclass(frozen=True, slots=True)
class NodePaths:
    """Where one node's plugin keeps its state, besides the kubelet's own directories."""

    state_dir: Path
    cdi_root: Path
    emulated_state_file: Path

    @property
    def checkpoint(self) -> Path:
        return self.state_dir / CHECKPOINT_FILE_NAME


class KubeletDirectories(Protocol):
    """The directories and sockets of one kubelet that our plugin is pointed at."""

    @property
    def registry_dir(self) -> Path: ...
    @property
    def plugins_dir(self) -> Path: ...
    @property
    def device_plugins_dir(self) -> Path: ...
    @property
    def pod_resources_socket(self) -> Path: ...


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def plugin_args(
    node: str,
    *,
    connection: Sequence[str],
    gpus: str,
    paths: NodePaths,
    kubelet: KubeletDirectories,
    inventory_poll_s: float,
    log_level: str,
) -> list[str]:
    """``instaslice-kubelet-plugin``'s flags for ``node`` with emulated GPUs; ``connection`` is how
    it reaches the API server (``--kube-api-url URL`` or ``--kubeconfig FILE``)."""
    return [
        "--node-name", node,
        "--gpu-backend", "emulated",
        "--emulated-gpus", gpus,
        "--emulated-state-file", str(paths.emulated_state_file),
        *connection,
        "--plugin-registry-dir", str(kubelet.registry_dir),
        "--plugin-dir", str(kubelet.plugins_dir / names.DRIVER_NAME),
        "--device-plugin-dir", str(kubelet.device_plugins_dir),
        "--pod-resources-socket", str(kubelet.pod_resources_socket),
        "--cdi-root", str(paths.cdi_root),
        "--state-dir", str(paths.state_dir),
        "--metrics-address", "",
        "--healthz-address", "",
        "--inventory-poll-seconds", str(inventory_poll_s),
        "--log-level", log_level,
    ]  # fmt: skip


def controller_args(
    *,
    connection: Sequence[str],
    webhook_port: int,
    cert_dir: Path,
    log_level: str,
    leader_elect: bool,
    lease_duration_s: int,
    extra: Sequence[str] = (),
    metrics_port: int = 0,
) -> list[str]:
    """``instaslice-controller``'s flags: the webhook on ``webhook_port`` with the certificate files
    in ``cert_dir``, ``/metrics`` on 127.0.0.1:``metrics_port`` (0: none), ``extra`` flags, and
    leader election with short timings (or none)."""
    args = [
        *connection,
        "--webhook-port", str(webhook_port),
        "--webhook-cert-dir", str(cert_dir),
        "--cert-mode", "files",
        "--metrics-address", f"127.0.0.1:{metrics_port}" if metrics_port else "",
        "--healthz-address", "",
        "--log-level", log_level,
        *extra,
    ]  # fmt: skip
    if leader_elect:
        args += [
            "--leader-elect",
            "--lease-duration", str(lease_duration_s),
            "--renew-deadline", str(max(lease_duration_s - 1, 1) * 0.75),
            "--retry-period", "0.5",
        ]  # fmt: skip
    else:
        args.append("--no-leader-elect")
    return args


def write_webhook_certificates(
    cert_dir: Path, *, common_name: str = "instaslice-local-ca"
) -> bytes:
    """A CA and a serving certificate for 127.0.0.1 (``tls.crt``, ``tls.key``, ``ca.crt`` in
    ``cert_dir``, as ``--cert-mode files`` reads them); returns the CA's PEM for the caBundle."""
    now = datetime.now(UTC)
    ca_cert, ca_key = generate_ca(common_name=common_name, now=now, validity=timedelta(days=1))
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


def local_metrics(port: int) -> str:
    """``/metrics`` of a daemon on 127.0.0.1:``port``; empty if it does not answer."""
    return scrape_loopback(port, timeout=5.0).decode()


def webhook_configuration(
    *, url: str, ca_bundle: bytes, source: Path = DEPLOY_BASE / "webhook.yaml"
) -> JsonObject:
    """The MutatingWebhookConfiguration of ``source`` (``deploy/base/webhook.yaml``: the same
    rules), calling ``url`` — a webhook on this machine, as kube-apiserver reaches it — instead of
    the Service: its scheme and host, with each entry's own Service path (``url``'s path for an
    entry that names none)."""
    configs = [
        o for o in load_file(source) if o.get("kind") == MUTATING_WEBHOOK_CONFIGURATIONS.kind
    ]
    if len(configs) != 1:
        raise ConfigError(f"{source} must hold one webhook configuration")
    config = copy.deepcopy(configs[0])
    base = urlsplit(url)
    for hook in config.get("webhooks") or []:
        service = (hook.get("clientConfig") or {}).get("service") or {}
        hook_url = urlunsplit((base.scheme, base.netloc, service.get("path") or base.path, "", ""))
        hook["clientConfig"] = {"url": hook_url, "caBundle": base64.b64encode(ca_bundle).decode()}
    return config


class DaemonStack(ABC):
    """The checks both stacks make on their running daemons. A subclass says which API server
    (``api``), which nodes and where their state lives, and which daemon processes it runs."""

    poll_interval_s: ClassVar[float]
    """How often ``wait_for`` asks by default."""

    webhook_port: int
    controller_metrics_port: int
    """Where the controller whose webhook kube-apiserver calls serves ``/metrics`` (127.0.0.1)."""
    _ca_bundle: bytes

    def controller_metrics(self) -> str:
        """That controller's ``/metrics`` (with its webhook process's figures); empty if down."""
        return local_metrics(self.controller_metrics_port)

    @property
    @abstractmethod
    def api(self) -> ClusterApi: ...

    @property
    @abstractmethod
    def node_names(self) -> list[str]: ...

    @abstractmethod
    def node_paths(self, node: str) -> NodePaths: ...

    @abstractmethod
    def daemons(self) -> list[ManagedProcess]:
        """Every kubelet plugin and controller process of the stack."""

    def wait_for(
        self,
        predicate: Callable[[], T | None],
        *,
        timeout: float = 30.0,
        interval: float | None = None,
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
            time.sleep(self.poll_interval_s if interval is None else interval)

    def check_daemons(self) -> None:
        for process in self.daemons():
            # asked again: a node that left meanwhile (RealStack.remove_node) stopped its plugin
            if process.starts and not process.running() and process in self.daemons():
                raise RuntimeError(
                    f"{process.name} exited with status {process.returncode()}; last lines of "
                    f"{process.log_file}:\n{process.log_tail()}"
                )

    def published_nodes(self) -> set[str]:
        slices = self.api.list_objects(
            RESOURCE_SLICES, field_selector=f"spec.driver={names.DRIVER_NAME}"
        ).items
        return set(complete_pools(slices))

    def leader(self) -> str | None:
        try:
            lease = self.api.get(
                LEASES, name=names.LEADER_LEASE_NAME, namespace=names.SYSTEM_NAMESPACE
            )
        except ApiNotFoundError:
            return None
        holder = (lease.get("spec") or {}).get("holderIdentity")
        return str(holder) if holder else None

    def webhook_serving(self) -> bool:
        """The controller's webhook completes a TLS handshake with our CA's certificate."""
        context = ssl.create_default_context(cadata=self._ca_bundle.decode())
        try:
            raw = socket.create_connection(("127.0.0.1", self.webhook_port), timeout=1.0)
            with wrap_client(context, raw, server_hostname="127.0.0.1"):
                return True
        except (OSError, ssl.SSLError):
            return False

    def view(self) -> ClusterView:
        """The slice map, with the MIG UUIDs the plugins' checkpoints record."""
        return read_view(self.api, mig_uuids=self.mig_uuids())

    def mig_uuids(self) -> dict[tuple[str, str], str]:
        return mig_uuids_from_checkpoints(self.node_paths(n).checkpoint for n in self.node_names)
