"""Values that cross from the gRPC edge into the plugin's core, independent of the DRA API version.

The kubelet speaks DRA v1 or v1beta1; both carry the same claims and answers. ``dra_service``
converts the wire messages to these types and back, so the core is written once.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from driver.ids import ClaimUid


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the kubelet names it: the plugin GETs the ResourceClaim itself."""

    uid: ClaimUid
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One allocated device of a prepared claim, as the kubelet must be told about it."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PrepareResult:
    """The answer for one claim: its devices, or a non-empty ``error`` (devices then ignored)."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class ClaimPreparer(Protocol):
    """What the DRA gRPC service delegates to (``kubeletplugin.state.devicestate.DeviceState``).

    Both methods answer every claim asked about (key = claim UID) and report failures per claim,
    never by raising.
    """

    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[ClaimUid, PrepareResult]: ...

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[ClaimUid, str]:
        """Per claim: empty string on success, else the error."""
        ...
