"""What a user does to a cluster, for the deploy tier: ``make deploy``, ``make undeploy``,
``kubectl apply`` of the samples, and waiting for pods — with what went wrong when it does."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from api import names
from driver.cluster.kube import KubeClusterApi
from driver.cluster.port import PODS, JsonObject
from driver.cluster.views import PodView
from localcluster.containerstack import REPO_ROOT, ContainerCluster

SAMPLES = REPO_ROOT / "samples"
SAMPLES_NS = "instaslice-demo"
QUOTA_NS = "instaslice-quota-demo"
TIER_NS = "instaslice-deploy-tier"
"""Where the tier's own workloads (beyond the samples) run."""
WAIT_S = 180.0
"""Pods on real nodes of a 2-core machine: image unpack, CNI, a prepare, probes."""


@dataclass(frozen=True, slots=True)
class Images:
    controller: str
    plugin: str
    controller_v2: str
    plugin_v2: str


@dataclass
class Deploy:
    cluster: ContainerCluster
    images: Images

    @property
    def api(self) -> KubeClusterApi:
        return self.cluster.api

    # --- installing -----------------------------------------------------------------------------

    def install(
        self,
        overlay: str = "emulated",
        *,
        components: str = "",
        controller: str | None = None,
        plugin: str | None = None,
        expect_success: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """``make deploy OVERLAY=... IMG=... IMG_PLUGIN=... COMPONENTS=...``."""
        done = self.cluster.make(
            "deploy",
            {
                "OVERLAY": overlay,
                "IMG": controller or self.images.controller,
                "IMG_PLUGIN": plugin or self.images.plugin,
                "COMPONENTS": components,
            },
        )
        if expect_success:
            assert done.returncode == 0, f"make deploy failed:\n{done.stdout}\n{done.stderr}"
        return done

    def uninstall(self, *, drain: bool = False) -> subprocess.CompletedProcess[str]:
        """``make undeploy [DRAIN=true]``."""
        return self.cluster.make("undeploy", {"DRAIN": "true" if drain else "false"})

    def manifests(self, overlay: str = "emulated") -> str:
        done = self.cluster.make(
            "manifests",
            {"OVERLAY": overlay, "IMG": self.images.controller, "IMG_PLUGIN": self.images.plugin},
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    # --- workloads ------------------------------------------------------------------------------

    def apply(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """``kubectl apply ARGS``; pods refused while a new namespace's ServiceAccount is not
        there yet are applied again (docs/deploy.md, Troubleshooting)."""
        deadline = time.monotonic() + 60
        while True:
            done = self.cluster.kubectl("apply", *args, stdin=stdin, check=False)
            if done.returncode == 0 or "serviceaccount" not in done.stderr:
                return done
            if time.monotonic() > deadline:
                return done
            time.sleep(1)

    def apply_ok(self, *args: str, stdin: str | None = None) -> None:
        done = self.apply(*args, stdin=stdin)
        assert done.returncode == 0, f"kubectl apply {' '.join(args)}: {done.stderr}"

    def namespaces(self) -> None:
        self.apply_ok("-f", str(SAMPLES / "namespace.yaml"))
        self.apply_ok("-f", "-", stdin=_namespace(TIER_NS))

    def pods(self, namespace: str) -> list[JsonObject]:
        return self.api.list_objects(PODS, namespace=namespace).items

    def wait_running(self, namespace: str, names_: Iterable[str] | None = None) -> list[JsonObject]:
        """Every pod of the namespace (or those named) Running and Ready, or Succeeded."""
        wanted = set(names_) if names_ is not None else None

        def settled() -> list[JsonObject] | None:
            found = [
                p for p in self.pods(namespace) if wanted is None or p["metadata"]["name"] in wanted
            ]
            if wanted is not None and {p["metadata"]["name"] for p in found} != wanted:
                return None
            ok = found and all(_settled(p) for p in found)
            return found if ok else None

        return self.cluster.wait_for(
            settled,
            timeout=WAIT_S,
            message=f"pods of {namespace} not running",
            explain=lambda: _describe(self.pods(namespace)),
        )

    def delete_namespaced(self, namespace: str) -> None:
        """Every workload, pod and claim of the namespace deleted; waits until the pods are gone
        (their slices released by the plugin)."""
        # the samples' containers run `sleep` as PID 1, which ignores SIGTERM: without a short
        # grace period each wave of deletions would wait the default 30 s for nothing
        for kind in (
            "deployments,statefulsets,jobs,resourcequotas",
            "pods",
            "resourceclaims,resourceclaimtemplates",
        ):
            self.cluster.kubectl(
                "-n", namespace, "delete", kind, "--all", "--wait=false", "--grace-period=1"
            )
        self.cluster.wait_for(
            lambda: not self.pods(namespace),
            timeout=WAIT_S,
            message=f"pods of {namespace} not gone",
            explain=lambda: _describe(self.pods(namespace)),
        )

    def describe(self) -> str:
        """The cluster's pods, our daemons' state and recent events, for a failure report."""
        parts = []
        for args in (
            ("get", "pods", "-A", "-o", "wide"),
            ("get", "resourceclaims", "-A"),
            ("-n", names.SYSTEM_NAMESPACE, "get", "events", "--sort-by=.lastTimestamp"),
            ("get", "events", "-A", "--field-selector", "involvedObject.kind=Node"),
        ):
            done = self.cluster.kubectl(*args, check=False)
            parts.append(f"$ kubectl {' '.join(args)}\n{done.stdout}{done.stderr}")
        return "\n".join(parts)[-12000:]


def _settled(pod: JsonObject) -> bool:
    view = PodView.of(pod)
    if view.phase == "Succeeded":
        return True
    ready = view.condition("Ready")
    return view.phase == "Running" and ready is not None and ready.true


def _describe(pods: list[JsonObject]) -> str:
    lines = []
    for pod in pods:
        view = PodView.of(pod)
        waiting = [
            f"{(s.get('state') or {}).get('waiting', {}).get('reason', '')}"
            for s in (pod.get("status") or {}).get("containerStatuses") or []
        ]
        lines.append(
            f"{view.key}: {view.phase} node={view.node_name or '-'} gates={list(view.scheduling_gates)}"
            f" waiting={waiting} conditions="
            f"{[(c.type, c.status, c.reason) for c in view.conditions]}"
        )
    return "\n".join(lines) or "(no pods)"


def _namespace(name: str) -> str:
    return f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n"


def sample_path(relative: str) -> str:
    return str(Path(SAMPLES / relative))
