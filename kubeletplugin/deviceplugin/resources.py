"""Which extended resource serves which MIG profile, and on which socket (pure).

Mapping (one resource per MIG profile the node's GPUs report)::

    profile        resource name (default prefix)   plugin socket (in the device-plugin dir)
    1g.5gb         nvidia.com/mig-1g.5gb            instaslice-1g-5gb.sock
    1g.5gb+me      nvidia.com/mig-1g.5gb-me         instaslice-1g-5gb-me.sock
    7g.40gb        nvidia.com/mig-7g.40gb           instaslice-7g-40gb.sock

- The resource name is ``<prefix><profile>`` with every character an extended-resource name may not
  hold (``+`` and anything outside ``[A-Za-z0-9._-]``) spelled ``-``: the part after ``/`` must be a
  qualified name (alphanumerics, ``-``, ``_``, ``.``; at most 63 characters; starting and ending
  alphanumeric). This is ``api.names.classic_resource_name`` — the webhook and the controller read
  pods' requests with the same function — and what NVIDIA's device plugin serves
  (``nvidia.com/mig-1g.5gb-me``).
- The prefix is configurable (default ``nvidia.com/mig-``): it must be ``<DNS subdomain>/<start>``.
- The socket name is ``instaslice-<profile as a DNS label>.sock``: the kubelet takes it as the
  registration ``endpoint``, a bare file name in its device-plugin directory.
- Two profiles that map to the same resource name (e.g. a GPU reporting both ``1g.24gb+me`` and
  ``1g.24gb-me``) cannot both be served: the first in name order is, the other is refused with a
  warning naming both. The same holds for a name that is not valid at all.
"""

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from api.names import CLASSIC_RESOURCE_PREFIX
from driver.errors import ConfigError
from driver.mig.naming import profile_label

logger = logging.getLogger(__name__)

DEFAULT_RESOURCE_PREFIX: Final = CLASSIC_RESOURCE_PREFIX
SOCKET_PREFIX: Final = "instaslice-"
SOCKET_SUFFIX: Final = ".sock"
MAX_NAME_PART: Final = 63

_INVALID_NAME_CHARS: Final = re.compile(r"[^A-Za-z0-9._-]")
_QUALIFIED_NAME: Final = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


@dataclass(frozen=True, slots=True)
class ResourceSpec:
    """One served extended resource."""

    profile: str
    """MIG profile name as the GPU reports it, e.g. ``1g.5gb+me``."""
    resource_name: str
    """Extended resource, e.g. ``nvidia.com/mig-1g.5gb-me``."""
    socket_name: str
    """File name of the plugin's socket in the device-plugin directory."""
    device_id_prefix: str
    """Device-plugin ids of this resource are ``<prefix><n>``, e.g. ``1g-5gb-me-0``."""


def check_prefix(prefix: str) -> str:
    """``prefix`` if it can start an extended-resource name (``domain/`` + name start); else
    ``ConfigError`` saying why."""
    domain, slash, start = prefix.partition("/")
    if not slash or not _DNS_SUBDOMAIN.match(domain) or len(domain) > 253:
        raise ConfigError(
            f"resource prefix {prefix!r} must be '<DNS subdomain>/<name start>', e.g. 'nvidia.com/mig-'"
        )
    if start and (_INVALID_NAME_CHARS.search(start) or not start[0].isalnum()):
        raise ConfigError(
            f"resource prefix {prefix!r}: the part after '/' may hold only alphanumerics, '-', "
            "'_' and '.', and must start with an alphanumeric"
        )
    return prefix


def resource_name(profile: str, *, prefix: str = DEFAULT_RESOURCE_PREFIX) -> str:
    """``<prefix><profile>`` with characters invalid in a resource name spelled ``-``.

    For every profile name NVIDIA uses (digits, letters, ``.``, ``+``) this equals
    ``api.names.classic_resource_name``. ``ConfigError`` if the result is still not a valid name.
    """
    name = prefix + _INVALID_NAME_CHARS.sub("-", profile)
    part = name.partition("/")[2]
    if not part or len(part) > MAX_NAME_PART or not _QUALIFIED_NAME.match(part):
        raise ConfigError(
            f"MIG profile {profile!r} gives extended-resource name {name!r}, which is not valid "
            f"(the part after '/' must be a qualified name of at most {MAX_NAME_PART} characters)"
        )
    return name


def resource_spec(profile: str, *, prefix: str = DEFAULT_RESOURCE_PREFIX) -> ResourceSpec:
    label = profile_label(profile)
    return ResourceSpec(
        profile=profile,
        resource_name=resource_name(profile, prefix=prefix),
        socket_name=f"{SOCKET_PREFIX}{label}{SOCKET_SUFFIX}",
        device_id_prefix=f"{label}-",
    )


def resource_specs(
    profiles: Iterable[str], *, prefix: str = DEFAULT_RESOURCE_PREFIX
) -> tuple[ResourceSpec, ...]:
    """One spec per distinct profile, in name order; profiles whose resource name, socket or device
    ids would clash with an earlier one, or whose name is invalid, are left out with a warning."""
    specs: list[ResourceSpec] = []
    taken: dict[str, str] = {}
    for profile in sorted(set(profiles)):
        try:
            spec = resource_spec(profile, prefix=prefix)
        except ConfigError as exc:
            logger.warning("not serving MIG profile %s: %s", profile, exc)
            continue
        keys = (spec.resource_name, spec.socket_name, spec.device_id_prefix)
        clash = next((taken[key] for key in keys if key in taken), None)
        if clash is not None:
            logger.warning(
                "not serving MIG profile %s: it maps to the same resource, socket or device ids "
                "as profile %s (%s)",
                profile,
                clash,
                spec.resource_name,
            )
            continue
        for key in keys:
            taken[key] = profile
        specs.append(spec)
    return tuple(specs)
