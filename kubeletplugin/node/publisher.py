"""Publish this node's MIG inventory as ResourceSlices, and keep it right as the GPUs change.

What is published is ``driver.resourceslices.build_pool`` over ``inventory.build_inventory`` of the
backend's GPUs: counter slices plus device slices with deterministic names, owned by the Node so they
go away with it. Like the Go helper's slice controller, the pool generation starts above the highest
generation found; the content is compared first and nothing is written when it is unchanged (a
restart does not bump the generation); otherwise obsolete slices are deleted first, then every
desired slice is updated in place or created with generation ``max + 1``.

The backend is polled (``poll_seconds``): a GPU that disappears or has MIG mode turned off has its
devices withdrawn. GPUs without MIG mode are never published; each is logged and reported once as a
``MigModeDisabled`` Warning event on the Node. Publishing errors are logged and retried on the next
poll; they never stop the plugin.

A GPU the backend reports unhealthy (lost, memory errors pending a reset, a critical XID, marked so)
keeps its devices published, each with the taint ``mig.instaslice.dev/unhealthy=<reason code>``
(KEP-5055 device taints, beta and on by default in Kubernetes 1.36) with effect ``NoSchedule``, or
``NoExecute`` when the operator chose it, and ``timeAdded`` = when it was first seen so (kept across
plugin restarts: read back from the published taint). kube-scheduler and our controller allocate
no tainted device to a request that does not tolerate the taint, and everyone sees why; with
``NoExecute``, kube-controller-manager also evicts the pods using them. It is reported once per
episode (and again if the reason changes) with a warning log and a ``GpuUnhealthy`` Warning event
on the Node naming its index, UUID and the reason. When it is healthy again its devices are
republished without the taint and a ``GpuHealthy`` Normal event says so. Slices already prepared on
it are **not** destroyed by the plugin: their pods may still run, and whether to stop them is the
administrator's call (the ``NoExecute`` effect, or deleting the pods). The gauge ``gpus{health}``
counts GPUs by health.

An API server without the ``DRADeviceTaints`` feature (Kubernetes 1.35 by default) silently drops the
taints; the publisher notices that in the objects it gets back and from then on withdraws an
unhealthy GPU's devices instead (a new pool generation without them).

Listeners (``InventoryListener``: the health stream) hear of every inventory read and of every
failure to read the GPUs.
"""

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from api import wire
from driver.cluster.events import NORMAL, WARNING, EventRecorder
from driver.cluster.port import (
    NODES,
    RESOURCE_SLICES,
    ClusterApi,
    JsonObject,
    as_json,
    name_of,
    parse_time,
    resource_version_of,
    uid_of,
)
from driver.cluster.views import SliceView, mapping, path
from driver.errors import ApiNotFoundError, ConflictError, DriverError
from driver.gpu.backend import GpuBackend, GpuInfo
from driver.resourceslices import GpuInventory, build_pool
from driver.taints import EFFECT_NO_SCHEDULE, UNHEALTHY_TAINT_KEY, DeviceTaint
from kubeletplugin.metrics import PluginMetrics
from kubeletplugin.node.inventory import NodeInventory, build_inventory

logger = logging.getLogger(__name__)

MIG_DISABLED_REASON: Final = "MigModeDisabled"
GPU_UNHEALTHY_REASON: Final = "GpuUnhealthy"
GPU_HEALTHY_REASON: Final = "GpuHealthy"
_CONFLICT_RETRIES: Final = 3
UNHEALTHY_CODE: Final = "Unhealthy"
"""Taint value for an unhealthy GPU whose backend gave no reason code."""


class InventoryListener(Protocol):
    def inventory_read(self, inventory: NodeInventory) -> None: ...
    def inventory_failed(self, reason: str) -> None: ...


GpuOverlay = Callable[[tuple[GpuInfo, ...]], tuple[GpuInfo, ...]]


def _content(obj: JsonObject) -> Any:
    """What must match for a published slice to need no write: spec without generation, owners."""
    spec = dict(mapping(path(obj, "spec")))
    pool = dict(mapping(spec.pop("pool", None)))
    pool.pop("generation", None)
    spec["pool"] = pool
    owners = [
        (ref.api_version, ref.kind, ref.name, ref.uid) for ref in SliceView.of(obj).meta.owners
    ]
    return spec, owners


class SlicePublisher:
    def __init__(
        self,
        *,
        api: ClusterApi,
        backend: GpuBackend,
        node_name: str,
        driver_name: str,
        events: EventRecorder | None = None,
        metrics: PluginMetrics | None = None,
        poll_seconds: float = 30.0,
        taint_effect: str = EFFECT_NO_SCHEDULE,
        overlay: GpuOverlay | None = None,
        listeners: Sequence[InventoryListener] = (),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._api = api
        self._backend = backend
        self._node = node_name
        self._driver = driver_name
        self._events = events
        self._metrics = metrics or PluginMetrics()
        self._poll_seconds = poll_seconds
        self._taint_effect = taint_effect
        self._overlay = overlay
        self._listeners = tuple(listeners)
        self._clock = clock
        self._taint_since: dict[int, tuple[str, datetime]] = {}
        """GPU index → (taint value, timeAdded) of the taint on its devices."""
        self._taints_kept = True
        """False once the API server dropped our taints (until restart): unhealthy GPUs are then
        withdrawn."""
        self._kick = threading.Event()
        self._lock = threading.Lock()
        self._inventory = NodeInventory()
        self._reported_non_mig: set[str] = set()
        self._reported_unhealthy: dict[int, str | None] = {}
        """GPU index → the reason reported for it; to report each unhealthy episode once."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def inventory(self) -> NodeInventory:
        """The inventory read last (what is, or is about to be, published)."""
        with self._lock:
            return self._inventory

    def refresh_inventory(self) -> NodeInventory:
        """Read the backend's GPUs now; report GPUs without MIG mode once each, and GPUs turning
        unhealthy or healthy again."""
        try:
            gpus = self._backend.gpus()
        except DriverError as exc:
            for listener in self._listeners:
                listener.inventory_failed(f"reading the GPUs failed: {exc}")
            raise
        if self._overlay is not None:
            gpus = self._overlay(gpus)
        inventory = build_inventory(gpus)
        with self._lock:
            self._inventory = inventory
        for listener in self._listeners:
            listener.inventory_read(inventory)
        non_mig = {gpu.uuid: gpu for gpu in inventory.non_mig_gpus}
        for uuid in sorted(non_mig.keys() - self._reported_non_mig):
            gpu = non_mig[uuid]
            message = (
                f"GPU {gpu.index} ({gpu.product_name}, {gpu.uuid}) has MIG mode disabled; "
                "InstaSlice publishes no devices for it (enable MIG mode with nvidia-smi -mig 1)"
            )
            logger.warning("%s", message, extra={"node": self._node, "gpu": gpu.index})
            self._node_event(reason=MIG_DISABLED_REASON, message=message)
        self._reported_non_mig = set(non_mig)
        self._report_health(inventory)
        return inventory

    def _report_health(self, inventory: NodeInventory) -> None:
        unhealthy = {gpu.index: gpu for gpu in inventory.unhealthy_gpus}
        for index, gpu in sorted(unhealthy.items()):
            reported = index in self._reported_unhealthy
            if reported and self._reported_unhealthy[index] == gpu.health_reason:
                continue
            tainted = sum(1 for d in inventory.devices.values() if d.gpu_index == index)
            taint = (
                f"{UNHEALTHY_TAINT_KEY}={gpu.health_code or UNHEALTHY_CODE}:{self._taint_effect}"
            )
            kept = (
                "pods using them are evicted by the device-taint controller"
                if self._taint_effect != EFFECT_NO_SCHEDULE
                else "their pods keep running; delete them to free the GPU"
            )
            message = (
                f"GPU {index} ({gpu.product_name}, {gpu.uuid}) is unhealthy: "
                f"{gpu.health_reason or 'no reason given'}; its {tainted} devices are tainted "
                f"{taint} in this node's ResourceSlices until it is healthy again. MIG slices "
                f"already prepared on it are kept ({kept})"
            )
            logger.warning("%s", message, extra={"node": self._node, "gpu": index})
            self._node_event(reason=GPU_UNHEALTHY_REASON, message=message)
        present: dict[int, str] = {g.index: g.uuid for g in inventory.gpus}
        present.update({g.index: g.uuid for g in inventory.non_mig_gpus})
        for index in sorted(self._reported_unhealthy.keys() - unhealthy.keys()):
            if index not in present:
                logger.info("unhealthy GPU %s is gone from the node", index,
                            extra={"node": self._node, "gpu": index})  # fmt: skip
                continue
            message = (
                f"GPU {index} ({present[index]}) is healthy again; its devices are republished "
                "without the taint"
            )
            logger.info("%s", message, extra={"node": self._node, "gpu": index})
            self._node_event(reason=GPU_HEALTHY_REASON, message=message, event_type=NORMAL)
        self._reported_unhealthy = {i: g.health_reason for i, g in unhealthy.items()}
        self._metrics.set_gpu_health(
            healthy=len(inventory.gpus) + len(inventory.non_mig_gpus), unhealthy=len(unhealthy)
        )

    def sync(self) -> bool:
        """Re-read the inventory and make the published slices match it (also repairing slices
        someone else changed or deleted). Returns True if ResourceSlices were written; raises
        ``DriverError`` if publishing failed.
        """
        inventory = self.refresh_inventory()
        for attempt in range(_CONFLICT_RETRIES):
            try:
                written = self.publish(inventory)
            except ConflictError:
                if attempt + 1 == _CONFLICT_RETRIES:
                    raise
                continue
            self._metrics.set_published_devices(inventory.published_device_count)
            return written
        return False  # pragma: no cover - the loop returns or raises

    def publish(self, inventory: NodeInventory) -> bool:
        """Make the API's slices of this node's pool equal to ``inventory``; True if written."""
        existing = self._existing_slices()
        owner = self._node_owner()
        current_generation = max((SliceView.of(o).pool_generation for o in existing), default=0)
        if self._taints_kept:
            gpus: tuple[GpuInventory, ...] = (*inventory.gpus, *inventory.tainted_gpus)
            taints = self._taints(inventory, existing)
        else:
            gpus, taints = inventory.gpus, {}
        desired = build_pool(
            node=self._node,
            gpus=gpus,
            generation=current_generation,
            owner=owner,
            taints=taints,
        )
        if self._unchanged(existing, desired):
            return False
        desired = build_pool(
            node=self._node,
            gpus=gpus,
            generation=current_generation + 1,
            owner=owner,
            taints=taints,
        )
        if self._write(existing, desired):
            self._taints_kept = False
            logger.warning(
                "the API server dropped the device taints (its DRADeviceTaints feature is off: "
                "Kubernetes < 1.36?); unhealthy GPUs' devices are withdrawn instead",
                extra={"node": self._node},
            )
            self.publish(inventory)
            return True
        logger.info(
            "published %d devices of %d MIG GPUs in %d ResourceSlices (generation %d); "
            "tainted unhealthy GPUs: %s",
            inventory.published_device_count
            + (inventory.tainted_device_count if self._taints_kept else 0),
            len(gpus),
            len(desired),
            current_generation + 1,
            ", ".join(f"{i} ({t[0].value})" for i, t in sorted(taints.items())) or "none",
            extra={"node": self._node},
        )
        return True

    def _existing_slices(self) -> list[JsonObject]:
        """This node's ResourceSlices of our driver, as the API server has them."""
        return [
            obj
            for obj in self._api.list_objects(
                RESOURCE_SLICES, field_selector=f"spec.nodeName={self._node}"
            ).items
            if SliceView.of(obj).driver == self._driver
        ]

    def _write(self, existing: Sequence[JsonObject], desired: Sequence[wire.ResourceSlice]) -> bool:
        """Delete the slices no longer desired, create or update the others; True when the API
        server dropped the device taints of some slice written."""
        wanted = {name_of(obj) for obj in desired}
        by_name = {name_of(obj): obj for obj in existing}
        for name, old in by_name.items():
            if name not in wanted:
                with contextlib.suppress(ApiNotFoundError):
                    self._api.delete(RESOURCE_SLICES, name=name, uid=uid_of(old))
        dropped = False
        for obj in desired:
            current = by_name.get(name_of(obj))
            if current is None:
                written = self._api.create(RESOURCE_SLICES, obj)
            else:
                obj["metadata"]["resourceVersion"] = resource_version_of(current)
                written = self._api.update(RESOURCE_SLICES, obj)
            dropped = dropped or _taints_dropped(as_json(obj), written)
        return dropped

    def _taints(
        self, inventory: NodeInventory, existing: Sequence[JsonObject]
    ) -> dict[int, tuple[DeviceTaint]]:
        """GPU index → the taint of each unhealthy published GPU. ``timeAdded`` is when the GPU
        was first seen unhealthy for this reason: remembered, or read back from our taint on its
        published devices (a restarted plugin keeps the time), or now."""
        codes = {g.index: g.health_code or UNHEALTHY_CODE for g in inventory.unhealthy_gpus}
        published = _published_taint_times(existing)
        since: dict[int, tuple[str, datetime]] = {}
        for gpu in inventory.tainted_gpus:
            code = codes.get(gpu.index, UNHEALTHY_CODE)
            known = self._taint_since.get(gpu.index)
            if known is not None and known[0] == code:
                since[gpu.index] = known
                continue
            times = [
                published[name]
                for name, device in inventory.devices.items()
                if device.gpu_index == gpu.index and name in published
            ]
            earlier = [added for value, added in times if value == code]
            since[gpu.index] = (code, min(earlier) if earlier else self._clock())
        self._taint_since = since
        return {
            index: (
                DeviceTaint(
                    key=UNHEALTHY_TAINT_KEY,
                    value=code,
                    effect=self._taint_effect,
                    time_added=added,
                ),
            )
            for index, (code, added) in since.items()
        }

    def wake(self) -> None:
        """Re-read and republish now instead of at the next poll (a GPU's health changed)."""
        self._kick.set()

    def start(self) -> None:
        """Poll the backend every ``poll_seconds`` (or when woken) in a daemon thread."""
        self._stop.clear()
        self._kick.clear()
        self._thread = threading.Thread(target=self._run, name="slice-publisher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            self._kick.wait(self._poll_seconds)
            self._kick.clear()
            if self._stop.is_set():
                return
            try:
                self.sync()
            except DriverError as exc:
                logger.warning("publishing ResourceSlices failed (retrying): %s", exc)
            except Exception:
                logger.exception("publishing ResourceSlices failed unexpectedly (retrying)")

    @staticmethod
    def _unchanged(existing: Sequence[JsonObject], desired: Sequence[wire.ResourceSlice]) -> bool:
        if len(existing) != len(desired):
            return False
        generations = {SliceView.of(o).pool_generation for o in existing}
        if len(generations) > 1:
            return False
        old = {name_of(o): _content(o) for o in existing}
        return all(old.get(name_of(o)) == _content(as_json(o)) for o in desired)

    def _node_owner(self) -> wire.OwnerReference | None:
        try:
            node = self._api.get(NODES, name=self._node)
        except ApiNotFoundError:
            logger.warning("Node %s not found; publishing slices without an owner", self._node)
            return None
        return {"apiVersion": "v1", "kind": "Node", "name": self._node, "uid": uid_of(node)}

    def _node_event(self, *, reason: str, message: str, event_type: str = WARNING) -> None:
        if self._events is None:
            return
        try:
            node = self._api.get(NODES, name=self._node)
        except DriverError as exc:
            logger.info("cannot post %s event on Node %s: %s", reason, self._node, exc)
            return
        self._events.record(node, event_type=event_type, reason=reason, message=message)


def _published_taint_times(existing: Sequence[JsonObject]) -> Mapping[str, tuple[str, datetime]]:
    """Device name → (value, timeAdded) of our unhealthy taint on the published devices."""
    found: dict[str, tuple[str, datetime]] = {}
    for obj in existing:
        for device in SliceView.of(obj).devices:
            for taint in device.taints:
                if taint.key == UNHEALTHY_TAINT_KEY and taint.time_added:
                    try:
                        found[device.name] = (taint.value, parse_time(taint.time_added))
                    except ValueError:
                        continue
    return found


def _taints_dropped(sent: JsonObject, written: JsonObject) -> bool:
    """True when ``sent`` had device taints that the API server's answer ``written`` lacks (what
    kube-apiserver does to fields of a disabled feature gate)."""
    had = {d.name for d in SliceView.of(sent).devices if d.taints}
    if not had:
        return False
    kept = {d.name for d in SliceView.of(written).devices if d.taints}
    return not had <= kept
