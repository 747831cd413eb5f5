"""Minor numbers of the ``/dev/nvidia-caps/nvidia-cap<N>`` nodes that grant access to MIG instances.

A container using a MIG slice needs, besides its parent GPU's ``/dev/nvidia<minor>``, the capability
device of the GPU instance and the one of the compute instance. The NVIDIA driver publishes the
whole (static) table in ``/proc/driver/nvidia-caps/mig-minors``, one ``<path> <minor>`` per line::

    config 1
    monitor 2
    gpu0/gi0/access 3
    gpu0/gi0/ci0/access 4
    …
    gpu0/gi1/access 12
    gpu0/gi1/ci0/access 13

where ``gpu<N>`` is the GPU's device minor (not its NVML index). The emulated backend uses the same
layout (``layout_minor``) so emulated instances carry plausible, distinct numbers.

For an instance that exists, the driver also writes one file per capability,
``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access`` and ``…/gi<G>/ci<C>/access``,
whose ``DeviceFileMinor: <N>`` line names the same minor — what the NVIDIA Container Toolkit reads.
The NVML backend asks that file first (``read_access_minor``) and the table second.
"""

import logging
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Final

log = logging.getLogger(__name__)

MIG_MINORS_PATH: Final = Path("/proc/driver/nvidia-caps/mig-minors")
CAPABILITIES_ROOT: Final = Path("/proc/driver/nvidia/capabilities")

# The driver's layout: two global entries, then per GPU 15 GPU instances, each 1 + 8 compute instances.
_FIRST_GPU_MINOR: Final = 3
_GI_IDS_PER_GPU: Final = 15
_CI_IDS_PER_GI: Final = 8


def parse_mig_minors(text: str) -> Mapping[str, int]:
    """``{"gpu0/gi1/access": 12, …}`` from the file's text; lines that do not parse are skipped."""
    table: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2 or not parts[1].isdigit():
            log.debug("mig-minors line %s not understood: %r", number, line)
            continue
        table[parts[0]] = int(parts[1])
    return MappingProxyType(table)


def read_mig_minors(path: Path = MIG_MINORS_PATH) -> Mapping[str, int]:
    """The table in ``path``; empty when the file does not exist or cannot be read."""
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        log.info("MIG capability minors unavailable (%s): %s", path, exc)
        return MappingProxyType({})
    return parse_mig_minors(text)


def gi_key(*, gpu_minor: int, gi_id: int) -> str:
    return f"gpu{gpu_minor}/gi{gi_id}/access"


def ci_key(*, gpu_minor: int, gi_id: int, ci_id: int) -> str:
    return f"gpu{gpu_minor}/gi{gi_id}/ci{ci_id}/access"


def layout_minor(*, gpu_minor: int, gi_id: int, ci_id: int | None = None) -> int:
    """The minor the driver's layout gives a GPU instance (``ci_id=None``) or a compute instance."""
    per_gpu = _GI_IDS_PER_GPU * (1 + _CI_IDS_PER_GI)
    base = _FIRST_GPU_MINOR + gpu_minor * per_gpu + gi_id * (1 + _CI_IDS_PER_GI)
    return base if ci_id is None else base + 1 + ci_id


def layout_text(*, gpu_count: int) -> str:
    """The file the driver would write for ``gpu_count`` GPUs (for tests and emulated hosts)."""
    lines = ["config 1", "monitor 2"]
    for gpu in range(gpu_count):
        for gi in range(_GI_IDS_PER_GPU):
            lines.append(
                f"{gi_key(gpu_minor=gpu, gi_id=gi)} {layout_minor(gpu_minor=gpu, gi_id=gi)}"
            )
            for ci in range(_CI_IDS_PER_GI):
                key = ci_key(gpu_minor=gpu, gi_id=gi, ci_id=ci)
                lines.append(f"{key} {layout_minor(gpu_minor=gpu, gi_id=gi, ci_id=ci)}")
    return "\n".join(lines) + "\n"


def access_file(root: Path, *, gpu_minor: int, gi_id: int, ci_id: int | None = None) -> Path:
    """``<root>/gpu<minor>/mig/gi<G>/access`` (``ci_id`` None) or ``…/gi<G>/ci<C>/access``."""
    gi_dir = root / f"gpu{gpu_minor}" / "mig" / f"gi{gi_id}"
    return gi_dir / "access" if ci_id is None else gi_dir / f"ci{ci_id}" / "access"


def parse_access_file(text: str) -> int | None:
    """The ``DeviceFileMinor`` of a capability ``access`` file's text; None if it has none."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
            return int(value.strip())
    return None


def read_access_minor(
    root: Path, *, gpu_minor: int, gi_id: int, ci_id: int | None = None
) -> int | None:
    """``parse_access_file`` of the instance's ``access`` file; None if it cannot be read."""
    path = access_file(root, gpu_minor=gpu_minor, gi_id=gi_id, ci_id=ci_id)
    try:
        return parse_access_file(path.read_text(encoding="ascii", errors="replace"))
    except OSError:
        return None
