"""What the container runtime does with CDI device names, as far as a test can observe it.

containerd/CRI-O look each qualified name (``vendor/class=name``) up in the spec files of the CDI
directories; an unknown name fails the container start (``CreateContainerError``). For each device
the spec-wide edits (once per spec) and then the device's edits are appended; environment entries
are appended to the process environment, so when two devices set one variable the last one wins
(docs/design.md F9). Only ``env`` is modelled — device nodes and mounts have nothing to act on here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml


class CdiResolutionError(Exception):
    """A CDI device name does not resolve (the runtime's "unresolvable CDI devices")."""


def _load(path: Path) -> dict[str, Any] | None:
    text = path.read_text()
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    return data if isinstance(data, dict) else None


def _env(edits: Any) -> list[str]:
    if not isinstance(edits, dict):
        return []
    return [str(e) for e in edits.get("env") or []]


class CdiResolver:
    def __init__(self, directories: Sequence[Path]) -> None:
        self._directories = list(directories)

    def _devices(self) -> dict[str, tuple[str, list[str], list[str]]]:
        """Qualified name -> (spec file, spec-wide env, device env); later files win."""
        found: dict[str, tuple[str, list[str], list[str]]] = {}
        for directory in self._directories:
            if not directory.is_dir():
                continue
            for path in sorted(directory.iterdir()):
                if path.suffix not in (".json", ".yaml") or path.name.startswith("."):
                    continue
                try:
                    spec = _load(path)
                except (OSError, ValueError, yaml.YAMLError):
                    continue  # a broken spec is skipped (the runtime reports it)
                if spec is None:
                    continue
                kind = str(spec.get("kind") or "")
                common = _env(spec.get("containerEdits"))
                for device in spec.get("devices") or []:
                    if isinstance(device, dict) and device.get("name"):
                        name = f"{kind}={device['name']}"
                        found[name] = (str(path), common, _env(device.get("containerEdits")))
        return found

    def environment(self, names: Iterable[str]) -> list[str]:
        """The ``KEY=VALUE`` entries injecting ``names`` appends, in order."""
        names = list(names)
        devices = self._devices()
        entries: list[str] = []
        seen_specs: set[str] = set()
        missing = [n for n in names if n not in devices]
        if missing:
            raise CdiResolutionError(f"unresolvable CDI devices {', '.join(missing)}")
        for name in names:
            spec_file, common, own = devices[name]
            if spec_file not in seen_specs:
                seen_specs.add(spec_file)
                entries += common
            entries += own
        return entries
