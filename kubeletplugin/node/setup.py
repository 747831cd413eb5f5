"""Before the plugin starts: the GPU backend chosen by the flags, and the node made ready for it.

Shared by the daemon (``kubeletplugin.__main__``) and the operator's pre-deploy check
(``kubeletplugin.selfcheck``), so both build the backend and read the CDI edits the same way.
"""

import logging
from collections.abc import Callable

from driver.cdi_common import CommonEdits, resolve_common_edits
from driver.cluster.events import WARNING
from driver.daemon.paths import check_file, check_writable_directory
from driver.errors import ConfigError
from driver.gpu.backend import MigModeBackend
from kubeletplugin.node.events import NodeEvents
from kubeletplugin.node.migmode import enable_mig_when_idle
from kubeletplugin.settings import Settings

logger = logging.getLogger(__name__)


def check_paths(settings: Settings) -> None:
    """``ConfigError`` naming the flag unless every directory the plugin writes can be written
    (or made) and the emulated backend's state file, if there is one, is a file it can read."""
    for flag, directory in (
        ("--state-dir", settings.state_dir),
        ("--cdi-root", settings.cdi_root),
        ("--plugin-dir", settings.plugin_dir),
        ("--plugin-registry-dir", settings.plugin_registry_dir),
    ):
        check_writable_directory(directory, flag=flag)
    if settings.gpu_backend == "emulated":
        state_file = settings.emulated_state_file
        check_file(state_file, flag="--emulated-state-file", may_be_missing=True)
        check_writable_directory(state_file.parent, flag="--emulated-state-file")


def build_backend(settings: Settings) -> MigModeBackend:
    """The backend ``--gpu-backend`` names: ``BackendError`` while it cannot start yet (no NVML),
    ``ConfigError`` when it never can (the emulated GPUs or their state file)."""
    if settings.gpu_backend == "emulated":
        from driver.gpu.emulated import EmulatedGpuBackend  # noqa: PLC0415 - chosen at run time

        directory = settings.emulated_state_file.parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--emulated-state-file: cannot make {directory}: {exc}") from exc
        return EmulatedGpuBackend(
            node_name=settings.node_name,
            spec=settings.emulated_gpus or "",
            state_file=settings.emulated_state_file,
        )
    from driver.gpu.nvml import NvmlGpuBackend  # noqa: PLC0415 - imports pynvml only when chosen

    return NvmlGpuBackend()


REASON_CDI_COMMON_EDITS_MISSING = "CdiCommonEditsMissing"


def resolve_cdi_common(settings: Settings) -> CommonEdits:
    """The common CDI edits ``--cdi-common-edits`` names (``ConfigError`` if unusable)."""
    return resolve_common_edits(
        settings.cdi_common_edits, emulated=settings.gpu_backend == "emulated"
    )


def prepare_node(
    settings: Settings,
    *,
    backend: MigModeBackend,
    node_events: NodeEvents,
    resolve: Callable[[Settings], CommonEdits] = resolve_cdi_common,
) -> CommonEdits:
    """Before the plugin starts: resolve the common CDI edits (a Warning event on the Node when
    ``auto`` found no toolkit) and, with ``--mig-mode when-idle``, enable MIG mode on idle GPUs
    (each step a Node event). ``DriverError`` when the edits named cannot be used."""
    cdi_common = resolve(settings)
    logger.info("common CDI edits: %s", cdi_common.source)
    if cdi_common.warning:
        logger.warning("%s", cdi_common.warning)
        node_events.post(
            event_type=WARNING, reason=REASON_CDI_COMMON_EDITS_MISSING, message=cdi_common.warning
        )
    if settings.mig_mode == "when-idle":
        enable_mig_when_idle(
            backend,
            report=lambda step: node_events.post(
                event_type=step.event_type, reason=step.reason, message=step.message
            ),
        )
    return cdi_common
