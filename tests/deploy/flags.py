"""The flags of the two daemons, as the manifests may use them.

Taken from the daemons' own argument parsers (``build_parser()`` in ``<package>.__main__`` or
``<package>.settings``) where they exist; otherwise from the interface the controller and the
kubelet plugin are specified with (the literal lists below). Every flag is also an environment
variable ``INSTASLICE_<FLAG_IN_CAPS_WITH_UNDERSCORES>``.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

ENV_PREFIX = "INSTASLICE_"

# Environment variables the manifests set for other software (the NVIDIA container runtime).
FOREIGN_ENV = frozenset({"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"})

_LOG_LEVELS = frozenset({"debug", "info", "warning", "error"})
_COMMON_CHOICES: Mapping[str, Collection[str]] = {
    "--log-format": frozenset({"text", "json"}),
    "--log-level": _LOG_LEVELS,
}

_LITERAL_FLAGS: Mapping[str, frozenset[str]] = {
    "kubelet-plugin": frozenset(
        {
            "--node-name",
            "--gpu-backend",
            "--emulated-gpus",
            "--kubeconfig",
            "--plugin-registry-dir",
            "--plugin-dir",
            "--device-plugin-dir",
            "--pod-resources-socket",
            "--cdi-root",
            "--state-dir",
            "--metrics-address",
            "--healthz-address",
            "--log-level",
            "--log-format",
        }
    ),
    "controller": frozenset(
        {
            "--kubeconfig",
            "--namespace",
            "--policy",
            "--webhook-port",
            "--webhook-cert-dir",
            "--cert-mode",
            "--webhook-service",
            "--webhook-config-name",
            "--leader-elect",
            "--no-leader-elect",
            "--lease-duration",
            "--renew-deadline",
            "--retry-period",
            "--metrics-address",
            "--healthz-address",
            "--log-level",
            "--log-format",
        }
    ),
}
_LITERAL_CHOICES: Mapping[str, Mapping[str, Collection[str]]] = {
    "kubelet-plugin": {**_COMMON_CHOICES, "--gpu-backend": frozenset({"nvml", "emulated"})},
    "controller": {
        **_COMMON_CHOICES,
        "--policy": frozenset({"firstfit", "bestfit"}),
        "--cert-mode": frozenset({"self", "cert-manager", "files"}),
        "--leader-elect": frozenset({"true", "false"}),
    },
}
# Where each daemon's argument parser lives once it exists (``build_parser()``), in lookup order.
_PARSER_MODULES = {
    "kubelet-plugin": ("kubeletplugin.__main__", "kubeletplugin.settings"),
    "controller": ("controller.__main__", "controller.settings"),
}


@dataclass(frozen=True, slots=True)
class Flags:
    flags: frozenset[str]
    choices: Mapping[str, Collection[str]] = field(default_factory=dict)
    converters: Mapping[str, Callable[[str], object]] = field(default_factory=dict)
    source: str = "literal"

    def accepts(self, flag: str, value: str) -> bool:
        """Whether ``value`` is a valid value of ``flag`` as far as its choices say."""
        if flag not in self.choices:
            return True
        convert = self.converters.get(flag)
        return (convert(value) if convert else value) in self.choices[flag]


def planned(component: str) -> Flags:
    """The flags of ``instaslice-<component>``: from its parser if it has one, else the literal list."""
    for module_name in _PARSER_MODULES[component]:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        build_parser = getattr(module, "build_parser", None)
        if build_parser is not None:
            parser = build_parser()
            assert isinstance(parser, argparse.ArgumentParser)
            return from_parser(parser, source=module_name)
    return Flags(_LITERAL_FLAGS[component], _LITERAL_CHOICES[component])


def from_parser(parser: argparse.ArgumentParser, *, source: str) -> Flags:
    names: set[str] = set()
    choices: dict[str, Collection[str]] = {}
    converters: dict[str, Callable[[str], object]] = {}
    for action in parser._actions:  # argparse has no public accessor for its actions
        long_options = [o for o in action.option_strings if o.startswith("--") and o != "--help"]
        names.update(long_options)
        for option in long_options:
            if action.choices is not None:
                choices[option] = list(action.choices)
                if callable(action.type):
                    converters[option] = action.type
            elif isinstance(action, argparse.BooleanOptionalAction):
                choices[option] = ["true", "false"]
    return Flags(frozenset(names), choices, converters, source)


def env_of_flag(flag: str) -> str:
    """``--node-name`` -> ``INSTASLICE_NODE_NAME``."""
    return ENV_PREFIX + flag.removeprefix("--").upper().replace("-", "_")


def flag_of_env(name: str) -> str:
    """``INSTASLICE_NODE_NAME`` -> ``--node-name``."""
    assert name.startswith(ENV_PREFIX), f"{name} is not an InstaSlice setting"
    return "--" + name.removeprefix(ENV_PREFIX).lower().replace("_", "-")
