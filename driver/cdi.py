"""CDI specs for prepared claims: a pure builder and a thin atomic writer.

One spec file per claim (``instaslice.dev-mig_<claimUID>.json`` in the CDI directory), kind
``instaslice.dev/mig``, one CDI device per MIG slice named ``<claimUID>-<device name>`` — the claim
UID is never reused, so a runtime's cached view of an old spec can never hand out a new slice
(advice of the kubelet-plugin helper; names starting with a digit need ``cdiVersion`` 0.5.0).

What a CDI device grants (real mode): the parent ``/dev/nvidia<minor>`` and the GPU-instance and
compute-instance capability nodes ``/dev/nvidia-caps/nvidia-cap<N>``. ``type``/``major``/``minor``
are given when ``/proc/devices`` names the majors, so the runtime creates the nodes without looking
at the host; otherwise the runtime ``stat``s the host nodes, which exist on GPU nodes. In emulated
mode the same paths are named, each with ``hostPath: /dev/null``: a node without GPUs has no
``/dev/nvidia*``, and injection ``stat``s the host path (docs/design.md F10), so the runtime creates
each node in the container with ``/dev/null``'s type and numbers — the container sees exactly the
device nodes a real slice would give it, and opening one reads nothing. Every emulated device also
sets ``INSTASLICE_EMULATED=true``. What every slice's container needs besides
(``/dev/nvidiactl``, ``/dev/nvidia-uvm*``, driver libraries, hooks) is the common spec of
``driver.cdi_common``, whose device id follows each slice's own id.

Visibility rule (docs/design.md F9: when several CDI devices injected into one container set the same
variable, the last one applied silently wins, and the order is not ours to choose):

- The device nodes are the real grant; variables only make the grant visible.
- Every device of a claim sets ``NVIDIA_VISIBLE_DEVICES`` to the *complete* comma-separated list of
  the claim's MIG UUIDs. Whichever device the runtime applies last, a container holding the whole
  claim (or the one request of a single-request claim, the usual case: ``count: N`` and shadow claims)
  sees every slice. A container that references one request of a multi-request claim is told the
  other requests' UUIDs too; it has no device nodes for them, so it cannot open them, and the
  variable never hides a slice it does hold.
- Every device also sets a variable of its own, ``INSTASLICE_MIG_UUID_<CDI device name>=<MIG UUID>``.
  Names differ per slice and claim, so nothing overwrites them: the set of ``INSTASLICE_MIG_UUID_*``
  variables in a container is exactly the slices it received, whatever claims and requests they
  came from (what the emulated end-to-end checks read).
- Cross-claim limit: a container that references *two* of our claims receives two different
  ``NVIDIA_VISIBLE_DEVICES`` values and keeps one. Nothing at prepare time can fix that — the kubelet
  prepares each claim alone, never says which container will use it, and spec-wide
  ``containerEdits`` are per spec, i.e. per claim, so they collide the same way. Such a container
  still gets every device node and every ``INSTASLICE_MIG_UUID_*`` variable; only consumers of
  ``NVIDIA_VISIBLE_DEVICES`` (the legacy NVIDIA runtime hook) see one claim. The rule for users: ask
  for several slices in one container with one claim (``count: N``); the webhook may warn about the
  other form.
- The device-plugin shim knows the container: its ``Allocate`` answers ``envs`` with the full list
  for that container (``visibility_env``), and builds its specs with
  ``visible_devices_env=False`` — CDI edits are applied after the container's env, so a CDI
  ``NVIDIA_VISIBLE_DEVICES`` would override the shim's complete list.
"""

import contextlib
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pydantic import ValidationError

from api.cdi import (
    CdiDevice,
    CdiSpec,
    ContainerEdits,
    DeviceNode,
    qualified_device_name,
    spec_from_json,
    spec_to_json,
)
from api.errors import ValidationFailed
from api.names import CDI_KIND
from driver.atomicfile import fsync_directory, remove_stale_temp_files, write_atomically
from driver.errors import CdiError, ConfigError
from driver.ids import ClaimUid, MigUuid

logger = logging.getLogger(__name__)

CDI_VERSION: Final = "0.5.0"
"""Lowest version our specs need (device names may start with a digit); containerd 1.7 reads it."""

DEFAULT_CDI_ROOT: Final = Path("/var/run/cdi")
VISIBLE_DEVICES_ENV: Final = "NVIDIA_VISIBLE_DEVICES"
SLICE_ENV_PREFIX: Final = "INSTASLICE_MIG_UUID_"
EMULATED_HOST_DEVICE: Final = "/dev/null"
"""The host device node every emulated slice's device nodes stand on (present on every Linux node)."""
EMULATED_ENV: Final = "INSTASLICE_EMULATED"
"""Set to ``true`` on emulated slices only: a workload may skip its GPU work there, and only there
(``samples/test-pod.yaml`` fails on a real node unless ``nvidia-smi`` shows exactly its slice)."""
SPEC_FILE_MODE: Final = 0o644
SPEC_FILE_SUFFIX: Final = ".json"

_VENDOR, _, _CLASS = CDI_KIND.partition("/")
SPEC_FILE_PREFIX: Final = f"{_VENDOR}-{_CLASS}_"
"""CDI's transient spec naming: ``<vendor>-<class>_<id>``."""

_CLAIM_UID = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?")
_NOT_ENV_CHAR = re.compile(r"[^A-Z0-9_]")


@dataclass(frozen=True, slots=True)
class CdiSlice:
    """One prepared MIG slice, as much as its CDI device needs to know."""

    device: str
    """Published device name, e.g. ``gpu-0-1g-5gb-3``."""
    mig_uuid: MigUuid
    gpu_minor: int
    """Minor number of the parent GPU's ``/dev/nvidia<minor>``."""
    gi_cap_minor: int
    """``DeviceFileMinor`` of ``/proc/driver/nvidia/capabilities/gpu<P>/mig/gi<G>/access``."""
    ci_cap_minor: int
    """``DeviceFileMinor`` of ``…/mig/gi<G>/ci<C>/access``."""
    env: tuple[tuple[str, str], ...] = ()
    """Extra variables from the claim's ``MigDeviceConfig`` for this slice's request."""


@dataclass(frozen=True, slots=True)
class DeviceMajors:
    """Character-device majors of the NVIDIA driver; None where unknown (then the host is stat'ed)."""

    gpu: int | None = None
    caps: int | None = None


def parse_proc_devices(text: str) -> DeviceMajors:
    """Majors from ``/proc/devices`` text: ``nvidia-frontend`` (or ``nvidia``) and ``nvidia-caps``."""
    majors: dict[str, int] = {}
    in_char_section = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith(":"):
            in_char_section = stripped == "Character devices:"
            continue
        parts = stripped.split()
        if in_char_section and len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    gpu = majors.get("nvidia-frontend", majors.get("nvidia"))
    return DeviceMajors(gpu=gpu, caps=majors.get("nvidia-caps"))


def read_device_majors(path: Path = Path("/proc/devices")) -> DeviceMajors:
    """``parse_proc_devices`` of ``path``; unknown majors if it cannot be read (no driver loaded)."""
    try:
        return parse_proc_devices(path.read_text(encoding="utf-8"))
    except OSError as exc:
        logger.info("cannot read %s (%s); CDI device nodes will name no majors", path, exc)
        return DeviceMajors()


def cdi_device_id(kind: str, name: str) -> str:
    """Fully qualified CDI device id, ``instaslice.dev/mig=<name>``, as returned to the kubelet."""
    return qualified_device_name(kind, name)


def claim_device_name(claim_uid: str, device: str) -> str:
    """The CDI device name of one slice of a claim: ``<claimUID>-<device name>``."""
    return f"{_checked_uid(claim_uid)}-{device}"


def claim_cdi_device_id(claim_uid: str, device: str) -> str:
    """The CDI id the kubelet gets for one slice of a claim (matches ``build_claim_spec``)."""
    return cdi_device_id(CDI_KIND, claim_device_name(claim_uid, device))


def slice_env_name(cdi_device_name: str) -> str:
    """``INSTASLICE_MIG_UUID_<name>`` with the name upper-cased and ``-``/``.``/``:`` as ``_``."""
    return SLICE_ENV_PREFIX + _NOT_ENV_CHAR.sub("_", cdi_device_name.upper())


def visibility_env(mig_uuids: Sequence[str]) -> dict[str, str]:
    """The visibility variable for a container holding exactly ``mig_uuids`` (used by the shim)."""
    return {VISIBLE_DEVICES_ENV: ",".join(mig_uuids)}


def build_claim_spec(
    *,
    claim_uid: str,
    slices: Sequence[CdiSlice],
    emulated: bool,
    majors: DeviceMajors | None = None,
    visible_devices_env: bool = True,
) -> CdiSpec:
    """The CDI spec of one claim: one device per slice, visibility per the module docstring.

    Raises ``ConfigError`` for an empty claim, a bad claim UID or names CDI would refuse.
    """
    if not slices:
        raise ConfigError(f"claim {claim_uid}: no slices to write a CDI spec for")
    majors = majors or DeviceMajors()
    all_uuids = ",".join(s.mig_uuid for s in slices)
    devices = []
    try:
        for cdi_slice in slices:
            name = claim_device_name(claim_uid, cdi_slice.device)
            env = [f"{key}={value}" for key, value in cdi_slice.env]
            if visible_devices_env:
                env.append(f"{VISIBLE_DEVICES_ENV}={all_uuids}")
            env.append(f"{slice_env_name(name)}={cdi_slice.mig_uuid}")
            if emulated:
                env.append(f"{EMULATED_ENV}=true")
            nodes = (
                _emulated_device_nodes(cdi_slice) if emulated else _device_nodes(cdi_slice, majors)
            )
            edits = ContainerEdits(env=tuple(env), device_nodes=nodes)
            devices.append(CdiDevice(name=name, container_edits=edits))
        return CdiSpec(cdi_version=CDI_VERSION, kind=CDI_KIND, devices=tuple(devices))
    except ValidationError as exc:
        raise ConfigError(
            f"claim {claim_uid}: {ValidationFailed.from_pydantic('CDI spec', exc)}"
        ) from exc


def _char_node(path: str, major: int | None, minor: int) -> DeviceNode:
    if major is None:
        return DeviceNode(path=path)
    return DeviceNode(path=path, type="c", major=major, minor=minor)


def _device_nodes(cdi_slice: CdiSlice, majors: DeviceMajors) -> tuple[DeviceNode, ...]:
    return (
        _char_node(f"/dev/nvidia{cdi_slice.gpu_minor}", majors.gpu, cdi_slice.gpu_minor),
        _char_node(
            f"/dev/nvidia-caps/nvidia-cap{cdi_slice.gi_cap_minor}",
            majors.caps,
            cdi_slice.gi_cap_minor,
        ),
        _char_node(
            f"/dev/nvidia-caps/nvidia-cap{cdi_slice.ci_cap_minor}",
            majors.caps,
            cdi_slice.ci_cap_minor,
        ),
    )


def _emulated_device_nodes(cdi_slice: CdiSlice) -> tuple[DeviceNode, ...]:
    """A real slice's device node paths, each created from the host's ``/dev/null``."""
    return tuple(
        DeviceNode(path=node.path, host_path=EMULATED_HOST_DEVICE)
        for node in _device_nodes(cdi_slice, DeviceMajors())
    )


def spec_path(cdi_root: Path, claim_uid: str) -> Path:
    return cdi_root / f"{SPEC_FILE_PREFIX}{_checked_uid(claim_uid)}{SPEC_FILE_SUFFIX}"


def write_spec(cdi_root: Path, spec: CdiSpec, *, claim_uid: str) -> Path:
    """Write (or replace) the claim's spec file atomically; return its path."""
    path = spec_path(cdi_root, claim_uid)
    try:
        cdi_root.mkdir(parents=True, exist_ok=True)
        write_atomically(path, spec_to_json(spec), mode=SPEC_FILE_MODE)
    except OSError as exc:
        raise CdiError(f"cannot write CDI spec {path}: {exc}") from exc
    logger.debug("wrote CDI spec %s", path)
    return path


def read_spec(cdi_root: Path, claim_uid: str) -> CdiSpec | None:
    """The claim's spec as written, None if there is none; ``CdiError`` if unreadable or invalid."""
    path = spec_path(cdi_root, claim_uid)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CdiError(f"cannot read CDI spec {path}: {exc}") from exc
    try:
        return spec_from_json(data)
    except ValidationFailed as exc:
        raise CdiError(f"CDI spec {path} is invalid: {exc}") from exc


def remove_spec(cdi_root: Path, claim_uid: str) -> bool:
    """Remove the claim's spec; False if it was already gone (idempotent)."""
    path = spec_path(cdi_root, claim_uid)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise CdiError(f"cannot remove CDI spec {path}: {exc}") from exc
    with contextlib.suppress(OSError):
        fsync_directory(cdi_root)
    logger.debug("removed CDI spec %s", path)
    return True


def list_specs(cdi_root: Path) -> list[ClaimUid]:
    """Claim UIDs that have a spec file of ours in ``cdi_root`` (for recovery and orphan cleanup)."""
    try:
        names = os.listdir(cdi_root)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CdiError(f"cannot list CDI directory {cdi_root}: {exc}") from exc
    uids = []
    for name in names:
        if name.startswith(SPEC_FILE_PREFIX) and name.endswith(SPEC_FILE_SUFFIX):
            uid = name[len(SPEC_FILE_PREFIX) : -len(SPEC_FILE_SUFFIX)]
            if _CLAIM_UID.fullmatch(uid):
                uids.append(ClaimUid(uid))
    return sorted(uids)


def remove_stale_temp_specs(cdi_root: Path) -> int:
    """Remove temporary files a crash during ``write_spec`` left; return how many."""
    if not cdi_root.is_dir():
        return 0
    return len(remove_stale_temp_files(cdi_root, target_name_prefix=SPEC_FILE_PREFIX))


def _checked_uid(claim_uid: str) -> str:
    if not _CLAIM_UID.fullmatch(claim_uid):
        raise ConfigError(
            f"claim UID {claim_uid!r} cannot name a CDI device or file "
            "(expected letters, digits and '-', at most 64 characters)"
        )
    return claim_uid
