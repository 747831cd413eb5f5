"""Entry point of ``instaslice-kubelet-plugin``; wiring only: settings → backend → API → plugin → serve.

SIGTERM and SIGINT stop the plugin gracefully: sockets removed, prepared slices and the checkpoint
kept (a restarted plugin answers for them again).
"""

import logging
import sys
from collections.abc import Sequence

from driver import cdi
from driver.cluster.events import EventRecorder
from driver.cluster.kube import connect
from driver.cluster.throttle import ClientSettings
from driver.daemon.logs import configure_logging
from driver.daemon.signals import stop_on_signals
from driver.errors import DriverError
from driver.gpu.backend import GpuBackend
from kubeletplugin.deviceplugin import Shim, ShimConfig
from kubeletplugin.logs import FIELDS as LOG_FIELDS
from kubeletplugin.plugin import KubeletPlugin, PluginConfig
from kubeletplugin.recovery import read_boot_id
from kubeletplugin.settings import Settings, parse_settings

logger = logging.getLogger("kubeletplugin")

COMPONENT = "instaslice-kubelet-plugin"


def build_backend(settings: Settings) -> GpuBackend:
    if settings.gpu_backend == "emulated":
        from driver.gpu.emulated import EmulatedGpuBackend  # noqa: PLC0415 - chosen at run time

        settings.emulated_state_file.parent.mkdir(parents=True, exist_ok=True)
        return EmulatedGpuBackend(
            node_name=settings.node_name,
            spec=settings.emulated_gpus or "",
            state_file=settings.emulated_state_file,
        )
    from driver.gpu.nvml import NvmlGpuBackend  # noqa: PLC0415 - imports pynvml only when chosen

    return NvmlGpuBackend()


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(argv)
    configure_logging(level=settings.log_level, log_format=settings.log_format, fields=LOG_FIELDS)
    stop = stop_on_signals(logger=logger)
    try:
        backend = build_backend(settings)
    except DriverError as exc:
        logger.error("cannot start the GPU backend: %s", exc)
        return 1
    try:
        api = connect(
            kubeconfig=settings.kubeconfig,
            url=settings.kube_api_url,
            settings=ClientSettings(
                qps=settings.kube_api_qps,
                burst=settings.kube_api_burst,
                user_agent=COMPONENT,
            ),
        )
    except DriverError as exc:
        logger.error("cannot configure the Kubernetes client: %s", exc)
        backend.close()
        return 1
    events = EventRecorder(api=api, component=COMPONENT, host=settings.node_name)
    try:
        plugin = KubeletPlugin(
            config=PluginConfig(
                node_name=settings.node_name,
                plugin_registry_dir=settings.plugin_registry_dir,
                plugin_dir=settings.plugin_dir,
                cdi_root=settings.cdi_root,
                state_dir=settings.state_dir,
                emulated=settings.gpu_backend == "emulated",
                healthz_address=settings.healthz_address,
                metrics_address=settings.metrics_address,
                inventory_poll_seconds=settings.inventory_poll_seconds,
                unhealthy_taint_effect=settings.health.taint_effect,
                xid_policy=settings.health.xids,
            ),
            backend=backend,
            api=api,
            boot_id=read_boot_id(),
            events=events,
            majors=None if settings.gpu_backend == "emulated" else cdi.read_device_majors(),
        )
    except DriverError as exc:
        logger.error("cannot set up the kubelet plugin: %s", exc)
        backend.close()
        api.close()
        return 1
    shim = (
        Shim(
            config=ShimConfig(
                node_name=settings.node_name,
                device_plugin_dir=settings.device_plugin_dir,
                pod_resources_socket=settings.pod_resources_socket,
                resource_prefix=settings.classic_resource_prefix,
            ),
            state=plugin.state,
            checkpoint=plugin.store,
            api=api,
            inventory=lambda: plugin.publisher.inventory,
            events=events,
        )
        if settings.classic_shim
        else None
    )
    try:
        plugin.start()
        if shim is not None:
            shim.start()
        logger.info("kubelet plugin running on node %s", settings.node_name)
        stop.wait()
        return 0
    except DriverError as exc:
        logger.error("kubelet plugin failed: %s", exc)
        return 1
    finally:
        if shim is not None:
            shim.stop()
        plugin.stop()
        backend.close()
        api.close()


if __name__ == "__main__":
    sys.exit(main())
