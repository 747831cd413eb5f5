"""``--mig-mode when-idle``: turn MIG mode on for GPUs that have it off and run nothing.

Run once when the kubelet plugin starts, before the first inventory is read (so the GPUs it enables
are published with their MIG profiles). For each GPU with MIG mode off:

1. a GPU that cannot do MIG (NVML reports no MIG mode), is unhealthy, or runs any compute or
   graphics process is left alone — never touched — and the reason is reported;
2. otherwise MIG mode is asked for (``nvmlDeviceSetMigMode``). Where the GPU applies it at once,
   done; where it stays pending (most GPUs need a reset), the processes are counted again and the
   GPU is reset (``nvidia-smi --gpu-reset``, NVML having no reset call);
3. a reset that is refused or fails leaves the mode pending and says that the GPU needs a reset
   (by an administrator, or a reboot).

Each step is reported through ``report`` (the plugin posts it as an event on its Node), with
``Normal`` for progress and ``Warning`` where a person has to act. ``never`` (the default) skips all
of this: MIG mode is then only read.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from driver.cluster.events import NORMAL, WARNING
from driver.errors import DriverError
from driver.gpu.backend import GpuInfo, MigModeBackend, gpu_by_index

logger = logging.getLogger(__name__)

REASON_UNSUPPORTED: Final = "MigModeUnsupported"
REASON_BUSY: Final = "MigModeGpuBusy"
REASON_UNHEALTHY: Final = "MigModeGpuUnhealthy"
REASON_ENABLING: Final = "MigModeEnabling"
REASON_RESETTING: Final = "MigModeGpuReset"
REASON_ENABLED: Final = "MigModeEnabled"
REASON_RESET_NEEDED: Final = "MigModeResetNeeded"
REASON_FAILED: Final = "MigModeFailed"


@dataclass(frozen=True, slots=True)
class MigModeStep:
    """One thing done or found for one GPU, as the Node event says it."""

    gpu_index: int
    event_type: str
    reason: str
    message: str


Report = Callable[[MigModeStep], None]


def enable_mig_when_idle(backend: MigModeBackend, *, report: Report) -> list[MigModeStep]:
    """Enable MIG mode on every idle GPU that has it off (module docstring); returns the steps,
    each also given to ``report``. Never raises for one GPU's failure."""
    steps: list[MigModeStep] = []

    def step(gpu: GpuInfo, event_type: str, reason: str, message: str) -> None:
        done = MigModeStep(
            gpu_index=gpu.index,
            event_type=event_type,
            reason=reason,
            message=f"GPU {gpu.index} ({gpu.product_name}, {gpu.uuid}): {message}",
        )
        log = logger.warning if event_type == WARNING else logger.info
        log("%s: %s", reason, done.message)
        steps.append(done)
        report(done)

    try:
        gpus = backend.gpus()
    except DriverError as exc:
        logger.error("cannot list GPUs to enable MIG mode: %s", exc)
        return steps
    for gpu in gpus:
        if gpu.mig_enabled:
            continue
        try:
            _enable_one(backend, gpu, step)
        except DriverError as exc:
            step(gpu, WARNING, REASON_FAILED, f"enabling MIG mode failed: {exc}")
    return steps


def _enable_one(
    backend: MigModeBackend, gpu: GpuInfo, step: Callable[[GpuInfo, str, str, str], None]
) -> None:
    if gpu.mig_pending is None:
        step(gpu, NORMAL, REASON_UNSUPPORTED, "the GPU does not support MIG; left as it is")
        return
    if not gpu.healthy:
        step(gpu, WARNING, REASON_UNHEALTHY,
             f"MIG mode is off and the GPU is unhealthy ({gpu.health_reason}); not touched")  # fmt: skip
        return
    if _busy(backend, gpu, step, "MIG mode left off"):
        return
    if not gpu.mig_pending:
        backend.set_mig_mode(gpu_index=gpu.index, enabled=True)
        step(gpu, NORMAL, REASON_ENABLING, "MIG mode was off and the GPU idle; enabling it")
    now = gpu_by_index(backend.gpus(), gpu.index)
    if now.mig_enabled:
        step(gpu, NORMAL, REASON_ENABLED, "MIG mode is on")
        return
    if _busy(backend, gpu, step, "MIG mode stays pending until the GPU is reset"):
        return
    step(gpu, NORMAL, REASON_RESETTING, "MIG mode is pending a GPU reset; resetting the GPU")
    try:
        backend.reset_gpu(gpu_index=gpu.index)
    except DriverError as exc:
        step(gpu, WARNING, REASON_RESET_NEEDED,
             f"MIG mode is pending and the GPU reset failed ({exc}); reset the GPU "
             f"(nvidia-smi --gpu-reset -i {gpu.index}) or reboot the node, then restart "
             "the plugin")  # fmt: skip
        return
    after = gpu_by_index(backend.gpus(), gpu.index)
    if after.mig_enabled:
        step(gpu, NORMAL, REASON_ENABLED, "MIG mode is on after the GPU reset")
    else:
        step(gpu, WARNING, REASON_RESET_NEEDED,
             "MIG mode is still pending after the GPU reset; reboot the node")  # fmt: skip


def _busy(
    backend: MigModeBackend,
    gpu: GpuInfo,
    step: Callable[[GpuInfo, str, str, str], None],
    outcome: str,
) -> bool:
    processes = backend.running_processes(gpu_index=gpu.index)
    if processes:
        step(gpu, WARNING, REASON_BUSY,
             f"MIG mode is off and {processes} processes run on the GPU; {outcome} (the GPU is "
             "never touched while in use; restart the plugin once it is idle)")  # fmt: skip
        return True
    return False
