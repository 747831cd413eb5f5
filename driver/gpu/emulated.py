"""A GPU backend without GPUs: the catalog's MIG tables and NVIDIA's placement rules, emulated.

Used by ``make demo``, the end-to-end tests and KinD clusters without GPUs. It keeps NVML's
contract (``driver.gpu.backend``): the same placements, the same refusals, the same error types.

- GPUs come from a spec such as ``2xA100-40GB,1xH100-80GB`` (``parse_gpu_spec``).
- GPU and MIG UUIDs are deterministic: uuid5 over (node name, GPU index) and over (node name, GPU
  index, profile, placement start, GI id), so a restarted plugin sees the same ids.
- With ``state_file``, instances live in a JSON file shared by processes
  (``driver.gpu.emulated_state``) and outlive the process, as real MIG instances outlive a crashed
  plugin.
- GI ids are the lowest free id from 1; the default compute instance has CI id 0.
- ``set_health`` marks a GPU unhealthy (or healthy again) with a reason, kept in the state, so a
  mark made through one backend object (an operator's, a test's) is what ``gpus()`` of every other
  one on the same state file reports. Slices on an unhealthy GPU are left as they are, and creating
  one is still allowed: a real GPU with memory errors pending a reset still answers NVML too.
- ``slice_usage`` is emulated and deterministic: a slice's memory total is its profile's memory
  and the memory in use is between one and six eighths of it, fixed by the MIG UUID (so a slice
  keeps its figure, and slices differ); utilization is ``None``, as most GPUs answer for MIG
  devices.
- ``inject_xid`` queues an XID critical-error event, as the GPU driver would report it, for
  ``next_xid_event`` of this backend object (events are per process, as NVML's are).

MIG mode (``MigModeBackend``): every GPU has MIG on unless listed in ``mig_disabled``. MIG mode and
running processes (``set_running_processes``) live in the backend object, not in the state file.
``set_mig_mode`` follows NVML: the mode applies at once when ``mig_mode_needs_reset`` is False and
no process runs, else it stays pending until ``reset_gpu``, which is refused while processes run and
ends every instance on the GPU. ``fail_next_reset`` makes the next reset fail.

Fault injection (for crash tests of callers): ``fault_hook(step)`` is called inside
``create_slice`` with these steps, while the state lock is held:

- ``"before-gi"``: nothing created yet;
- ``"after-gi"``: the GPU instance is recorded (state saved) without a compute instance;
- ``"ci"``: creating the compute instance. An exception here is a compute-instance failure: the
  GPU instance is destroyed and ``BackendError`` raised, as the NVML backend does;
- ``"after-ci"``: the slice is complete and saved, but the caller has not been answered.

An exception from any other step propagates unchanged and leaves the state as saved so far —
``"after-gi"`` leaves a GPU instance without compute instance behind, as a real crash would.
"""

import logging
import queue
import re
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Final

from driver.errors import BackendError, ConfigError, DriverError, NotFoundError
from driver.gpu import caps
from driver.gpu.backend import GpuInfo, MigInstance, SliceUsage, XidEvent, gpu_by_index
from driver.gpu.emulated_state import (
    FileStateStore,
    InstanceRecord,
    MemoryStateStore,
    StateStore,
)
from driver.gpu.rules import Occupant, checked_placement, lowest_free_id
from driver.ids import GpuUuid, MigUuid
from driver.mig.catalog import gpu_model
from driver.mig.model import GpuModel

log = logging.getLogger(__name__)

FaultHook = Callable[[str], None]
FAULT_STEPS: Final = ("before-gi", "after-gi", "ci", "after-ci")
MAX_GPUS_PER_NODE: Final = 64
MARKED_UNHEALTHY_CODE: Final = "MarkedUnhealthy"
"""``GpuInfo.health_code`` of a GPU marked unhealthy with ``set_health``."""
FIRST_GI_ID: Final = 1
DEFAULT_CI_ID: Final = 0

_UUID_NAMESPACE: Final = uuid.UUID("5b7d8f0e-3c1a-4e55-9a51-6d2f3b1c9e47")
_SPEC_PART: Final = re.compile(r"^(?:(?P<count>\d+)\s*[xX]\s*)?(?P<model>[A-Za-z0-9][\w.-]*)$")


def parse_gpu_spec(spec: str) -> tuple[GpuModel, ...]:
    """``"2xA100-40GB,1xH100-80GB"`` → the catalog models, one per GPU, in index order.

    A part without a count means one GPU. ``ConfigError`` naming the bad part otherwise.
    """
    models: list[GpuModel] = []
    parts = [part.strip() for part in spec.split(",")]
    if not spec.strip():
        raise ConfigError("emulated GPU spec is empty; expected e.g. '2xA100-40GB,1xH100-80GB'")
    for part in parts:
        match = _SPEC_PART.match(part)
        if match is None:
            raise ConfigError(
                f"malformed emulated GPU spec part {part!r} in {spec!r}; "
                "expected '<count>x<model>', e.g. '2xA100-40GB'"
            )
        digits = match["count"] or "1"
        # Checked before the list grows (and a thousand digits before converting them): a spec of
        # a billion GPUs is refused, not allocated.
        count = int(digits) if len(digits) <= 9 else None
        if count is not None and count < 1:
            raise ConfigError(f"emulated GPU spec part {part!r} asks for {count} GPUs")
        if count is None or len(models) + count > MAX_GPUS_PER_NODE:
            asked = "more than a billion" if count is None else str(len(models) + count)
            raise ConfigError(
                f"emulated GPU spec {spec!r} asks for {asked} GPUs; at most "
                f"{MAX_GPUS_PER_NODE} per node"
            )
        try:
            model = gpu_model(match["model"])
        except ConfigError as exc:
            raise ConfigError(f"emulated GPU spec part {part!r}: {exc}") from exc
        models.extend([model] * count)
    return tuple(models)


def emulated_gpu_uuid(*, node_name: str, gpu_index: int) -> GpuUuid:
    return GpuUuid(f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/gpu/{gpu_index}')}")


def emulated_mig_uuid(
    *, node_name: str, gpu_index: int, profile: str, start: int, gi_id: int
) -> MigUuid:
    key = f"{node_name}/gpu/{gpu_index}/{profile}/{start}/gi/{gi_id}"
    return MigUuid(f"MIG-{uuid.uuid5(_UUID_NAMESPACE, key)}")


class EmulatedGpuBackend:
    """``GpuBackend`` over emulated GPUs; see the module docstring for ids, state and faults."""

    def __init__(
        self,
        *,
        node_name: str,
        spec: str | Sequence[GpuModel],
        state_file: Path | None = None,
        fault_hook: FaultHook | None = None,
        mig_disabled: Sequence[int] = (),
        mig_mode_needs_reset: bool = True,
    ) -> None:
        if not node_name:
            raise ConfigError("the emulated GPU backend needs a node name")
        models = parse_gpu_spec(spec) if isinstance(spec, str) else tuple(spec)
        if not models:
            raise ConfigError("the emulated GPU backend needs at least one GPU")
        self._node_name = node_name
        self._gpus = tuple(
            GpuInfo(
                index=index,
                uuid=emulated_gpu_uuid(node_name=node_name, gpu_index=index),
                product_name=model.product_name,
                memory_bytes=model.memory_bytes,
                multiprocessors=max(p.multiprocessors for p in model.profiles),
                mig_enabled=True,
                mig_pending=True,
                minor=index,
                model=model,
            )
            for index, model in enumerate(models)
        )
        self._store: StateStore = (
            MemoryStateStore()
            if state_file is None
            else FileStateStore(
                state_file, node_name=node_name, gpu_models=[m.name for m in models]
            )
        )
        self._fault_hook = fault_hook
        self._closed = threading.Event()
        self._xid_events: queue.Queue[XidEvent | None] = queue.Queue()
        for index in mig_disabled:
            gpu_by_index(self._gpus, index)
        self._mig_lock = threading.RLock()
        self._mig: dict[int, tuple[bool, bool]] = {
            gpu.index: (gpu.index not in mig_disabled,) * 2 for gpu in self._gpus
        }
        """GPU index → (current, pending) MIG mode."""
        self._mig_mode_needs_reset = mig_mode_needs_reset
        self._processes: dict[int, int] = {}
        self._reset_failures: list[str] = []
        with self._store.locked() as records:
            self._validate(records)
        log.info("emulated GPUs on node %s: %s (%s)", node_name, len(models), self._store.where)

    def gpus(self) -> tuple[GpuInfo, ...]:
        self._check_open()
        with self._store.locked():
            unhealthy = self._store.unhealthy()
        gpus = tuple(self._with_mig_mode(gpu) for gpu in self._gpus)
        if not unhealthy:
            return gpus
        return tuple(
            replace(
                gpu,
                healthy=False,
                health_reason=unhealthy[gpu.index],
                health_code=MARKED_UNHEALTHY_CODE,
            )
            if gpu.index in unhealthy
            else gpu
            for gpu in gpus
        )

    # -- MigModeBackend ----------------------------------------------------------------------

    def running_processes(self, *, gpu_index: int) -> int:
        self._check_open()
        gpu_by_index(self._gpus, gpu_index)
        with self._mig_lock:
            return self._processes.get(gpu_index, 0)

    def set_running_processes(self, gpu_index: int, count: int) -> None:
        """How many processes run on the emulated GPU (a busy GPU never gets its MIG mode changed)."""
        gpu_by_index(self._gpus, gpu_index)
        with self._mig_lock:
            self._processes[gpu_index] = count

    def set_mig_mode(self, *, gpu_index: int, enabled: bool) -> None:
        self._check_open()
        gpu_by_index(self._gpus, gpu_index)
        with self._mig_lock:
            current, _ = self._mig[gpu_index]
            if not enabled and current and self.instances(gpu_index=gpu_index):
                raise BackendError(
                    f"cannot turn MIG mode off on GPU {gpu_index}: GPU instances exist"
                )
            busy = self._processes.get(gpu_index, 0) > 0
            applies_now = current == enabled or not (self._mig_mode_needs_reset or busy)
            self._mig[gpu_index] = (enabled if applies_now else current, enabled)
        log.info("emulated GPU %s: MIG mode %s asked (%s)", gpu_index, "on" if enabled else "off",
                 "applied" if applies_now else "pending a GPU reset")  # fmt: skip

    def fail_next_reset(self, reason: str) -> None:
        """Make the next ``reset_gpu`` fail with ``reason`` (as an unpermitted reset does)."""
        with self._mig_lock:
            self._reset_failures.append(reason)

    def reset_gpu(self, *, gpu_index: int) -> None:
        self._check_open()
        gpu_by_index(self._gpus, gpu_index)
        with self._mig_lock:
            if self._reset_failures:
                raise BackendError(
                    f"resetting GPU {gpu_index} failed: {self._reset_failures.pop(0)}"
                )
            if self._processes.get(gpu_index, 0) > 0:
                raise BackendError(
                    f"resetting GPU {gpu_index} failed: {self._processes[gpu_index]} processes "
                    "run on it"
                )
            with self._store.locked() as records:
                kept = [r for r in records if r.gpu_index != gpu_index]
                if len(kept) != len(records):
                    self._store.save(kept)
            _, pending = self._mig[gpu_index]
            self._mig[gpu_index] = (pending, pending)
        log.info("emulated GPU %s reset", gpu_index)

    def _with_mig_mode(self, gpu: GpuInfo) -> GpuInfo:
        with self._mig_lock:
            current, pending = self._mig[gpu.index]
        if current and pending:
            return gpu
        return replace(gpu, mig_enabled=current, mig_pending=pending,
                       model=gpu.model if current else None)  # fmt: skip

    def set_health(self, gpu_index: int, *, healthy: bool, reason: str | None = None) -> None:
        """Mark GPU ``gpu_index`` unhealthy (``reason`` says why) or healthy again."""
        self._check_open()
        gpu_by_index(self._gpus, gpu_index)
        why = (reason or "").strip() or "marked unhealthy"
        with self._store.locked() as records:
            self._validate(records)
            marks = self._store.unhealthy()
            if healthy:
                marks.pop(gpu_index, None)
            else:
                marks[gpu_index] = why
            self._store.save(records, unhealthy=marks)
        if healthy:
            log.info("emulated GPU %s marked healthy", gpu_index)
        else:
            log.warning("emulated GPU %s marked unhealthy: %s", gpu_index, why)

    def inject_xid(self, gpu_index: int, xid: int, *, gi_id: int | None = None) -> None:
        """Report XID ``xid`` on GPU ``gpu_index`` (on GPU instance ``gi_id`` if given)."""
        self._check_open()
        gpu = gpu_by_index(self._gpus, gpu_index)
        if xid < 0:
            raise ConfigError(f"an XID is a non-negative number, got {xid}")
        self._xid_events.put(XidEvent(gpu_index=gpu_index, gpu_uuid=gpu.uuid, xid=xid, gi_id=gi_id))

    def next_xid_event(self, *, timeout_seconds: float) -> XidEvent | None:
        self._check_open()
        try:
            event = self._xid_events.get(timeout=max(timeout_seconds, 0.0))
        except queue.Empty:
            return None
        if event is None:  # close() woke us
            self._check_open()
        return event

    def instances(self, *, gpu_index: int | None = None) -> tuple[MigInstance, ...]:
        self._check_open()
        if gpu_index is not None:
            gpu_by_index(self._gpus, gpu_index)
        with self._store.locked() as records:
            self._validate(records)
        return tuple(
            self._instance(r)
            for r in sorted(records, key=lambda r: (r.gpu_index, r.gi_id))
            if gpu_index is None or r.gpu_index == gpu_index
        )

    def create_slice(self, *, gpu_index: int, profile: str, start: int) -> MigInstance:
        self._check_open()
        model = self._model(gpu_index)
        mig_profile = model.profile(profile)
        with self._store.locked() as records:
            self._validate(records)
            mine = [r for r in records if r.gpu_index == gpu_index]
            checked_placement(
                gpu_index=gpu_index,
                profile=mig_profile,
                start=start,
                occupants=[self._occupant(model, r) for r in mine],
            )
            self._fault("before-gi")
            gi_only = InstanceRecord(
                gpu_index=gpu_index,
                profile=mig_profile.name,
                start=start,
                gi_id=lowest_free_id((r.gi_id for r in mine), first=FIRST_GI_ID),
                ci_id=None,
            )
            records.append(gi_only)
            self._store.save(records)
            self._fault("after-gi")
            complete = replace(gi_only, ci_id=DEFAULT_CI_ID)
            try:
                self._fault("ci")
                self._store.save([complete if r is gi_only else r for r in records])
            except Exception as exc:
                records.remove(gi_only)
                outcome = "the GPU instance was destroyed"
                try:
                    self._store.save(records)
                except DriverError as rollback_exc:
                    log.error("GPU instance %s left without compute instance: %s", gi_only.gi_id,
                              rollback_exc)  # fmt: skip
                    outcome = f"destroying the GPU instance failed too: {rollback_exc}"
                raise BackendError(
                    f"creating the compute instance of GPU instance {gi_only.gi_id} "
                    f"({profile} at start {start}) on GPU {gpu_index} failed: {exc}; {outcome}"
                ) from exc
            self._fault("after-ci")
        log.info(
            "created %s at start %s on GPU %s (GI %s)", profile, start, gpu_index, gi_only.gi_id
        )
        return self._instance(complete)

    def destroy_slice(self, *, gpu_index: int, gi_id: int) -> None:
        self._check_open()
        self._model(gpu_index)
        with self._store.locked() as records:
            self._validate(records)
            doomed = [r for r in records if r.gpu_index == gpu_index and r.gi_id == gi_id]
            if not doomed:
                raise _no_such_gi(gpu_index, gi_id, records)
            self._store.save([r for r in records if r not in doomed])
        log.info("destroyed GPU instance %s on GPU %s", gi_id, gpu_index)

    def slice_usage(self, *, mig_uuid: MigUuid) -> SliceUsage:
        self._check_open()
        for instance in self.instances():
            if instance.mig_uuid == mig_uuid:
                total = self._model(instance.gpu_index).profile(instance.profile).memory_bytes
                eighths = 1 + uuid.UUID(mig_uuid.removeprefix("MIG-")).int % 6
                return SliceUsage(memory_used_bytes=total * eighths // 8, memory_total_bytes=total)
        raise NotFoundError(f"no MIG device {mig_uuid} on emulated node {self._node_name}")

    def close(self) -> None:
        self._closed.set()
        self._xid_events.put(None)

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise BackendError("the emulated GPU backend is closed")

    def _model(self, gpu_index: int) -> GpuModel:
        model = gpu_by_index(self._gpus, gpu_index).model
        with self._mig_lock:
            mig_on = self._mig[gpu_index][0]
        if model is None or not mig_on:
            raise ConfigError(f"MIG mode is off on emulated GPU {gpu_index}")
        return model

    @staticmethod
    def _occupant(model: GpuModel, record: InstanceRecord) -> Occupant:
        profile = model.profile(record.profile)
        return Occupant(profile=profile, placement=profile.placement_at(record.start))

    def _validate(self, records: Sequence[InstanceRecord]) -> None:
        """Refuse state that cannot be on these GPUs (a hand-edited or foreign file)."""
        seen: set[tuple[int, int]] = set()
        for record in records:
            key = (record.gpu_index, record.gi_id)
            try:
                self._occupant(self._model(record.gpu_index), record)
            except DriverError as exc:
                raise ConfigError(
                    f"{self._store.where} holds an impossible instance: {exc}"
                ) from exc
            if key in seen:
                raise ConfigError(
                    f"{self._store.where} holds GPU instance {record.gi_id} on GPU "
                    f"{record.gpu_index} twice"
                )
            seen.add(key)

    def _instance(self, record: InstanceRecord) -> MigInstance:
        gpu = self._gpus[record.gpu_index]
        minor = gpu.minor if gpu.minor is not None else record.gpu_index
        complete = record.ci_id is not None
        return MigInstance(
            gpu_index=record.gpu_index,
            gpu_uuid=gpu.uuid,
            profile=record.profile,
            placement=self._occupant(self._model(record.gpu_index), record).placement,
            gi_id=record.gi_id,
            ci_id=record.ci_id,
            mig_uuid=(
                emulated_mig_uuid(
                    node_name=self._node_name,
                    gpu_index=record.gpu_index,
                    profile=record.profile,
                    start=record.start,
                    gi_id=record.gi_id,
                )
                if complete
                else None
            ),
            gi_cap_minor=caps.layout_minor(gpu_minor=minor, gi_id=record.gi_id),
            ci_cap_minor=(
                caps.layout_minor(gpu_minor=minor, gi_id=record.gi_id, ci_id=record.ci_id)
                if record.ci_id is not None
                else None
            ),
        )

    def _fault(self, step: str) -> None:
        if self._fault_hook is not None:
            self._fault_hook(step)


def _no_such_gi(gpu_index: int, gi_id: int, records: Sequence[InstanceRecord]) -> NotFoundError:
    existing = sorted(r.gi_id for r in records if r.gpu_index == gpu_index)
    listed = ", ".join(map(str, existing)) or "none"
    return NotFoundError(
        f"no GPU instance {gi_id} on GPU {gpu_index} (GPU instances there: {listed})"
    )
