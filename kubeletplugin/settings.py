"""Command-line flags of ``instaslice-kubelet-plugin``; every flag can also come from the environment.

A DaemonSet sets most of these through env vars (``INSTASLICE_<FLAG>``, e.g. ``INSTASLICE_NODE_NAME``;
the node name is also read from ``NODE_NAME``, the downward-API name most charts use). A flag given on
the command line wins over its env var. Bad values end the process with a one-line CLI error and exit
status 2, before anything is started. The flags every daemon has (API server, ``/metrics`` and probe
addresses, logging) come from ``driver.daemon.settings``; this module declares the plugin's own.
"""

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from driver.cdi_common import CommonEditsChoice, parse_common_edits_flag
from driver.daemon import flags
from driver.daemon.flags import add_flag, add_number_flag, env_var
from driver.daemon.parser import DaemonParser
from driver.daemon.settings import DaemonDefaults, DaemonSettings, add_daemon_flags, daemon_settings
from driver.errors import ConfigError
from driver.gpu.emulated import parse_gpu_spec
from kubeletplugin.health.settings import HealthSettings, add_health_flags, health_settings

PROG: Final = "instaslice-kubelet-plugin"
NODE_NAME_FALLBACK_ENV: Final = "NODE_NAME"

GPU_BACKENDS: Final = ("nvml", "emulated")

DEFAULT_PLUGIN_REGISTRY_DIR: Final = "/var/lib/kubelet/plugins_registry"
DEFAULT_PLUGIN_DIR: Final = "/var/lib/kubelet/plugins/mig.instaslice.dev"
DEFAULT_DEVICE_PLUGIN_DIR: Final = "/var/lib/kubelet/device-plugins"
DEFAULT_POD_RESOURCES_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_CDI_ROOT: Final = "/var/run/cdi"
DEFAULT_STATE_DIR: Final = "/var/lib/instaslice"
DEFAULTS: Final = DaemonDefaults(
    metrics_address=":9400",
    healthz_address=":9401",
    kube_api_qps=50.0,
    kube_api_burst=100,
)
DEFAULT_INVENTORY_POLL_SECONDS: Final = 30.0
MIN_INVENTORY_POLL_SECONDS: Final = 0.1
MAX_INVENTORY_POLL_SECONDS: Final = 3600.0
REGISTRATION_WAIT_S: Final = 10.0
"""How long the plugin waits for the kubelet to register it before publishing its ResourceSlices
(``kubeletplugin.plugin``): the kubelet's plugin watcher registers a new socket within a second."""
EMULATED_STATE_FILE_NAME: Final = "emulated-gpus.json"
CLASSIC_SHIM_MODES: Final = ("on", "off")
MIG_MODES: Final = ("never", "when-idle")
DEFAULT_CDI_COMMON_EDITS: Final = "auto"
AUTO_COMMON_EDITS: Final = CommonEditsChoice(mode="auto")
DEFAULT_CLASSIC_RESOURCE_PREFIX: Final = "nvidia.com/mig-"
_RESOURCE_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*)?$")


@dataclass(frozen=True, slots=True)
class Settings:
    """The validated configuration of one plugin process."""

    node_name: str
    gpu_backend: str
    emulated_gpus: str | None
    emulated_state_file: Path
    daemon: DaemonSettings
    """The API server, ``/metrics`` and probe addresses, logging: the flags every daemon has."""
    plugin_registry_dir: Path
    plugin_dir: Path
    device_plugin_dir: Path
    pod_resources_socket: Path
    cdi_root: Path
    state_dir: Path
    inventory_poll_seconds: float
    classic_shim: bool
    """Serve classic ``<prefix><profile>`` extended resources through the device-plugin API."""
    classic_resource_prefix: str
    health: HealthSettings = field(default_factory=HealthSettings)
    """Unhealthy-GPU taint effect and which XIDs count (``health_settings``)."""
    cdi_common_edits: CommonEditsChoice = AUTO_COMMON_EDITS
    """Where the edits every slice's container shares come from (``driver.cdi_common``)."""
    mig_mode: str = "never"
    """``when-idle``: enable MIG mode on GPUs that have it off and run no process
    (``kubeletplugin.node.migmode``); ``never``: MIG mode is only read."""


def build_parser() -> argparse.ArgumentParser:
    """The parser of every flag; defaults here are the built-in ones (env vars applied on parse)."""
    parser = DaemonParser(
        prog=PROG,
        description="InstaSlice node agent: DRA kubelet plugin that creates MIG slices on demand.",
    )
    add_daemon_flags(parser, defaults=DEFAULTS)
    _add_node_flags(parser)
    _add_path_flags(parser)
    _add_classic_flags(parser)
    add_health_flags(parser)
    _add_setup_flags(parser)
    return parser


def _add_node_flags(parser: argparse.ArgumentParser) -> None:
    """This node, its GPU backend, and how often its GPUs are read."""
    add_flag(
        parser,
        "--node-name",
        help_text="name of this Node (also read from NODE_NAME)",
        default=None,
    )
    add_flag(parser, "--gpu-backend", help_text="GPU backend", choices=GPU_BACKENDS, default="nvml")
    add_flag(
        parser,
        "--emulated-gpus",
        help_text="emulated GPUs, e.g. 2xA100-40GB or A100-40GB,H100-80GB (emulated backend only)",
        default=None,
    )
    add_flag(
        parser,
        "--emulated-state-file",
        help_text=f"file holding emulated MIG state (default <state-dir>/{EMULATED_STATE_FILE_NAME})",
        default=None,
    )
    add_number_flag(
        parser,
        "--inventory-poll-seconds",
        help_text="how often the GPU inventory is re-read and republished",
        default=DEFAULT_INVENTORY_POLL_SECONDS,
        low=MIN_INVENTORY_POLL_SECONDS,
        high=MAX_INVENTORY_POLL_SECONDS,
    )


def _add_path_flags(parser: argparse.ArgumentParser) -> None:
    """The kubelet's directories and sockets, and our own CDI and state directories."""
    add_flag(
        parser,
        "--plugin-registry-dir",
        help_text="kubelet plugin registry directory",
        default=DEFAULT_PLUGIN_REGISTRY_DIR,
    )
    add_flag(
        parser,
        "--plugin-dir",
        help_text="directory of the DRA socket and the checkpoint",
        default=DEFAULT_PLUGIN_DIR,
    )
    add_flag(
        parser,
        "--device-plugin-dir",
        help_text="kubelet device-plugin directory (classic-resource shim)",
        default=DEFAULT_DEVICE_PLUGIN_DIR,
    )
    add_flag(
        parser,
        "--pod-resources-socket",
        help_text="kubelet pod-resources socket (classic-resource shim)",
        default=DEFAULT_POD_RESOURCES_SOCKET,
    )
    add_flag(
        parser, "--cdi-root", help_text="directory for CDI spec files", default=DEFAULT_CDI_ROOT
    )
    add_flag(
        parser, "--state-dir", help_text="directory for node-local state", default=DEFAULT_STATE_DIR
    )


def _add_classic_flags(parser: argparse.ArgumentParser) -> None:
    """The device-plugin shim for classic nvidia.com/mig-<profile> requests."""
    add_flag(
        parser,
        "--classic-shim",
        help_text="serve classic nvidia.com/mig-<profile> requests through the device-plugin API "
        "(off in scheduler mode, where DeviceClasses carry extendedResourceName: then the plugin "
        "keeps <prefix>* out of its Node's status and only releases slices it served before)",
        choices=CLASSIC_SHIM_MODES,
        default="on",
    )
    add_flag(
        parser,
        "--classic-resource-prefix",
        help_text="extended-resource name prefix of the classic shim; '+' in profiles becomes '-'",
        default=DEFAULT_CLASSIC_RESOURCE_PREFIX,
    )


def _add_setup_flags(parser: argparse.ArgumentParser) -> None:
    """How the node is prepared: the edits every slice's container shares, and MIG mode."""
    add_flag(
        parser,
        "--cdi-common-edits",
        help_text="edits every slice's container shares (/dev/nvidiactl, /dev/nvidia-uvm*, driver "
        "libraries, hooks): auto (the NVIDIA Container Toolkit's when found, else none with a "
        "Warning event on the Node), toolkit, file:PATH (a CDI spec's containerEdits) or none",
        default=DEFAULT_CDI_COMMON_EDITS,
    )
    add_flag(
        parser,
        "--mig-mode",
        help_text="never: only read MIG mode; when-idle: enable MIG on a GPU that has it off and "
        "runs no process (resetting it when needed), reporting each step as a Node event",
        choices=MIG_MODES,
        default="never",
    )


def parse_settings(
    argv: Sequence[str] | None = None, *, environ: Mapping[str, str] | None = None
) -> Settings:
    """Flags from ``argv`` over env vars over built-in defaults; exits with status 2 if invalid."""
    parser = build_parser()
    args = flags.parse_args_with_env(
        parser,
        argv,
        environ=os.environ if environ is None else environ,
        fallbacks={"node_name": NODE_NAME_FALLBACK_ENV},
    )
    return _validate(parser, args)


def _check_node_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The node's name, the classic shim's resource prefix, and the emulated backend's GPUs."""
    if not args.node_name:
        parser.error(f"--node-name is required (or env {env_var('node_name')} / NODE_NAME)")
    flags.check_names(parser, args, subdomains=("node_name",))
    if not _RESOURCE_PREFIX.match(args.classic_resource_prefix):
        parser.error(
            f"--classic-resource-prefix {args.classic_resource_prefix!r} is not '<domain>/<name-prefix>' "
            "(e.g. nvidia.com/mig-)"
        )
    if args.gpu_backend != "emulated":
        return
    if not args.emulated_gpus:
        parser.error("--gpu-backend emulated needs --emulated-gpus, e.g. 2xA100-40GB")
    try:
        parse_gpu_spec(args.emulated_gpus)
    except ConfigError as exc:
        parser.error(f"--emulated-gpus: {exc}")


def _validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Settings:
    flags.check_choices(
        parser,
        args,
        (
            ("gpu_backend", GPU_BACKENDS),
            ("classic_shim", CLASSIC_SHIM_MODES),
            ("mig_mode", MIG_MODES),
        ),
    )
    try:
        common_edits = parse_common_edits_flag(str(args.cdi_common_edits))
    except ValueError as exc:
        parser.error(str(exc))
    _check_node_flags(parser, args)
    state_dir = Path(args.state_dir)
    emulated_state = (
        Path(args.emulated_state_file)
        if args.emulated_state_file
        else state_dir / EMULATED_STATE_FILE_NAME
    )
    return Settings(
        node_name=str(args.node_name),
        gpu_backend=str(args.gpu_backend),
        emulated_gpus=args.emulated_gpus or None,
        emulated_state_file=emulated_state,
        daemon=daemon_settings(parser, args, defaults=DEFAULTS),
        plugin_registry_dir=Path(args.plugin_registry_dir),
        plugin_dir=Path(args.plugin_dir),
        device_plugin_dir=Path(args.device_plugin_dir),
        pod_resources_socket=Path(args.pod_resources_socket),
        cdi_root=Path(args.cdi_root),
        state_dir=state_dir,
        inventory_poll_seconds=float(args.inventory_poll_seconds),
        classic_shim=args.classic_shim == "on",
        classic_resource_prefix=str(args.classic_resource_prefix),
        health=health_settings(parser, args),
        cdi_common_edits=common_edits,
        mig_mode=str(args.mig_mode),
    )
