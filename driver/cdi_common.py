"""What every container holding one of our MIG slices needs besides the slice: the common CDI edits.

A slice's own CDI device grants ``/dev/nvidia<minor>`` and its two capability nodes (``driver.cdi``).
CUDA also needs ``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools`` and the driver's
user-space libraries in the container. Where the node's runtime is NVIDIA's in legacy mode it adds
those itself when it sees ``NVIDIA_VISIBLE_DEVICES``; where the NVIDIA Container Toolkit runs in CDI
mode, or containerd runs plain runc with CDI enabled, only what the CDI specs say is injected.

Where the edits come from (kubelet-plugin flag ``--cdi-common-edits``):

- ``toolkit``: the NVIDIA Container Toolkit's spec-wide ``containerEdits`` (library mounts, the
  ``nvidia-cdi-hook`` hooks ``update-ldcache``/``create-symlinks``/…, control device nodes) — from
  the spec of kind ``nvidia.com/gpu`` it keeps in ``/var/run/cdi`` or ``/etc/cdi``, else from
  ``nvidia-ctk cdi generate`` (which prints the spec on stdout). Libraries are never rediscovered
  by hand here: the toolkit knows the driver's files, driver root and hooks.
- ``file:PATH``: the spec-wide ``containerEdits`` of a CDI spec file (e.g. one written by
  ``nvidia-ctk cdi generate --output=PATH`` and reviewed).
- ``none``: no common edits; claim specs carry the slice's device nodes and env only.
- ``auto`` (default): ``toolkit`` when a toolkit spec or ``nvidia-ctk`` is found, else ``none``
  with a warning (the plugin posts it as a Warning event on the Node). With emulated GPUs ``auto``
  is ``none``: there is no driver to share.

In real mode the host's ``/dev/nvidiactl``, ``/dev/nvidia-uvm`` and ``/dev/nvidia-uvm-tools`` are
added (``stat``'ed: type, major and minor given) unless the source lists them already. The source's
``NVIDIA_VISIBLE_DEVICES`` (the toolkit sets ``void``) is dropped: our claim devices carry the
complete list of the container's MIG UUIDs for legacy-mode runtimes (``driver.cdi``, docs/design.md F9),
and a spec-wide ``void`` would hide them.

Where the edits go — one spec file of our kind, ``instaslice.dev-mig.json`` (CDI's
``GenerateSpecName``), holding them as its spec-wide ``containerEdits`` and one device, ``common``;
every prepared slice's CDI ids are ``[<claim device>, instaslice.dev/mig=common]``. Why not
spec-wide edits in every per-claim spec: the CDI library (``Cache.InjectDevices``) applies a spec's
spec-wide edits once per spec whose devices a container gets. A container holding two claims would
get two copies: device nodes and mounts are deduplicated by path (the library removes an entry of
the same path before adding), but hooks and env are appended, so ``update-ldcache`` and
``create-symlinks`` would run twice. With one common spec they are applied once however many claims
and slices the container holds; the ``common`` device, listed once per slice, only sets a constant
variable (``INSTASLICE_CDI_COMMON``), harmless when repeated. And library file names change with
the driver: the common spec is rewritten at every plugin start, while a claim's spec lives as long as
the claim. The spec is validated by our model (unknown fields refused, docs/design.md F8) before it is
written, atomically.
"""

import json
import logging
import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from pydantic import ValidationError

from api.cdi import (
    CdiDevice,
    CdiSpec,
    ContainerEdits,
    DeviceNode,
    minimum_required_version,
    qualified_device_name,
    spec_to_json,
)
from api.errors import ValidationFailed
from api.names import CDI_KIND
from driver.atomicfile import remove_stale_temp_files, write_atomically
from driver.errors import CdiError, ConfigError

logger = logging.getLogger(__name__)

CommonEditsMode = Literal["auto", "toolkit", "file", "none"]
COMMON_EDITS_MODES: Final = ("auto", "toolkit", "file:PATH", "none")
_SIMPLE_MODES: Final[dict[str, CommonEditsMode]] = {
    "auto": "auto",
    "toolkit": "toolkit",
    "none": "none",
}

COMMON_DEVICE_NAME: Final = "common"
COMMON_CDI_DEVICE_ID: Final = qualified_device_name(CDI_KIND, COMMON_DEVICE_NAME)
COMMON_MARKER_ENV: Final = "INSTASLICE_CDI_COMMON"
_VENDOR, _, _CLASS = CDI_KIND.partition("/")
COMMON_SPEC_FILE_NAME: Final = f"{_VENDOR}-{_CLASS}.json"
"""CDI's ``GenerateSpecName`` (``<vendor>-<class>``); claim specs are ``<vendor>-<class>_<uid>``."""

TOOLKIT_KIND: Final = "nvidia.com/gpu"
TOOLKIT_SPEC_DIRS: Final = (Path("/var/run/cdi"), Path("/etc/cdi"))
"""Where the toolkit keeps its spec: ``/var/run/cdi`` (``nvidia-cdi-refresh``, GPU operator) first,
as the CDI library gives that directory the higher priority."""
NVIDIA_CTK: Final = "nvidia-ctk"
NVIDIA_CTK_TIMEOUT_SECONDS: Final = 120.0
CONTROL_DEVICE_NAMES: Final = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
_DROPPED_ENV: Final = ("NVIDIA_VISIBLE_DEVICES",)
_SPEC_SUFFIXES: Final = (".json", ".yaml", ".yml")

RunCommand = Callable[[Sequence[str]], bytes]
"""Runs a command and returns its stdout; raises ``CdiError`` saying why it failed."""


@dataclass(frozen=True, slots=True)
class CommonEditsChoice:
    """The parsed ``--cdi-common-edits`` value."""

    mode: CommonEditsMode
    path: Path | None = None

    def __str__(self) -> str:
        return f"file:{self.path}" if self.mode == "file" else self.mode


@dataclass(frozen=True, slots=True)
class CommonEdits:
    """The resolved common edits; ``edits`` None means claim specs get no common device."""

    mode: Literal["toolkit", "file", "none"]
    source: str
    """Where the edits came from, in words (logs, the node self-check)."""
    edits: ContainerEdits | None = None
    warning: str | None = None
    """Set when ``auto`` found no toolkit: what a person should know (posted on the Node)."""

    @property
    def cdi_device_ids(self) -> tuple[str, ...]:
        """The ids every prepared slice gets after its own: the common device, if any."""
        return () if self.edits is None else (COMMON_CDI_DEVICE_ID,)


NO_COMMON_EDITS: Final = CommonEdits(mode="none", source="none")


def parse_common_edits_flag(value: str) -> CommonEditsChoice:
    """``auto``, ``toolkit``, ``none`` or ``file:PATH``; ``ValueError`` saying what is accepted."""
    text = value.strip()
    simple = _SIMPLE_MODES.get(text)
    if simple is not None:
        return CommonEditsChoice(mode=simple)
    if text.startswith("file:"):
        path = text[len("file:") :].strip()
        if not path:
            raise ValueError(
                "--cdi-common-edits file: needs a path, e.g. file:/etc/cdi/nvidia.yaml"
            )
        return CommonEditsChoice(mode="file", path=Path(path))
    raise ValueError(f"--cdi-common-edits {value!r} is not one of {', '.join(COMMON_EDITS_MODES)}")


def resolve_common_edits(
    choice: CommonEditsChoice,
    *,
    emulated: bool,
    toolkit_spec_dirs: Sequence[Path] = TOOLKIT_SPEC_DIRS,
    find_nvidia_ctk: Callable[[str], str | None] = shutil.which,
    run: RunCommand | None = None,
    dev_root: Path = Path("/dev"),
) -> CommonEdits:
    """The common edits ``choice`` names; ``ConfigError`` when an explicit source is missing or
    unusable (``auto`` never fails for a missing toolkit, it warns)."""
    if choice.mode == "none" or (choice.mode == "auto" and emulated):
        return NO_COMMON_EDITS
    if choice.mode == "file":
        assert choice.path is not None
        edits = _edits_of_file(choice.path)
        return _finish("file", f"CDI spec file {choice.path}", edits, emulated, dev_root)
    found = find_toolkit_edits(
        toolkit_spec_dirs=toolkit_spec_dirs, find_nvidia_ctk=find_nvidia_ctk, run=run
    )
    if found is None:
        if choice.mode == "toolkit":
            raise ConfigError(
                f"--cdi-common-edits toolkit: no NVIDIA Container Toolkit CDI spec (kind "
                f"{TOOLKIT_KIND}) in {', '.join(map(str, toolkit_spec_dirs))} and no "
                f"{NVIDIA_CTK} on PATH; install the toolkit, or use file:PATH or none"
            )
        return CommonEdits(
            mode="none",
            source="none (no NVIDIA Container Toolkit found)",
            warning=(
                "no NVIDIA Container Toolkit CDI spec or nvidia-ctk found: MIG slices get CDI "
                "specs with their device nodes and NVIDIA_VISIBLE_DEVICES only, without "
                "/dev/nvidiactl, /dev/nvidia-uvm and the driver libraries. CUDA works only where "
                "the node's runtime is NVIDIA's in legacy mode. Install the toolkit (nvidia-ctk cdi "
                "generate) or set --cdi-common-edits file:PATH"
            ),
        )
    source, edits = found
    return _finish("toolkit", source, edits, emulated, dev_root)


def find_toolkit_edits(
    *,
    toolkit_spec_dirs: Sequence[Path] = TOOLKIT_SPEC_DIRS,
    find_nvidia_ctk: Callable[[str], str | None] = shutil.which,
    run: RunCommand | None = None,
) -> tuple[str, ContainerEdits] | None:
    """The toolkit's spec-wide edits and where they came from; None if there is no toolkit."""
    spec_file = find_toolkit_spec(toolkit_spec_dirs)
    if spec_file is not None:
        return f"NVIDIA Container Toolkit spec {spec_file}", _edits_of_file(spec_file)
    ctk = find_nvidia_ctk(NVIDIA_CTK)
    if ctk is None:
        return None
    output = (run or run_command)([ctk, "cdi", "generate", "--format=json"])
    where = f"'{ctk} cdi generate'"
    return f"NVIDIA Container Toolkit ({where})", spec_wide_edits(_parse(output, where), where)


def find_toolkit_spec(directories: Sequence[Path]) -> Path | None:
    """The first spec file of kind ``nvidia.com/gpu`` in ``directories`` (in order, then by name);
    files that cannot be read or parsed are skipped."""
    for directory in directories:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            path = directory / name
            if not name.endswith(_SPEC_SUFFIXES) or name.startswith(".") or not path.is_file():
                continue
            try:
                data = _parse(path.read_bytes(), str(path))
            except (OSError, ConfigError):
                continue
            if data.get("kind") == TOOLKIT_KIND:
                return path
    return None


def spec_wide_edits(data: dict[str, Any], where: str) -> ContainerEdits:
    """The spec-wide ``containerEdits`` of a parsed CDI spec, validated by our model, with
    ``NVIDIA_VISIBLE_DEVICES`` dropped; ``ConfigError`` naming ``where`` and the problem."""
    raw = data.get("containerEdits")
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{where} has no spec-wide containerEdits to share with our slices")
    try:
        edits = ContainerEdits.model_validate_json(json.dumps(raw), by_name=False)
    except ValidationError as exc:
        problem = ValidationFailed.from_pydantic("containerEdits", exc)
        raise ConfigError(f"{where}: {problem}") from exc
    env = tuple(e for e in edits.env or () if e.partition("=")[0] not in _DROPPED_ENV)
    return edits.model_copy(update={"env": env or None})


def host_control_nodes(dev_root: Path = Path("/dev")) -> tuple[DeviceNode, ...]:
    """``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools`` as found on the host
    (character devices only), with type, major and minor, so the runtime need not look again."""
    nodes = []
    for name in CONTROL_DEVICE_NAMES:
        try:
            st = os.stat(dev_root / name)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            nodes.append(
                DeviceNode(
                    path=f"/dev/{name}",
                    type="c",
                    major=os.major(st.st_rdev),
                    minor=os.minor(st.st_rdev),
                )
            )
    return tuple(nodes)


def build_common_spec(common: CommonEdits) -> CdiSpec:
    """The common spec file's content; ``ConfigError`` if there are no common edits."""
    if common.edits is None:
        raise ConfigError("no common CDI edits to write (--cdi-common-edits none)")
    device = CdiDevice(
        name=COMMON_DEVICE_NAME,
        container_edits=ContainerEdits(env=(f"{COMMON_MARKER_ENV}={common.mode}",)),
    )
    try:
        draft = CdiSpec(
            cdi_version="1.1.0", kind=CDI_KIND, devices=(device,), container_edits=common.edits
        )
        version = max(
            _CDI_FLOOR, minimum_required_version(draft), key=lambda v: tuple(map(int, v.split(".")))
        )
        return draft.model_copy(update={"cdi_version": version})
    except ValidationError as exc:
        raise ConfigError(f"{ValidationFailed.from_pydantic('common CDI spec', exc)}") from exc


def common_spec_path(cdi_root: Path) -> Path:
    return cdi_root / COMMON_SPEC_FILE_NAME


def write_common_spec(cdi_root: Path, common: CommonEdits) -> Path | None:
    """Write (or replace) the common spec atomically when there are common edits; return its path.

    With none, an existing common spec is left: claims prepared under an earlier setting still name
    its device, and the runtime must still resolve it until they end.
    """
    if common.edits is None:
        return None
    path = common_spec_path(cdi_root)
    data = spec_to_json(build_common_spec(common))
    try:
        cdi_root.mkdir(parents=True, exist_ok=True)
        remove_stale_temp_files(cdi_root, target_name_prefix=COMMON_SPEC_FILE_NAME)
        write_atomically(path, data, mode=0o644)
    except OSError as exc:
        raise CdiError(f"cannot write the common CDI spec {path}: {exc}") from exc
    logger.info("wrote common CDI spec %s from %s", path, common.source)
    return path


def run_command(argv: Sequence[str]) -> bytes:
    """Run ``argv`` with a timeout; its stdout, or ``CdiError`` with its stderr's last line."""
    try:
        done = subprocess.run(  # argv is ours, no shell
            list(argv), capture_output=True, timeout=NVIDIA_CTK_TIMEOUT_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CdiError(f"running {' '.join(argv)} failed: {exc}") from exc
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        why = lines[-1] if lines else "no error output"
        raise CdiError(f"{' '.join(argv)} exited with status {done.returncode}: {why}")
    return done.stdout


# -- internals -------------------------------------------------------------------------------

_CDI_FLOOR: Final = "0.5.0"


def _edits_of_file(path: Path) -> ContainerEdits:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read CDI spec file {path}: {exc}") from exc
    return spec_wide_edits(_parse(data, str(path)), str(path))


def _parse(data: bytes, where: str) -> dict[str, Any]:
    """A CDI spec file's content (YAML, hence also JSON) as a mapping; ``ConfigError`` if not."""
    try:
        parsed = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not a JSON or YAML CDI spec: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ConfigError(f"{where} is not a CDI spec (expected a mapping at the top)")
    return parsed


def _finish(
    mode: Literal["toolkit", "file"],
    source: str,
    edits: ContainerEdits,
    emulated: bool,
    dev_root: Path,
) -> CommonEdits:
    nodes = list(edits.device_nodes or ())
    if emulated:
        # docs/design.md F10: injection stats a node given without type/major/minor; there is none.
        vague = [n.path for n in nodes if n.type is None or n.major is None or n.minor is None]
        if vague:
            raise ConfigError(
                f"{source}: device nodes {', '.join(vague)} name no type/major/minor; with "
                "emulated GPUs the host has no such nodes and containers would fail to start"
            )
    else:
        listed = {n.path for n in nodes}
        nodes += [n for n in host_control_nodes(dev_root) if n.path not in listed]
    merged = edits.model_copy(update={"device_nodes": tuple(nodes) or None})
    if merged.is_empty():
        raise ConfigError(f"{source}: its containerEdits are empty once NVIDIA_VISIBLE_DEVICES "
                          "is dropped; nothing to share")  # fmt: skip
    return CommonEdits(mode=mode, source=source, edits=merged)
