"""A model of the CDI (Container Device Interface) specs the kubelet plugin writes.

Container runtimes load every file in the CDI directory with the CDI library
(``tags.cncf.io/container-device-interface`` v1.1.0 in containerd and CRI-O). That loader is strict:
an unknown field, a bad ``kind``, a bad device name or a ``cdiVersion`` lower than the features used
need makes the whole file fail to load (docs/design.md F8 and F23).
So the rules are validators here and a spec that does not satisfy them cannot be built at all.

The model covers the subset of the CDI schema we write, plus ``additionalGids`` (0.7.0), which the
NVIDIA Container Toolkit's common edits may carry and which we copy from them; there are no
annotations, netDevices or intelRdt (each would also raise the required ``cdiVersion``, and a
toolkit spec using them is refused with the field named). Field aliases are the schema's
camelCase names; ``spec_to_json`` serialises by alias and leaves out unset fields, so what is written
never holds a field the schema lacks.
"""

import re
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from api.errors import ValidationFailed

KNOWN_CDI_VERSIONS: Final = (
    "0.1.0",
    "0.2.0",
    "0.3.0",
    "0.4.0",
    "0.5.0",
    "0.6.0",
    "0.7.0",
    "0.8.0",
    "1.0.0",
    "1.1.0",
)
"""Versions CDI v1.1.0 accepts; a runtime with an older CDI library knows a prefix of this list."""

LOWEST_CDI_VERSION: Final = "0.3.0"
"""The CDI library's ``MinimumRequiredVersion`` never answers less than this."""

HOOK_NAMES: Final = frozenset(
    {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}
)

_KIND_PART = re.compile(r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?")
_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


class _CdiModel(BaseModel):
    model_config = ConfigDict(
        strict=True, extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


class DeviceNode(_CdiModel):
    """A device node to create in the container; with ``type``/``major``/``minor`` no host ``stat``."""

    path: str
    host_path: str | None = None
    type: Literal["b", "c", "u", "p"] | None = None
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None
    permissions: str | None = None
    uid: int | None = None
    gid: int | None = None

    @field_validator("path")
    @classmethod
    def _path_not_empty(cls, path: str) -> str:
        if not path:
            raise ValueError("device node path must not be empty")
        return path

    @field_validator("permissions")
    @classmethod
    def _permissions_rwm(cls, permissions: str | None) -> str | None:
        if permissions is not None and set(permissions) - set("rwm"):
            raise ValueError(f"permissions {permissions!r} may only use the letters r, w and m")
        return permissions


class Mount(_CdiModel):
    host_path: str
    container_path: str
    options: tuple[str, ...] | None = None
    type: str | None = None

    @model_validator(mode="after")
    def _paths_not_empty(self) -> "Mount":
        if not self.host_path or not self.container_path:
            raise ValueError("a mount needs a non-empty hostPath and containerPath")
        return self


class Hook(_CdiModel):
    hook_name: str
    path: str
    args: tuple[str, ...] | None = None
    env: tuple[str, ...] | None = None
    timeout: int | None = None

    @model_validator(mode="after")
    def _known_hook(self) -> "Hook":
        if self.hook_name not in HOOK_NAMES:
            raise ValueError(f"hook name {self.hook_name!r} is not one of {sorted(HOOK_NAMES)}")
        if not self.path:
            raise ValueError("a hook needs a non-empty path")
        return self


class ContainerEdits(_CdiModel):
    env: tuple[str, ...] | None = None
    device_nodes: tuple[DeviceNode, ...] | None = None
    mounts: tuple[Mount, ...] | None = None
    hooks: tuple[Hook, ...] | None = None
    additional_gids: tuple[int, ...] | None = None
    """Extra group ids for the container's process (CDI 0.7.0; the NVIDIA toolkit may write them)."""

    @field_validator("env")
    @classmethod
    def _env_has_name(cls, env: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for entry in env or ():
            if entry.find("=") <= 0:
                raise ValueError(f"env entry {entry!r} must look like NAME=value")
        return env

    def is_empty(self) -> bool:
        return not (
            self.env or self.device_nodes or self.mounts or self.hooks or self.additional_gids
        )


class CdiDevice(_CdiModel):
    name: str
    container_edits: ContainerEdits

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if not _DEVICE_NAME.fullmatch(name):
            raise ValueError(
                f"CDI device name {name!r} must start and end with a letter or digit and use only "
                "letters, digits, '_', '.', ':' and '-'"
            )
        return name

    @model_validator(mode="after")
    def _edits_not_empty(self) -> "CdiDevice":
        if self.container_edits.is_empty():
            raise ValueError(f"CDI device {self.name!r} has empty containerEdits")
        return self


class CdiSpec(_CdiModel):
    cdi_version: str
    kind: str
    devices: tuple[CdiDevice, ...]
    container_edits: ContainerEdits | None = None

    @field_validator("kind")
    @classmethod
    def _valid_kind(cls, kind: str) -> str:
        split_kind(kind)
        return kind

    @model_validator(mode="after")
    def _consistent(self) -> "CdiSpec":
        if self.cdi_version not in KNOWN_CDI_VERSIONS:
            raise ValueError(
                f"cdiVersion {self.cdi_version!r} is not a CDI version "
                f"(known: {', '.join(KNOWN_CDI_VERSIONS)})"
            )
        if not self.devices:
            raise ValueError("a CDI spec needs at least one device")
        names = [device.name for device in self.devices]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"CDI device names must be unique; repeated: {duplicates}")
        required = minimum_required_version(self)
        if _version_key(self.cdi_version) < _version_key(required):
            raise ValueError(
                f"cdiVersion {self.cdi_version} is too low for this spec: its contents need {required}"
            )
        return self


def split_kind(kind: str) -> tuple[str, str]:
    """``vendor/class`` → ``(vendor, class)``; ``ValueError`` naming the rule a bad kind breaks."""
    vendor, slash, klass = kind.partition("/")
    if not slash or not vendor or not klass:
        raise ValueError(f"CDI kind {kind!r} must be vendor/class with both parts non-empty")
    for part, what in ((vendor, "vendor"), (klass, "class")):
        if not _KIND_PART.fullmatch(part):
            raise ValueError(
                f"CDI kind {kind!r}: {what} {part!r} must start with a letter, end with a letter or "
                "digit and use only letters, digits, '_', '.' and '-'"
            )
    return vendor, klass


def qualified_device_name(kind: str, name: str) -> str:
    """The id runtimes resolve, ``vendor/class=name``, after checking both parts."""
    split_kind(kind)
    if not _DEVICE_NAME.fullmatch(name):
        raise ValueError(f"CDI device name {name!r} breaks the CDI naming rules")
    return f"{kind}={name}"


def _all_edits(spec: CdiSpec) -> list[ContainerEdits]:
    edits = [device.container_edits for device in spec.devices]
    if spec.container_edits is not None:
        edits.append(spec.container_edits)
    return edits


def minimum_required_version(spec: CdiSpec) -> str:
    """The lowest ``cdiVersion`` the CDI library accepts for what ``spec`` uses (v1.1.0's rules)."""
    edits = _all_edits(spec)
    required = LOWEST_CDI_VERSION
    if any(mount.type is not None for edit in edits for mount in edit.mounts or ()):
        required = "0.4.0"
    if any(device.name[:1].isdigit() for device in spec.devices) or any(
        node.host_path for edit in edits for node in edit.device_nodes or ()
    ):
        required = "0.5.0"
    if "." in spec.kind.partition("/")[2]:
        required = "0.6.0"
    if any(edit.additional_gids for edit in edits):
        required = "0.7.0"
    return required


def spec_to_json(spec: CdiSpec) -> bytes:
    """The spec as the runtimes read it: schema field names, unset fields left out."""
    return spec.model_dump_json(by_alias=True, exclude_none=True, indent=2).encode() + b"\n"


def spec_from_json(data: bytes) -> CdiSpec:
    """Parse and validate a spec file; ``ValidationFailed`` names each problem."""
    try:
        # by_name=False: the runtimes know only the schema's camelCase names.
        return CdiSpec.model_validate_json(data, by_name=False)
    except ValidationError as exc:
        raise ValidationFailed.from_pydantic("CDI spec", exc) from exc
