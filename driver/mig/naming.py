"""Canonical device names: one device per (GPU, profile, placement start), DNS-label safe."""

import re

_UNSAFE = re.compile(r"[^a-z0-9-]+")


def profile_label(profile: str) -> str:
    """``1g.5gb+me`` → ``1g-5gb-me``: a profile name as a DNS-label fragment."""
    return _UNSAFE.sub("-", profile.lower()).strip("-")


def device_name(*, gpu_index: int, profile: str, start: int) -> str:
    """Name of the device for ``profile`` at ``start`` on GPU ``gpu_index``, e.g. ``gpu-0-1g-5gb-3``.

    ResourceSlice device names must be DNS labels (at most 63 characters, ``[a-z0-9-]``, starting and
    ending alphanumeric); profile names contain ``.`` and ``+``, so they are rewritten.
    """
    name = f"gpu-{gpu_index}-{profile_label(profile)}-{start}"
    if len(name) > 63:
        raise ValueError(f"device name {name!r} is longer than a DNS label allows")
    return name
