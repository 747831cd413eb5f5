"""The real stack with what the soak needs besides ``RealStack``: every daemon's ``/metrics``, their
process ids, and the faults as primitives — processes killed, control-plane members restarted,
etcd compacted, kubelets stopped, Nodes deleted, nodes "rebooted", DeviceClasses re-created.

The control plane's members are restarted with exactly the command line they run with (read from
``/proc``), the way ``start.sh`` started them: in their own session, output appended to their log,
their pid in ``run/<name>.pid`` (so ``stop.sh`` still stops them).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from api import names
from driver.cluster.port import DEVICE_CLASSES, NODES, JsonObject
from driver.errors import ApiNotFoundError, ClusterError, ConfigError
from localcluster.daemonstack import DEPLOY_BASE, free_port, local_metrics
from localcluster.manifests import load_file
from localcluster.processes import ManagedProcess
from localcluster.realstack import RealStack, RealStackConfig

log = logging.getLogger(__name__)

ETCD_URL = "http://127.0.0.1:2379"
WEBHOOK_MODULE = "controller.webhook.process"
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
KUBELET_STARTS = 3
"""How often a kubelet that failed its start is started again, as systemd restarts it on a node."""


@dataclass(frozen=True, slots=True)
class Daemon:
    """One running daemon process the soak watches: its role (stable across restarts) and pid."""

    role: str
    pid: int
    metrics_port: int | None


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after its closing paren
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode() for part in raw.split(b"\0") if part]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return Path(f"/proc/{pid}").is_dir() and _state(pid) != "Z"


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2 :].split()[0]


class SoakStack(RealStack):
    """``RealStack`` with ``/metrics`` on every plugin too, and the fault primitives."""

    def __init__(self, config: RealStackConfig, *, root: Path | None = None) -> None:
        super().__init__(config, root=root)
        self.plugin_metrics_ports = {node: free_port() for node in self.node_names}

    # --- daemons and their metrics --------------------------------------------------------------

    def _plugin_process(self, node: str, kubeconfig: Path) -> ManagedProcess:
        process = super()._plugin_process(node, kubeconfig)
        # a later flag wins: the plugin's /metrics on a loopback port of its own
        process.argv += ["--metrics-address", f"127.0.0.1:{self.plugin_metrics_ports[node]}"]
        return process

    def running_daemons(self) -> list[Daemon]:
        """Every daemon process now: controllers, their webhook processes, kubelet plugins."""
        found = []
        for index, process in enumerate(self.controllers):
            if process.pid is None or not process.running():
                continue
            port = self.replica_metrics_ports[index]  # set with the replicas in start()
            found.append(Daemon(role=f"controller-{index}", pid=process.pid, metrics_port=port))
            child = self.webhook_child(index)
            if child is not None:
                found.append(Daemon(role=f"webhook-{index}", pid=child, metrics_port=None))
        for node, process in sorted(self.plugins.items()):
            if process.pid is not None and process.running():
                port = self.plugin_metrics_ports[node]
                found.append(Daemon(role=f"plugin/{node}", pid=process.pid, metrics_port=port))
        return found

    def webhook_child(self, index: int) -> int | None:
        """The pid of controller replica ``index``'s webhook process, None while it has none."""
        parent = self.controllers[index].pid
        if parent is None:
            return None
        for pid in _children(parent):
            if WEBHOOK_MODULE in _cmdline(pid) and _alive(pid):
                return pid
        return None

    def metrics_text(self, daemon: Daemon) -> str:
        return local_metrics(daemon.metrics_port) if daemon.metrics_port else ""

    def leader_index(self) -> int | None:
        """Which controller replica holds the leader lease (its identity ends in ``_<pid>``)."""
        holder = self.leader()
        for index, process in enumerate(self.controllers):
            if holder and process.pid is not None and holder.endswith(f"_{process.pid}"):
                return index
        return None

    # --- the control plane ----------------------------------------------------------------------

    def _pid_file(self, member: str) -> Path:
        return self.paths.control_plane / "run" / f"{member}.pid"

    def control_plane_pid(self, member: str) -> int | None:
        try:
            pid = int(self._pid_file(member).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def restart_control_plane_member(self, member: str, *, down_s: float, hard: bool) -> None:
        """Stop ``member`` (SIGKILL when ``hard``, else SIGTERM), leave it down ``down_s``
        seconds, start it again with the same command line, wait until it serves."""
        if member not in CONTROL_PLANE:
            raise ValueError(f"not a control-plane member: {member}")
        pid = self.control_plane_pid(member)
        if pid is None:
            raise ConfigError(f"{member} is not running")
        argv = _cmdline(pid)
        os.kill(pid, signal.SIGKILL if hard else signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
        time.sleep(down_s)
        log_path = self.paths.control_plane / "logs" / f"{member}.log"
        with log_path.open("ab") as out:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._pid_file(member).write_text(f"{process.pid}\n")
        self._wait_serving(member)

    def _wait_serving(self, member: str, *, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._serving(member):
                return
            time.sleep(0.5)
        raise ConfigError(f"{member} does not serve {timeout:.0f}s after its restart")

    def _serving(self, member: str) -> bool:
        if member == "etcd":
            try:
                with urllib.request.urlopen(f"{ETCD_URL}/health", timeout=2) as reply:  # noqa: S310
                    return bool(json.loads(reply.read()).get("health") == "true")
            except (OSError, ValueError):
                return False
        if member == "kube-apiserver":
            try:
                return self.kubectl(["get", "--raw", "/readyz"]).strip() == "ok"
            except ConfigError:
                return False
        return self.control_plane_pid(member) is not None

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (physically): every resource
        version before it is gone. Returns that revision."""
        key = base64.b64encode(b"/registry/").decode()
        revision = int(_etcd_post("/v3/kv/range", {"key": key, "limit": 1})["header"]["revision"])
        _etcd_post("/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision

    # --- nodes ----------------------------------------------------------------------------------

    def node_ready(self, node: str) -> bool | None:
        """The Node's Ready condition: True, False (NotReady or Unknown), None (no Node)."""
        try:
            obj = self.api.get(NODES, name=node)
        except ApiNotFoundError:
            return None
        for condition in (obj.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Ready":
                return bool(condition.get("status") == "True")
        return False

    def node_uid(self, node: str) -> str | None:
        try:
            return str(self.api.get(NODES, name=node)["metadata"]["uid"])
        except ApiNotFoundError:
            return None

    def stop_kubelet(self, node: str) -> None:
        """The node's kubelet and container runtime stopped (``stop-node.sh``); the plugin runs on."""
        self.stop_node(node)

    def start_node(
        self,
        node: str,
        *,
        labels: Mapping[str, str] | None = None,
        provider_id: str = "",
        index: int | None = None,
    ) -> None:
        """``RealStack.start_node``, started again after a failed start (a kubelet that never got
        healthy), up to ``KUBELET_STARTS`` times: on a node systemd restarts it, so a start that
        fails once is no fault of the soak's daemons."""
        for attempt in range(1, KUBELET_STARTS + 1):
            try:
                super().start_node(node, labels=labels, provider_id=provider_id, index=index)
                return
            except ConfigError as exc:
                if attempt == KUBELET_STARTS:
                    raise
                reason = str(exc).strip().splitlines()[-1]
                log.warning(
                    "kubelet %s start %d failed (%s); starting it again", node, attempt, reason
                )
                self.stop_node(node)

    def delete_node_object(self, node: str) -> None:
        with contextlib.suppress(ApiNotFoundError):
            self.api.delete(NODES, name=node)

    def wipe_node(self, node: str) -> list[str]:
        """What a reboot loses on a stopped node: MIG instances (the emulated GPUs' state file) and
        the CDI specs (``/var/run/cdi`` is a tmpfs). The checkpoint, on disk, stays. Returns what
        was removed."""
        paths = self.node_paths(node)
        removed = [
            f"{i.profile}@{i.placement.start} gpu{i.gpu_index}" for i in self.mig_instances(node)
        ]
        paths.emulated_state_file.unlink(missing_ok=True)
        if paths.cdi_root.is_dir():
            for spec in paths.cdi_root.iterdir():
                if spec.is_file():
                    spec.unlink()
                    removed.append(f"CDI spec {spec.name}")
        return removed

    # --- DeviceClasses --------------------------------------------------------------------------

    def device_class(self, name: str) -> JsonObject:
        for obj in load_file(DEPLOY_BASE / "deviceclasses.yaml"):
            if obj["metadata"]["name"] == name:
                return dict(obj)
        raise ConfigError(f"no DeviceClass {name} in deploy/base")

    def delete_device_class(self, name: str) -> None:
        with contextlib.suppress(ApiNotFoundError):
            self.api.delete(DEVICE_CLASSES, name=name)

    def create_device_class(self, name: str) -> None:
        with contextlib.suppress(ClusterError):
            self.api.create(DEVICE_CLASSES, self.device_class(name))

    def our_device_class(self, profile: str) -> str:
        return names.profile_device_class(profile)


def _etcd_post(path: str, body: JsonObject) -> JsonObject:
    request = urllib.request.Request(  # noqa: S310 - a fixed loopback URL
        f"{ETCD_URL}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as reply:  # noqa: S310
        answer = json.loads(reply.read())
    if not isinstance(answer, dict):
        raise ConfigError(f"etcd answered {answer!r} to {path}")
    return answer
