"""``instaslice uninstall``: remove InstaSlice without stranding a pod.

While a pod holds a slice the uninstall refuses and lists it (nothing is changed); with ``drain``
it first makes sure no new slice can be allocated, evicts those pods (PodDisruptionBudgets hold;
a refused eviction is tried again), and waits until they have ended — the kubelet plugins still
run, so each slice is unprepared and destroyed and each claim released. Then it removes the
plugins (waiting for their pods), our ResourceSlices, the webhook configurations, the rest and
the namespace, and lifts our scheduling gate from the DRA pods still carrying it: they wait as
ordinary Pending pods (kube-scheduler serves them once InstaSlice is back); classic pods keep it
(only InstaSlice can serve them) and are placed when it is installed again. The order and why:
``instaslice.uninstall.manifests``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TextIO, cast

from prometheus_client.parser import text_string_to_metric_families

from api import wire
from api.names import CLASSIC_RESOURCE_PREFIX, DRIVER_NAME, SCHEDULING_GATE
from driver.cluster.ops import remove_scheduling_gate
from driver.cluster.port import (
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    ClusterApi,
    JsonObject,
    name_of,
)
from driver.cluster.views import PodView
from driver.errors import (
    ApiNotFoundError,
    ClusterError,
    ConflictError,
    DriverError,
    TooManyRequestsError,
)
from instaslice.uninstall.manifests import DeletionPlan, Target, deletion_plan
from instaslice.uninstall.survey import Survey, describe_holders, survey

DEFAULT_TIMEOUT_S = 300.0
POLL_S = 2.0


class UninstallError(DriverError):
    """The cluster did not reach the next step in time; the message says what is left."""


MetricsReader = Callable[[str, str, int], str]
"""``(namespace, pod, port) -> /metrics text`` of a pod (the API server's pod proxy)."""
SLICES_IN_USE = "instaslice_kubelet_plugin_slices_in_use"
"""The kubelet plugin's gauge of the slices its checkpoint holds (prepared, not yet unprepared)."""


class Uninstaller:
    def __init__(
        self,
        *,
        api: ClusterApi,
        out: TextIO,
        read_metrics: MetricsReader,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        poll_s: float = POLL_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._api = api
        self._out = out
        self._read_metrics = read_metrics
        self._timeout_s = timeout_s
        self._poll_s = poll_s
        self._clock = clock
        self._sleep = sleep

    def run(self, objects: Iterable[JsonObject], *, drain: bool) -> int:
        """0 when InstaSlice is gone and nothing was stranded; 1 when it refused (pods hold
        slices and ``drain`` is off: nothing was changed) or a step did not finish in time."""
        plan = deletion_plan(objects)
        found = self.survey()
        if not found.clear and not drain:
            self._refuse(found)
            return 1
        try:
            self._uninstall(plan, found)
        except UninstallError as exc:
            self._say(f"FAILED: {exc}")
            return 1
        self._say("InstaSlice removed: no pod holds a MIG slice, no claim of ours is allocated")
        return 0

    def survey(self) -> Survey:
        return survey(
            self._api.list_objects(PODS).items, self._api.list_objects(RESOURCE_CLAIMS).items
        )

    def _refuse(self, found: Survey) -> None:
        count = len(found.holders)
        self._say(
            f"refusing to uninstall: {count} {'pod holds' if count == 1 else 'pods hold'} MIG slices of "
            f"{DRIVER_NAME}. Without the kubelet plugin they would stay Terminating and their "
            "slices on the GPUs:"
        )
        for line in describe_holders(found):
            self._say(line)
        self._say(
            "Delete these workloads first (their Deployments, Jobs, StatefulSets...), or drain "
            "them: `make undeploy DRAIN=true` (instaslice uninstall --drain) evicts the pods and "
            "waits for their slices to be released; pods their owners recreate wait Pending "
            "until InstaSlice is installed again."
        )

    def _uninstall(self, plan: DeletionPlan, found: Survey) -> None:
        self._delete(plan.classes, what="DeviceClasses (no new slice can be allocated)")
        if not found.clear:
            self._drain()
        self._wait_nodes_released(plan.plugins)
        # foreground: the DaemonSet is gone only once its pods are (their sockets removed)
        self._delete(plan.plugins, what="kubelet plugins", wait=True, propagation="Foreground")
        self._delete_resource_slices()
        self._delete(plan.webhooks, what="webhook configurations")
        self._delete(plan.rest, what="controller, Services, RBAC")
        self._delete(plan.namespaces, what="namespace", wait=True)
        self._lift_gates()
        left = self.survey()
        if not left.clear:
            raise UninstallError(
                "slices are still held after the plugins were removed:\n"
                + "\n".join(describe_holders(left))
            )

    # --- draining -------------------------------------------------------------------------------

    def _drain(self) -> None:
        """Evict every pod holding a slice until none is left (recreated pods get none: the
        DeviceClasses are gone)."""
        deadline = self._clock() + self._timeout_s
        evicted: set[str] = set()
        while True:
            found = self.survey()
            if found.clear:
                self._say(f"drained: {len(evicted)} pods ended")
                return
            for holder in found.holders:
                if holder.uid not in evicted and self._evict(
                    holder.namespace, holder.name, holder.uid
                ):
                    evicted.add(holder.uid)
                    self._say(f"evicted pod {holder.key}")
            if self._clock() >= deadline:
                raise UninstallError(
                    f"after {self._timeout_s:.0f}s these still hold slices:\n"
                    + "\n".join(describe_holders(found))
                )
            self._sleep(self._poll_s)

    def _wait_nodes_released(self, plugins: tuple[Target, ...]) -> None:
        """Wait until every ready kubelet plugin holds no slice. A pod's object can be gone from
        the API before its node's kubelet has unprepared its claims (it does so once the
        containers have stopped, and retries while the plugin is away): the plugins must stay
        until they have destroyed those slices. A plugin that is not ready cannot be asked (and
        serves no kubelet): said, not waited for."""
        deadline = self._clock() + self._timeout_s
        waited = False
        while True:
            holding, unknown = self._plugin_slices(plugins)
            if not holding:
                for line in unknown:
                    self._say(f"WARNING: {line}")
                if waited:
                    self._say("every node released its slices")
                return
            waited = True
            if self._clock() >= deadline:
                raise UninstallError(
                    f"after {self._timeout_s:.0f}s the kubelet plugins still hold slices: "
                    + ", ".join(
                        f"node {node}: {count:g}" for node, count in sorted(holding.items())
                    )
                )
            self._sleep(self._poll_s)

    def _plugin_slices(self, plugins: tuple[Target, ...]) -> tuple[dict[str, float], list[str]]:
        """Node -> slices its plugin holds (only nodes holding some), and why some could not
        be asked."""
        holding: dict[str, float] = {}
        unknown: list[str] = []
        for target in plugins:
            if target.namespace is None:
                continue
            for pod in self._plugin_pods(target):
                view = PodView.of(pod)
                ready = view.condition("Ready")
                port = _metrics_port(pod)
                if ready is None or not ready.true or port is None:
                    why = "not ready" if port is not None else "serving no metrics port"
                    unknown.append(
                        f"cannot confirm that node {view.node_name or '?'} released its slices: "
                        f"plugin pod {view.key} is {why}"
                    )
                    continue
                try:
                    text = self._read_metrics(view.namespace, view.name, port)
                except DriverError as exc:
                    unknown.append(f"cannot read the metrics of plugin pod {view.key}: {exc}")
                    continue
                count = slices_in_use(text)
                if count:
                    holding[view.node_name] = count
        return holding, unknown

    def _plugin_pods(self, target: Target) -> list[JsonObject]:
        try:
            daemonset = self._api.get(target.resource, name=target.name, namespace=target.namespace)
        except ApiNotFoundError:
            return []
        owned = cast(wire.DaemonSet, daemonset)  # as the API server validated it
        labels = ((owned.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        return self._api.list_objects(
            PODS, namespace=target.namespace, label_selector=selector
        ).items

    def _evict(self, namespace: str, name: str, uid: str) -> bool:
        """True once the pod is evicted (or already gone); False while a budget refuses."""
        try:
            self._api.evict(name=name, namespace=namespace, uid=uid)
        except (ApiNotFoundError, ConflictError):
            return True  # gone, or replaced by a pod of the same name (a new survey sees it)
        except TooManyRequestsError:
            return False
        return True

    # --- deleting -------------------------------------------------------------------------------

    def _delete(
        self,
        targets: tuple[Target, ...],
        *,
        what: str,
        wait: bool = False,
        propagation: str | None = None,
    ) -> None:
        deleted = [t for t in targets if self._delete_one(t, propagation=propagation)]
        if wait:
            self._wait_gone(deleted)
        if deleted:
            self._say(f"deleted {len(deleted)} {what}: {_names(deleted)}")

    def _delete_one(self, target: Target, *, propagation: str | None) -> bool:
        try:
            self._api.delete(
                target.resource,
                name=target.name,
                namespace=target.namespace,
                propagation_policy=propagation,
            )
        except ApiNotFoundError:
            return False
        return True

    def _wait_gone(self, targets: list[Target]) -> None:
        deadline = self._clock() + self._timeout_s
        left = list(targets)
        while left:
            left = [t for t in left if self._exists(t)]
            if not left:
                return
            if self._clock() >= deadline:
                raise UninstallError(f"still there after {self._timeout_s:.0f}s: {_names(left)}")
            self._sleep(self._poll_s)

    def _exists(self, target: Target) -> bool:
        try:
            self._api.get(target.resource, name=target.name, namespace=target.namespace)
        except ApiNotFoundError:
            return False
        return True

    def _delete_resource_slices(self) -> None:
        slices = self._api.list_objects(
            RESOURCE_SLICES, field_selector=f"spec.driver={DRIVER_NAME}"
        ).items
        for item in slices:
            try:
                self._api.delete(RESOURCE_SLICES, name=name_of(item))
            except ApiNotFoundError:
                continue
        if slices:
            self._say(f"deleted {len(slices)} ResourceSlices of {DRIVER_NAME}")

    def _lift_gates(self) -> None:
        """Lift our gate from DRA pods (kube-scheduler may serve them: after a reinstall it
        allocates them, as a hand-off); keep it on classic pods, which only InstaSlice can serve
        (ungated, kube-scheduler would bind them to the shim's resource once it is back and the
        kubelet would fail them)."""
        lifted, kept = [], []
        for pod in self._api.list_objects(PODS).items:
            view = PodView.of(pod)
            if not view.gated_by(SCHEDULING_GATE):
                continue
            if view.requests_resource(lambda name: name.startswith(CLASSIC_RESOURCE_PREFIX)):
                kept.append(view.key)
                continue
            try:
                remove_scheduling_gate(self._api, pod=pod)
            except ApiNotFoundError:
                continue
            except ClusterError as exc:
                raise UninstallError(f"cannot lift the gate of pod {view.key}: {exc}") from exc
            lifted.append(view.key)
        if lifted:
            self._say(
                f"lifted {SCHEDULING_GATE} from {len(lifted)} pods (they wait Pending; "
                f"kube-scheduler or a reinstalled InstaSlice serves them): {', '.join(lifted)}"
            )
        if kept:
            self._say(
                f"kept {SCHEDULING_GATE} on {len(kept)} classic pods (InstaSlice places them "
                f"when installed again; delete them otherwise): {', '.join(kept)}"
            )

    def _say(self, line: str) -> None:
        self._out.write(f"{line}\n")
        self._out.flush()


def slices_in_use(metrics: str) -> float:
    """The sum of the plugin's slices-in-use gauge in a ``/metrics`` text."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == SLICES_IN_USE
    )


def _metrics_port(obj: JsonObject) -> int | None:
    pod = cast(wire.Pod, obj)  # as the API server validated it
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == "metrics":
                return int(port["containerPort"])
    return None


def _names(targets: Iterable[Target]) -> str:
    listed = [t.describe() for t in targets]
    return ", ".join(listed[:6]) + (f" and {len(listed) - 6} more" if len(listed) > 6 else "")
