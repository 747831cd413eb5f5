"""The opaque configuration users may attach to claims for our driver.

Users write it in a ResourceClaim (or DeviceClass) as::

    spec:
      devices:
        config:
        - requests: [gpu]            # optional; empty = every request of the claim
          opaque:
            driver: mig.instaslice.dev
            parameters:
              apiVersion: mig.instaslice.dev/v1alpha1
              kind: MigDeviceConfig
              env:
                HF_HOME: /models/cache

Only settings the kubelet plugin really applies are accepted:

- ``env``: extra environment variables for every container that receives a slice the config covers,
  injected through the claim's CDI devices. Names must be portable (``[A-Za-z_][A-Za-z0-9_]*``);
  ``NVIDIA_VISIBLE_DEVICES`` and the ``INSTASLICE_`` prefix are ours (they carry slice visibility,
  see ``driver/cdi.py``) and are refused. Values are strings (YAML ``1`` must be quoted).

Deliberately absent: a compute-instance profile (the backend creates one compute instance over the
whole GPU instance, and the published ``multiprocessors`` capacity assumes it) and sharing modes
(MPS/time-slicing: a MIG slice here belongs to one claim). Unknown fields are errors, never ignored,
so a typo cannot silently do nothing.

Errors: ``parse_opaque_config`` raises ``api.errors.ValidationFailed`` (``api/`` cannot import
``driver/``); callers in ``driver/``, ``kubeletplugin/`` and ``controller/`` wrap it into
``driver.errors.ConfigError`` with ``raise … from exc``.
"""

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, Required, TypedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from api.errors import ValidationFailed

CONFIG_API_VERSION: Final = "mig.instaslice.dev/v1alpha1"
CONFIG_KIND: Final = "MigDeviceConfig"

RESERVED_ENV_NAMES: Final = frozenset({"NVIDIA_VISIBLE_DEVICES"})
RESERVED_ENV_PREFIX: Final = "INSTASLICE_"

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class MigDeviceConfigBody(TypedDict, total=False):
    """``MigDeviceConfig`` as written in a claim or class: the JSON ``MigDeviceConfig`` reads."""

    apiVersion: Required[str]
    kind: Required[str]
    env: dict[str, str]


class MigDeviceConfig(BaseModel):
    """``parameters`` of an opaque config entry whose ``driver`` is ``mig.instaslice.dev``."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    api_version: Literal["mig.instaslice.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["MigDeviceConfig"]
    env: dict[str, str] = Field(default_factory=dict)
    """Extra container environment, applied through CDI to every slice the entry covers."""

    @field_validator("env")
    @classmethod
    def _check_env(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(
                    f"env name {name!r} is not a valid variable name "
                    "(letters, digits and '_', not starting with a digit)"
                )
            if name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIX):
                raise ValueError(
                    f"env name {name!r} is reserved: the driver sets it to make slices visible"
                )
            if "\x00" in value:
                raise ValueError(f"env {name!r} has a NUL character in its value")
        return env


def default_config() -> MigDeviceConfig:
    """The config that applies when a claim and its class give none."""
    body: MigDeviceConfigBody = {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND}
    return MigDeviceConfig.model_validate(body)


def parse_opaque_config(raw: Mapping[str, Any]) -> MigDeviceConfig:
    """Validate the ``parameters`` object of one of our opaque config entries.

    Raises ``ValidationFailed`` with one readable line per problem, e.g.
    ``unknown field 'foo' in MigDeviceConfig``.
    """
    if not isinstance(raw, Mapping):
        raise ValidationFailed(
            CONFIG_KIND, [f"{CONFIG_KIND} parameters must be an object, got {type(raw).__name__}"]
        )
    try:
        return MigDeviceConfig.model_validate(dict(raw))
    except ValidationError as exc:
        raise ValidationFailed.from_pydantic(CONFIG_KIND, exc) from exc


def merge_configs(configs: Sequence[MigDeviceConfig]) -> MigDeviceConfig:
    """Combine the entries that apply to one request, in precedence order (later wins).

    Kubernetes lists class configs before claim configs; both NVIDIA's driver and the example driver
    let later entries override earlier ones, and so do we, variable by variable.
    """
    env: dict[str, str] = {}
    for config in configs:
        env.update(config.env)
    return default_config().model_copy(update={"env": env})
