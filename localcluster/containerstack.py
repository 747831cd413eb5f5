"""Real Kubernetes nodes with real containers, for the deploy tier: InstaSlice as users install it.

``../shared/realstack/`` builds the control plane and nodes that run containers (containerd with
CDI, runc, the bridge CNI, kube-proxy). :class:`ContainerCluster` runs them the way the tier needs:

* the control plane (re)started clean, with the API server on the node IP so that pods reach it
  (in-cluster clients: our daemons, kube-apiserver's webhook calls through a Service ClusterIP);
* two containerd nodes, each in its own mount namespace where the kubelet's directories,
  containerd's and ``/var/run/cdi`` are that node's; ``/var/lib/instaslice`` (the plugin's state
  directory, a host path of the DaemonSet) is made that node's too, as it is on separate hosts;
* images built here (no registry): imported into every node with ``ctr``, never pulled.

Everything else goes the way a user's commands go: ``make deploy`` / ``make undeploy`` with this
checkout's Makefile, ``kubectl`` for the rest. ``stop`` leaves the machine as the tier found it:
nodes stopped and deleted, kube-proxy stopped, the control plane stopped, ``ip_forward`` restored.

Where the stack lives (the build scripts' defaults): ``INSTASLICE_REAL_K8S`` (``${TMPDIR:-/tmp}/k8s``),
``INSTASLICE_REAL_NODES`` (``${TMPDIR:-/tmp}/k8s-node``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from driver.cluster.kube import KubeClusterApi, load_configuration
from driver.cluster.port import JsonObject
from driver.errors import ConfigError
from driver.gpu.backend import MigInstance
from driver.gpu.emulated import EmulatedGpuBackend
from localcluster.realstack import StackPaths, not_built

REPO_ROOT = Path(__file__).resolve().parent.parent
STATE_DIR = Path("/var/lib/instaslice")
"""The kubelet plugin's state directory on a node (deploy/base/kubelet-plugin.yaml)."""
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
T = TypeVar("T")


CONTAINERD_NODE = (
    "run-containerd-node.sh",
    "stop-containerd-node.sh",
    "kube-proxy.sh",
    "bin/containerd",
    "bin/ctr",
    "bin/kubelet",
    "images/pause.tar",
    "images/busybox.tar",
)
"""What a node of this tier needs under ``StackPaths.nodes``: containerd, its kubelet, the images."""
HOST_TOOLS = ("buildah", "runc", "nsenter")


def _missing(paths: StackPaths) -> list[str]:
    return paths.missing(CONTAINERD_NODE, tools=HOST_TOOLS)


def describe_missing(paths: StackPaths | None = None) -> str | None:
    """One line saying why the deploy tier cannot run here, or None when it can."""
    return not_built(
        "containerd nodes",
        _missing(paths or StackPaths.from_environment()),
        see="../shared/realstack/README.md 'Real containers' and docs/deploy.md 'Where it ran'",
    )


def node_ip() -> str:
    """The address of the default route's interface (where the API server listens for pods)."""
    done = subprocess.run(
        ["ip", "-4", "route", "get", "1.1.1.1"], capture_output=True, text=True, check=False
    )
    match = re.search(r" src ([0-9.]+)", done.stdout)
    if match is None:
        raise ConfigError(f"no default route to take the node IP from: {done.stdout.strip()}")
    return match.group(1)


class ContainerCluster:
    """The control plane and two containerd nodes; a context manager."""

    def __init__(
        self,
        *,
        nodes: Sequence[str] = ("deploy-a", "deploy-b"),
        paths: StackPaths | None = None,
        logs_dir: Path,
    ) -> None:
        self.paths = paths or StackPaths.from_environment()
        self.node_names = list(nodes)
        self.logs_dir = logs_dir
        self._api: KubeClusterApi | None = None
        self._ip_forward = ""
        self._made_state_dir = False

    # --- life cycle -----------------------------------------------------------------------------

    def start(self) -> ContainerCluster:
        missing = _missing(self.paths)
        if missing:
            raise ConfigError(f"the containerd nodes are not built: missing {', '.join(missing)}")
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self._ip_forward = IP_FORWARD.read_text().strip() if IP_FORWARD.exists() else ""
        try:
            for node in self.node_names:  # a run that was killed may have left them
                self._stop_node(node)
            self._script("kube-proxy.sh", "stop", what="kube-proxy stop", check=False)
            ip = node_ip()
            flags = (
                f"--bind-address=0.0.0.0 --advertise-address={ip} --endpoint-reconciler-type=lease "
                "--kubelet-preferred-address-types=InternalIP,Hostname"
            )
            self._run(
                [str(self.paths.control_plane / "start.sh"), "--clean"],
                what="control plane start",
                env={"APISERVER_EXTRA_FLAGS": flags},
                timeout=300,
            )
            self._api = KubeClusterApi(
                configuration=load_configuration(kubeconfig=str(self.paths.kubeconfig))
            )
            if not STATE_DIR.exists():
                STATE_DIR.mkdir(parents=True)
                self._made_state_dir = True
            for node in self.node_names:
                self._script("run-containerd-node.sh", node, what=f"node {node} start", timeout=240)
                self._own_state_dir(node)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Nodes stopped and deleted, kube-proxy and the control plane stopped; idempotent."""
        for node in self.node_names:
            self._save_node_logs(node)
            self._stop_node(node)
        self._script("kube-proxy.sh", "stop", what="kube-proxy stop", check=False)
        if self._api is not None:
            self._api.close()
            self._api = None
        with contextlib.suppress(ConfigError):
            self._run([str(self.paths.control_plane / "stop.sh")], what="control plane stop")
        if self._made_state_dir:
            with contextlib.suppress(OSError):
                STATE_DIR.rmdir()
            self._made_state_dir = False
        if self._ip_forward == "0" and not self._containerd_nodes_running():
            with contextlib.suppress(OSError):
                IP_FORWARD.write_text("0\n")

    def __enter__(self) -> ContainerCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def api(self) -> KubeClusterApi:
        if self._api is None:
            raise RuntimeError("the cluster is not started")
        return self._api

    # --- nodes ----------------------------------------------------------------------------------

    def node_dir(self, node: str) -> Path:
        return self.paths.nodes / node

    def state_dir(self, node: str) -> Path:
        """The node's ``/var/lib/instaslice``, seen from the host."""
        return self.node_dir(node) / "instaslice-state"

    def cdi_dir(self, node: str) -> Path:
        """The node's ``/var/run/cdi``, seen from the host."""
        return self.node_dir(node) / "cdi" / "run"

    def claim_specs(self, node: str) -> dict[str, JsonObject]:
        """Claim UID -> the claim's CDI spec on ``node`` (files ``instaslice.dev-mig_<uid>.json``)."""
        specs = {}
        for path in sorted(self.cdi_dir(node).glob("instaslice.dev-mig_*.json")):
            with contextlib.suppress(OSError, ValueError):
                specs[path.stem.removeprefix("instaslice.dev-mig_")] = json.loads(path.read_text())
        return specs

    def mig_instances(self, node: str, *, gpus: str) -> tuple[MigInstance, ...]:
        """The emulated GPUs' MIG instances on ``node`` (the plugin's state file)."""
        state = self.state_dir(node) / "emulated-gpus.json"
        if not state.exists():
            return ()
        backend = EmulatedGpuBackend(node_name=node, spec=gpus, state_file=state)
        try:
            return backend.instances()
        finally:
            backend.close()

    def _own_state_dir(self, node: str) -> None:
        """Bind the node's own state directory over ``/var/lib/instaslice`` in its mount
        namespace: two nodes on one host must not share the plugin's checkpoint."""
        own = self.state_dir(node)
        own.mkdir(parents=True, exist_ok=True)
        pid = (self.node_dir(node) / "ns.pid").read_text().strip()
        self._run(
            ["nsenter", "-t", pid, "-m", "--", "mount", "--bind", str(own), str(STATE_DIR)],
            what=f"state directory of {node}",
        )

    def _stop_node(self, node: str) -> None:
        if self.node_dir(node).is_dir():
            self._script(
                "stop-containerd-node.sh",
                node,
                "--delete",
                "--purge",
                what=f"node {node} stop",
                check=False,
                timeout=120,
            )

    def _containerd_nodes_running(self) -> bool:
        for pid_file in self.paths.nodes.glob("*/containerd.pid"):
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid_file.read_text().strip()), 0)
                return True
        return False

    def _save_node_logs(self, node: str) -> None:
        for name in ("kubelet.log", "containerd.log"):
            source = self.node_dir(node) / name
            if source.is_file():
                with contextlib.suppress(OSError):
                    shutil.copyfile(source, self.logs_dir / f"{node}-{name}")

    # --- images ---------------------------------------------------------------------------------

    def load_image(self, archive: Path) -> None:
        """Import a docker/OCI archive into every node (what a pull would have fetched)."""
        for node in self.node_names:
            socket = self.node_dir(node) / "containerd" / "state" / "containerd.sock"
            snapshotter = _snapshotter(self.node_dir(node) / "containerd.toml")
            self._run(
                [
                    str(self.paths.nodes / "bin" / "ctr"),
                    "--address",
                    str(socket),
                    "-n",
                    "k8s.io",
                    "images",
                    "import",
                    "--local",
                    "--snapshotter",
                    snapshotter,
                    str(archive),
                ],
                what=f"import of {archive.name} into {node}",
                timeout=300,
            )

    def kill_container(self, node: str, container_id: str) -> None:
        """SIGKILL a container through its node's containerd (``containerd://<id>``)."""
        socket = self.node_dir(node) / "containerd" / "state" / "containerd.sock"
        self._run(
            [
                str(self.paths.nodes / "bin" / "ctr"),
                "--address",
                str(socket),
                "-n",
                "k8s.io",
                "tasks",
                "kill",
                "--signal",
                "SIGKILL",
                container_id.removeprefix("containerd://"),
            ],
            what=f"kill of container {container_id} on {node}",
        )

    # --- commands as a user runs them -----------------------------------------------------------

    def env(self) -> dict[str, str]:
        """The environment of a user's shell pointed at this cluster."""
        return {
            **os.environ,
            "KUBECONFIG": str(self.paths.kubeconfig),
            "PATH": f"{self.paths.kubectl.parent}:{os.environ.get('PATH', '')}",
        }

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.paths.kubectl), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(),
            check=False,
        )
        if check and done.returncode != 0:
            raise ConfigError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done

    def make(
        self, target: str, variables: Mapping[str, str], *, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        """``make TARGET VAR=value...`` in this checkout, as a user runs it; the output is kept
        in the logs directory."""
        argv = [
            "make",
            "--no-print-directory",
            target,
            f"KUBECTL={self.paths.kubectl}",
            *(f"{k}={v}" for k, v in variables.items()),
        ]
        done = subprocess.run(
            argv,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(),
            check=False,
        )
        with (self.logs_dir / "make.log").open("a", encoding="utf-8") as log:
            log.write(f"--- {' '.join(argv)} (exit {done.returncode})\n{done.stdout}{done.stderr}")
        return done

    def exec(self, namespace: str, pod: str, script: str, *, container: str | None = None) -> str:
        """``kubectl exec POD -- sh -c SCRIPT``: its output."""
        args = ["-n", namespace, "exec", pod]
        args += ["-c", container] if container else []
        return self.kubectl(*args, "--", "sh", "-c", script).stdout

    def wait_for(
        self,
        predicate: Callable[[], T | None],
        *,
        timeout: float,
        message: str,
        explain: Callable[[], str] | None = None,
        interval: float = 1.0,
    ) -> T:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                detail = f": {explain()}" if explain is not None else ""
                raise TimeoutError(f"{message} (after {timeout:.0f}s){detail}")
            time.sleep(interval)

    # --- helpers --------------------------------------------------------------------------------

    def _script(
        self, name: str, *args: str, what: str, check: bool = True, timeout: float = 120
    ) -> None:
        path = self.paths.nodes / name
        if not path.exists():
            return
        try:
            self._run(
                [str(path), *args],
                what=what,
                env={"CLUSTER_KUBECONFIG": str(self.paths.kubeconfig)},
                timeout=timeout,
            )
        except ConfigError:
            if check:
                raise

    def _run(
        self,
        argv: Sequence[str],
        *,
        what: str,
        env: Mapping[str, str] | None = None,
        timeout: float = 120,
    ) -> None:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        with (self.logs_dir / "scripts.log").open("a", encoding="utf-8") as out:
            out.write(f"--- {what}: {' '.join(argv)}\n")
            out.flush()
            try:
                done = subprocess.run(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**self.env(), **(env or {})},
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired as exc:
                raise ConfigError(f"{what} did not finish within {timeout:.0f}s") from exc
        if done.returncode != 0:
            tail = (self.logs_dir / "scripts.log").read_text(errors="replace").splitlines()[-20:]
            raise ConfigError(f"{what} failed ({done.returncode}):\n" + "\n".join(tail))


def _snapshotter(config: Path) -> str:
    """The snapshotter ``run-containerd-node.sh`` chose for the node (its containerd.toml)."""
    match = re.search(r"^\s*snapshotter = '([^']+)'", config.read_text(), re.MULTILINE)
    return match.group(1) if match else "overlayfs"
