"""Entry point of ``instaslice-kubelet-plugin``; wiring only: settings → backend → API → plugin → serve.

SIGTERM and SIGINT stop the plugin gracefully: sockets removed, prepared slices and the checkpoint
kept (a restarted plugin answers for them again).

``instaslice-kubelet-plugin check [flags] [--create-one]`` runs the node self-check instead
(``kubeletplugin.selfcheck``); every other invocation runs the daemon.
"""

import logging
import sys
from collections.abc import Sequence

from driver import cdi
from driver.cdi_common import CommonEdits
from driver.cluster.events import EventRecorder
from driver.cluster.kube import KubeClusterApi
from driver.daemon.run import Daemon, Program, run_daemon
from kubeletplugin.deviceplugin import Shim, ShimConfig
from kubeletplugin.deviceplugin.podresources import PodResourcesClient
from kubeletplugin.logs import FIELDS as LOG_FIELDS
from kubeletplugin.node.capacity import KUBELET_CHECKPOINT, StaleCapacityCleaner
from kubeletplugin.node.events import NodeEvents, NodeWarning
from kubeletplugin.node.setup import check_paths, prepare_node
from kubeletplugin.node.waiting import REASON_GPU_BACKEND_UNAVAILABLE, BackendWait
from kubeletplugin.plugin import KubeletPlugin, PluginConfig
from kubeletplugin.settings import PROG, REGISTRATION_WAIT_S, Settings, parse_settings
from kubeletplugin.state.recovery import read_boot_id

logger = logging.getLogger("kubeletplugin")

COMPONENT = "instaslice-kubelet-plugin"
PROGRAM = Program(name=PROG, logger=logger, log_fields=LOG_FIELDS)
REGISTRATION_GRACE_SECONDS = 30.0
"""The kubelet registers a plugin within seconds of its socket appearing; after this long without
it, a Warning on the Node says the host paths are not this kubelet's."""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["check"]:
        from kubeletplugin.selfcheck import main as check_main  # noqa: PLC0415 - subcommand

        return check_main(args[1:])
    settings = parse_settings(args)
    return run_daemon(
        PROGRAM,
        settings.daemon,
        serve=lambda daemon: _serve(settings, daemon),
        user_agent=COMPONENT,
    )


def _serve(settings: Settings, daemon: Daemon) -> int:
    """Wait for the GPU backend, prepare the node, then serve the kubelet until a signal."""
    check_paths(settings)
    api = daemon.api
    events = EventRecorder(api=api, component=COMPONENT, host=settings.node_name)
    node_events = NodeEvents(api=api, events=events, node_name=settings.node_name)
    # A node without a usable backend (no NVIDIA driver) is waited for, said on the Node.
    report = NodeWarning(node_events, reason=REASON_GPU_BACKEND_UNAVAILABLE)
    backend = BackendWait(settings=settings, report=report, stop=daemon.stop).run()
    if backend is None:
        return 0
    daemon.on_stop(backend.close)
    cdi_common = prepare_node(settings, backend=backend, node_events=node_events)
    plugin = KubeletPlugin(
        config=_plugin_config(settings, cdi_common),
        backend=backend,
        api=api,
        boot_id=read_boot_id(),
        events=events,
        majors=None if settings.gpu_backend == "emulated" else cdi.read_device_majors(),
    )
    daemon.on_stop(plugin.stop)
    shim = _shim(settings, plugin=plugin, api=api, events=events)
    cleaner = _stale_capacity_cleaner(settings, api=api)
    if cleaner is not None:
        daemon.on_stop(cleaner.stop)
        cleaner.start()
    daemon.on_stop(shim.stop)
    plugin.start()
    shim.start(serve=settings.classic_shim)
    logger.info("kubelet plugin running on node %s", settings.node_name)
    return daemon.wait()


def _plugin_config(settings: Settings, cdi_common: CommonEdits) -> PluginConfig:
    return PluginConfig(
        node_name=settings.node_name,
        plugin_registry_dir=settings.plugin_registry_dir,
        plugin_dir=settings.plugin_dir,
        cdi_root=settings.cdi_root,
        state_dir=settings.state_dir,
        emulated=settings.gpu_backend == "emulated",
        healthz_address=settings.daemon.healthz_address,
        metrics_address=settings.daemon.metrics_address,
        inventory_poll_seconds=settings.inventory_poll_seconds,
        unhealthy_taint_effect=settings.health.taint_effect,
        xid_policy=settings.health.xids,
        cdi_common=cdi_common,
        registration_wait_seconds=REGISTRATION_WAIT_S,
        registration_grace_seconds=REGISTRATION_GRACE_SECONDS,
    )


def _shim(
    settings: Settings, *, plugin: KubeletPlugin, api: KubeClusterApi, events: EventRecorder
) -> Shim:
    """With --classic-shim off the shim still releases the slices of classic pods it served before
    (a switch to scheduler mode with such pods running); it serves nothing new."""
    return Shim(
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


def _stale_capacity_cleaner(
    settings: Settings, *, api: KubeClusterApi
) -> StaleCapacityCleaner | None:
    """Shim off: the kubelet's stale nvidia.com/mig-* entries would make kube-scheduler bind
    classic pods without a slice (docs/design.md F13); keep them out of this Node's status once the
    kubelet has forgotten the device plugin (until then they make kube-scheduler wait, not fail,
    pods)."""
    if settings.classic_shim:
        return None
    return StaleCapacityCleaner(
        api=api,
        node_name=settings.node_name,
        resource_prefix=settings.classic_resource_prefix,
        kubelet_checkpoint=settings.device_plugin_dir / KUBELET_CHECKPOINT,
        pod_resources=PodResourcesClient(settings.pod_resources_socket),
    )


if __name__ == "__main__":
    sys.exit(main())
