"""The node checkpoint: what the kubelet plugin has prepared on this node, and its file format.

The plugin records a claim as ``PrepareStarted`` (with the devices it is about to create) *before*
touching the GPU and as ``PrepareCompleted`` (with GPU-instance/compute-instance ids, MIG UUIDs and
CDI ids) before answering the kubelet. After a crash the checkpoint says which slices may exist
half-made (roll back), which are complete (answer again), and which MIG instances nobody owns
(destroy). The boot id tells a checkpoint from before a reboot, when no MIG instance survives.

A completed claim also records who its slices serve and since when (the pods the claim was reserved
for, the time its slices were made), and the checkpoint keeps the slice-seconds of the slices it
released, per namespace and profile: the kubelet plugin's metrics attribute every slice to its pod
and count slice-seconds from this record alone, so both are right after a restart
(docs/design.md D9).

File format (``encode_checkpoint`` / ``decode_checkpoint``)::

    {"version": 2, "checksum": "sha256:<hex>", "data": {…Checkpoint…}}

``checksum`` is SHA-256 over the *canonical* JSON of ``data`` (keys sorted, no spaces, ASCII), so
how the file is indented does not matter but any edit or partial write of ``data`` does.

Forward-compatibility rule: the schema is strict (unknown fields are errors), so **any change an
older reader would reject or misread — a new field, a renamed one, a changed meaning — bumps
``version``**. A newer build keeps decoding every older version (migrating it in
``decode_checkpoint``), so upgrades keep the node's prepared claims. An older build refuses a newer
version with ``CheckpointDecodeError`` naming both versions instead of guessing; the plugin then
treats the file like a corrupt one (rebuild from the API server and NVML, keep the bad file aside).

Versions: 1 had no ``pods``/``prepared_at`` on a claim, no ``pod_name``/``pod_namespace`` on a
shim binding and no ``released_slice_seconds``; version 2 added them, each with a default that
means "not known", so version-1 data is version-2 data as it stands.
"""

import hashlib
import json
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from api.errors import CheckpointDecodeError, ValidationFailed

CHECKPOINT_VERSION: Final = 2
CHECKSUM_ALGORITHM: Final = "sha256"

_ENVELOPE_KEYS: Final = frozenset({"version", "checksum", "data"})


def _from_version_1(data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 → 2: every field version 2 added defaults to "not known", so the data stands."""
    return data


_MIGRATIONS: Final[Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    1: _from_version_1,
}
"""For each older version this build reads: its data as the current schema reads it."""


_READABLE_VERSIONS: Final = (*sorted(_MIGRATIONS), CHECKPOINT_VERSION)


class PrepareState(StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    """Devices may exist partly: roll back before preparing again."""
    PREPARE_COMPLETED = "PrepareCompleted"
    """Every device exists and its CDI spec is written: answer from the checkpoint."""


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class PreparedDevice(_Strict):
    """One allocated device of a claim and the MIG slice made for it."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    """Device name as published in the ResourceSlice, e.g. ``gpu-0-1g-5gb-3``."""
    gpu_index: int = Field(ge=0)
    gpu_uuid: str
    profile: str
    placement_start: int = Field(ge=0)
    placement_size: int = Field(ge=1)
    gi_id: int | None = Field(default=None, ge=0)
    """NVML GPU-instance id; None until the GPU instance exists."""
    ci_id: int | None = Field(default=None, ge=0)
    mig_uuid: str | None = None
    cdi_device_ids: tuple[str, ...] = ()

    def is_complete(self) -> bool:
        return (
            self.gi_id is not None
            and self.ci_id is not None
            and bool(self.mig_uuid)
            and bool(self.cdi_device_ids)
        )


class ShimBinding(_Strict):
    """For claims the device-plugin shim prepared (shadow claims of classic pods).

    The device-plugin ``Allocate`` call does not say which pod asks, so ``pod_uid`` and
    ``container_name`` (and the pod's name and namespace) start unknown and are filled in once the
    kubelet's pod-resources API shows which container holds ``device_plugin_ids``.
    """

    resource_name: str
    """Extended resource served, e.g. ``nvidia.com/mig-1g.5gb``."""
    device_plugin_ids: tuple[str, ...] = ()
    """The device-plugin device ids the kubelet allocated for these slices."""
    pod_uid: str | None = None
    container_name: str | None = None
    pod_name: str | None = None
    pod_namespace: str | None = None
    """The holder's namespace: another one than the claim's when a container of another
    namespace got the slices (its claim cannot follow it there)."""


class PodRef(_Strict):
    """A pod a claim is reserved for (``status.reservedFor``); it is in the claim's namespace."""

    name: str
    uid: str


class PreparedClaim(_Strict):
    uid: str = Field(min_length=1)
    namespace: str
    name: str
    state: PrepareState
    devices: tuple[PreparedDevice, ...] = ()
    shim: ShimBinding | None = None
    pods: tuple[PodRef, ...] = ()
    """The pods the claim was reserved for when it was prepared (for a shadow claim: the pod it
    was made for; ``shim`` says who holds the slices)."""
    prepared_at: float | None = Field(default=None, ge=0)
    """Unix time at which the claim's slices were complete; None before that, or not known."""

    @model_validator(mode="after")
    def _completed_means_complete(self) -> "PreparedClaim":
        if self.state is PrepareState.PREPARE_COMPLETED:
            unfinished = [d.device for d in self.devices if not d.is_complete()]
            if unfinished:
                raise ValueError(
                    f"claim {self.uid} is PrepareCompleted but devices {unfinished} lack a "
                    "GPU-instance id, compute-instance id, MIG UUID or CDI device id"
                )
        return self


class SliceSeconds(_Strict):
    """Seconds slices of one profile existed for claims of one namespace, summed over slices."""

    namespace: str
    profile: str
    seconds: float = Field(ge=0)


class Checkpoint(_Strict):
    """Everything prepared on one node, keyed by claim UID. Treat as immutable: use ``with_claim``."""

    node_name: str = ""
    boot_id: str = ""
    """``/proc/sys/kernel/random/boot_id`` when written; empty in a fresh checkpoint."""
    claims: dict[str, PreparedClaim] = Field(default_factory=dict)
    released_slice_seconds: tuple[SliceSeconds, ...] = ()
    """Slice-seconds of the slices released so far (``released``), by namespace and profile."""

    @model_validator(mode="after")
    def _keys_are_uids(self) -> "Checkpoint":
        for key, claim in self.claims.items():
            if key != claim.uid:
                raise ValueError(f"claim stored under key {key!r} has uid {claim.uid!r}")
        return self

    def claim(self, uid: str) -> PreparedClaim | None:
        return self.claims.get(uid)

    def with_claim(self, claim: PreparedClaim) -> "Checkpoint":
        """A copy with ``claim`` added or replaced."""
        return self._copy(claims={**self.claims, claim.uid: claim})

    def without_claim(self, uid: str) -> "Checkpoint":
        """A copy without the claim (no error if it was not there)."""
        return self._copy(claims={key: claim for key, claim in self.claims.items() if key != uid})

    def released(self, uid: str, *, at: float) -> "Checkpoint":
        """A copy without the claim, its slices' seconds up to ``at`` (Unix time) added to
        ``released_slice_seconds`` (a claim never completed, or of unknown age, adds nothing)."""
        entry = self.claims.get(uid)
        if entry is None:
            return self
        totals = {(s.namespace, s.profile): s.seconds for s in self.released_slice_seconds}
        for profile, seconds in slice_ages(entry, at=at):
            key = (entry.namespace, profile)
            totals[key] = totals.get(key, 0.0) + seconds
        return self.without_claim(uid)._copy(
            released_slice_seconds=tuple(
                SliceSeconds(namespace=namespace, profile=profile, seconds=seconds)
                for (namespace, profile), seconds in sorted(totals.items())
            )
        )

    def with_identity(self, *, node_name: str, boot_id: str) -> "Checkpoint":
        """A copy stamped with this node and boot, claims kept."""
        return self._copy(node_name=node_name, boot_id=boot_id)

    def _copy(self, **changes: Any) -> "Checkpoint":
        fields = {
            "node_name": self.node_name,
            "boot_id": self.boot_id,
            "claims": dict(self.claims),
            "released_slice_seconds": self.released_slice_seconds,
        }
        return Checkpoint(**{**fields, **changes})


def slice_ages(entry: PreparedClaim, *, at: float) -> list[tuple[str, float]]:
    """(profile, seconds since the slice was made) per slice of a completed claim at Unix time
    ``at``; none for a claim not completed or of unknown age (a clock set back counts 0)."""
    if entry.state is not PrepareState.PREPARE_COMPLETED or entry.prepared_at is None:
        return []
    age = max(0.0, at - entry.prepared_at)
    return [(device.profile, age) for device in entry.devices]


def _canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _checksum(canonical: bytes) -> str:
    return f"{CHECKSUM_ALGORITHM}:{hashlib.sha256(canonical).hexdigest()}"


def data_checksum(data: Mapping[str, Any]) -> str:
    """The ``checksum`` an envelope must carry for ``data`` (JSON-typed), e.g. ``sha256:…``."""
    return _checksum(_canonical(data))


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    """The bytes of a checkpoint file: compact JSON (``jq .`` shows it indented).

    Compact on purpose: with ``indent`` Python's JSON encoder falls back to its slow pure-Python
    path, and the plugin saves the checkpoint on every prepare; the checksum ignores layout.
    """
    data = checkpoint.model_dump(mode="json")
    envelope = {
        "version": CHECKPOINT_VERSION,
        "checksum": _checksum(_canonical(data)),
        "data": data,
    }
    return json.dumps(envelope, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def decode_checkpoint(raw: bytes) -> Checkpoint:
    """Read checkpoint bytes back; ``CheckpointDecodeError`` says what is wrong with them."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointDecodeError(f"not UTF-8 text ({exc})") from exc
    if not text.strip():
        raise CheckpointDecodeError("the file is empty")
    try:
        envelope = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointDecodeError(
            f"not valid JSON ({exc}); the file may be truncated or partly written"
        ) from exc
    except RecursionError as exc:  # the stdlib parser recurses per nesting level
        raise CheckpointDecodeError("JSON nested deeper than a checkpoint ever is") from exc
    if not isinstance(envelope, dict):
        raise CheckpointDecodeError(f"expected a JSON object, found {type(envelope).__name__}")
    missing = sorted(_ENVELOPE_KEYS - envelope.keys())
    unknown = sorted(envelope.keys() - _ENVELOPE_KEYS)
    if missing or unknown:
        raise CheckpointDecodeError(
            f"envelope fields wrong (missing {missing}, unknown {unknown}); "
            "expected version, checksum and data"
        )
    version = envelope["version"]
    if type(version) is not int:
        raise CheckpointDecodeError(f"version must be an integer, found {version!r}")
    if version not in _READABLE_VERSIONS:
        raise CheckpointDecodeError(
            f"unknown checkpoint version {version} (this build reads versions "
            f"{', '.join(map(str, _READABLE_VERSIONS))}); was it written by a newer InstaSlice?"
        )
    data = envelope["data"]
    if not isinstance(data, dict):
        raise CheckpointDecodeError(f"data must be a JSON object, found {type(data).__name__}")
    try:
        canonical = _canonical(data)
    except (RecursionError, ValueError) as exc:
        raise CheckpointDecodeError(f"data cannot be encoded canonically: {exc}") from exc
    expected = _checksum(canonical)
    if envelope["checksum"] != expected:
        raise CheckpointDecodeError(
            f"checksum mismatch: the file says {envelope['checksum']!r} but its data hashes to "
            f"{expected!r}; the file was edited or partly written"
        )
    if version != CHECKPOINT_VERSION:
        canonical = _canonical(_MIGRATIONS[version](data))
    try:
        return Checkpoint.model_validate_json(canonical)
    except ValidationError as exc:
        problems = ValidationFailed.from_pydantic("Checkpoint", exc)
        raise CheckpointDecodeError(
            f"data does not match checkpoint schema version {version}: {problems}"
        ) from exc
