"""Keeps the classic resources of a turned-off shim out of this Node's status.

The kubelet keeps a device-plugin resource it once saw in ``status.capacity`` / ``allocatable``
after the plugin is gone (value 0 while it remembers the plugin, the old count after a restart that
lost its checkpoint; docs/design.md F13), and writes it back on its own status updates. With the shim
off and DeviceClasses carrying ``extendedResourceName`` (scheduler mode), kube-scheduler serves a
classic ``nvidia.com/mig-*`` request from such a stale entry instead of through DRA: the pod is bound
with no claim and runs with no slice, or the kubelet fails it (``no devices found allocated in local
cache``). kube-scheduler uses the DRA path only on nodes whose status does not list the resource.

But removing the entry is not enough while the kubelet still *remembers* the device plugin (for 5
minutes after the plugin went, counted again from each kubelet restart): its device manager then
fails a pod asking for the resource at container start (``no devices found allocated in local
cache``), even one kube-scheduler bound through a DRA claim — seen on real kubelets. The kubelet's
device-manager checkpoint (``<device-plugins>/kubelet_internal_checkpoint``, ``RegisteredDevices``)
lists exactly the resources it remembers; it rewrites it and its Node's status when it forgets one.

And it keeps treating the resource as a device-plugin one as long as a live pod holds devices of it
that the shim gave (a classic pod started before a switch to scheduler mode): a pod bound through
DRA then fails ``endpoint not found in cache for a registered resource`` (also seen on real
kubelets). The kubelet's pod-resources API lists those holdings.

So, with the shim off, the plugin removes from its own Node's status every resource with its classic
prefix that the kubelet no longer remembers and no live pod holds through the device manager (a merge patch of ``nodes/status`` with ``null`` values:
absent keys are no error): once before it serves, whenever the Node changes, and every
``recheck_seconds`` while entries wait. An entry the kubelet remembers stays: its allocatable is 0
(no plugin serves it), so kube-scheduler finds no room for a classic pod on that node and the pod
waits, instead of being bound and failed. An unreadable checkpoint, or a kubelet that cannot be
asked, removes nothing.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from pathlib import Path
from typing import Final

from api import wire
from driver.cluster.informer import Backoff, Informer, ListWatch
from driver.cluster.port import NODES, ClusterApi, JsonObject, PatchType
from driver.cluster.views import NodeView
from driver.errors import ApiNotFoundError, ClusterError
from kubeletplugin.deviceplugin.podresources import PodResourcesError, PodResourcesSource

logger = logging.getLogger(__name__)

STATUS_LISTS: Final = ("capacity", "allocatable")
KUBELET_CHECKPOINT: Final = "kubelet_internal_checkpoint"
"""The kubelet device manager's checkpoint, in its device-plugin directory."""
DEFAULT_RECHECK_SECONDS: Final = 30.0


def remembered_resources(checkpoint: Path) -> frozenset[str] | None:
    """Resources the kubelet's device manager remembers (keys of ``Data.RegisteredDevices`` in its
    checkpoint); empty when there is no checkpoint, None when it cannot be read or parsed."""
    try:
        text = checkpoint.read_text(encoding="utf-8")
    except FileNotFoundError:
        return frozenset()
    except OSError:
        return None
    try:
        registered = json.loads(text)["Data"]["RegisteredDevices"]
    except (ValueError, KeyError, TypeError):
        return None
    if registered is None:
        return frozenset()
    if not isinstance(registered, dict):
        return None
    return frozenset(str(name) for name in registered)


def stale_resources(node: JsonObject, *, prefix: str) -> list[str]:
    """Names under ``prefix`` in the Node's capacity or allocatable, sorted."""
    view = NodeView.of(node)
    lists = {"capacity": view.capacity, "allocatable": view.allocatable}
    names: set[str] = set()
    for field in STATUS_LISTS:
        names.update(name for name in lists[field] if name.startswith(prefix))
    return sorted(names)


def removal_patch(names: list[str]) -> wire.Node:
    """Merge patch of ``nodes/status`` that deletes ``names`` from capacity and allocatable
    (``STATUS_LISTS``)."""
    gone: dict[str, str | None] = dict.fromkeys(names)
    return {"status": {"capacity": dict(gone), "allocatable": dict(gone)}}


class StaleCapacityCleaner:
    """Watches one Node and removes ``<prefix>*`` from its status whenever they appear."""

    def __init__(
        self,
        *,
        api: ClusterApi,
        node_name: str,
        resource_prefix: str,
        kubelet_checkpoint: Path | None = None,
        pod_resources: PodResourcesSource | None = None,
        recheck_seconds: float = DEFAULT_RECHECK_SECONDS,
        backoff: Backoff | None = None,
    ) -> None:
        """``kubelet_checkpoint``: the kubelet's device-manager checkpoint; ``pod_resources``: its
        pod-resources API (None for either: taken to remember / hold nothing — tests)."""
        self._api = api
        self.node_name = node_name
        self.prefix = resource_prefix
        self._checkpoint = kubelet_checkpoint
        self._pod_resources = pod_resources
        self._recheck = recheck_seconds
        self.waiting: list[str] = []
        """Stale entries left because the kubelet still remembers them (as of the last pass)."""
        self._backoff = backoff or Backoff(initial=0.5, maximum=30.0)
        self._rng = random.Random()  # noqa: S311 - jitter, not security
        self._informer = Informer(
            source=ListWatch(api, NODES, field_selector=f"metadata.name={node_name}"),
            name=f"node-capacity-{node_name}",
        )
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.removed: list[str] = []
        """Every resource name removed so far, in order (repeats included): metrics and tests."""

    def clean_once(self, node: JsonObject | None = None) -> list[str]:
        """Remove the stale resources now; returns what was removed (``ClusterError`` if the patch
        fails; a missing Node is nothing to clean)."""
        if node is None:
            try:
                node = self._api.get(NODES, name=self.node_name)
            except ApiNotFoundError:
                return []
        stale = stale_resources(node, prefix=self.prefix)
        if not stale:
            self.waiting = []
            return []
        remembered = self._kubelet_device_resources()
        if remembered is None:
            logger.warning(
                "cannot tell which device-plugin resources the kubelet still knows: leaving %s "
                "in node %s status for now",
                stale,
                self.node_name,
            )
            self.waiting = stale
            return []
        names = [name for name in stale if name not in remembered]
        waiting = [name for name in stale if name in remembered]
        if waiting and waiting != self.waiting:
            logger.info(
                "node %s: the kubelet still treats %s as device-plugin resources (it forgets "
                "a plugin 5 minutes after it stopped, and a resource once no live pod holds "
                "devices of it); those stay in the Node's status until then",
                self.node_name,
                waiting,
            )
        self.waiting = waiting
        if not names:
            return []
        try:
            self._api.patch(
                NODES,
                name=self.node_name,
                patch=removal_patch(names),
                patch_type=PatchType.MERGE,
                subresource="status",
            )
        except ApiNotFoundError:
            return []
        logger.info(
            "removed stale classic resources %s from node %s status (the classic shim is off)",
            names,
            self.node_name,
        )
        self.removed.extend(names)
        return names

    def _kubelet_device_resources(self) -> frozenset[str] | None:
        """Resources the kubelet's device manager still knows: registered (checkpoint) or held by
        a live pod (pod-resources). None when either cannot be read."""
        registered = (
            frozenset() if self._checkpoint is None else remembered_resources(self._checkpoint)
        )
        if registered is None:
            return None
        if self._pod_resources is None:
            return registered
        try:
            holdings = self._pod_resources.list_holdings(None)
        except PodResourcesError as exc:
            logger.info("cannot ask the kubelet which devices pods hold: %s", exc)
            return None
        return registered | {resource for resource, _ in holdings.holders}

    def start(self) -> None:
        """Clean once now (best effort), then keep cleaning on every change of the Node."""
        try:
            self.clean_once()
        except ClusterError as exc:
            logger.warning("cannot clean node %s status yet (will retry): %s", self.node_name, exc)
        self._informer.add_handler(
            on_add=lambda _: self._wake.set(), on_update=lambda _old, _new: self._wake.set()
        )
        self._informer.start()
        self._thread = threading.Thread(
            target=self._run, name=f"node-capacity-{self.node_name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._informer.stop()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if self._pod_resources is not None:
            self._pod_resources.close()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            # While entries wait for the kubelet to forget them, look again now and then: it
            # rewrites its checkpoint, and normally its Node's status too (which wakes us), then.
            self._wake.wait(timeout=self._recheck if self.waiting else None)
            self._wake.clear()
            if self._stop.is_set():
                return
            node = self._informer.get(self.node_name)
            if node is None:
                continue
            try:
                self.clean_once(node)
                failures = 0
            except ClusterError as exc:
                failures += 1
                delay = self._backoff.delay(failures, self._rng)
                logger.warning(
                    "cannot remove stale classic resources from node %s: %s; retrying in %.1fs",
                    self.node_name,
                    exc,
                    delay,
                )
                self._wake.set()
                self._stop.wait(delay)
