"""One error vocabulary for the whole code base.

Adapters translate library exceptions into these with ``raise … from exc``; gRPC handlers and loop
entry points turn them into per-claim errors, events and conditions.
"""


class DriverError(Exception):
    """Base of every error InstaSlice raises on purpose."""

    retryable: bool = False


class ConfigError(DriverError):
    """Bad input from a user or an operator: a flag, an opaque config, a spec string, a file."""


class PlacementError(DriverError):
    """A request cannot be placed; the message says why in words a person can act on."""


class BackendError(DriverError):
    """The GPU backend (NVML or emulated) failed."""


class PlacementOccupiedError(BackendError):
    """The placement asked for overlaps an existing GPU instance (NVML ``INSUFFICIENT_RESOURCES``)."""


class NotFoundError(DriverError):
    """A named thing (GPU index, instance, profile) does not exist."""


class ClusterError(DriverError):
    """The Kubernetes API failed."""

    retryable = True


class ConflictError(ClusterError):
    """A write lost an optimistic-concurrency race (HTTP 409); recompute, never force."""


class ApiNotFoundError(ClusterError):
    """The object asked for does not exist (HTTP 404)."""

    retryable = False


class AlreadyExistsError(ConflictError):
    """A create found an object of that name already there (HTTP 409, reason ``AlreadyExists``)."""

    retryable = False


class InvalidError(ClusterError):
    """The API server refused the request as invalid (HTTP 400/422); the message is the Status's."""

    retryable = False


class ForbiddenError(ClusterError):
    """HTTP 403: RBAC refused the request, or admission did (``exceeded quota``)."""

    retryable = False

    @property
    def quota_exceeded(self) -> bool:
        """Whether a ResourceQuota refused the object (kube-apiserver's quota admission says
        ``exceeded quota`` in the message of a ``Forbidden`` status)."""
        return "exceeded quota" in str(self)


class GoneError(ClusterError):
    """The resourceVersion asked for is too old (HTTP 410, or a watch ``ERROR`` event): re-list."""


class TooManyRequestsError(ClusterError):
    """HTTP 429: rate limited, or an eviction a PodDisruptionBudget does not allow now."""


class CheckpointError(DriverError):
    """The node checkpoint file is corrupt, of an unknown version, or cannot be written."""


class CdiError(DriverError):
    """A CDI spec file cannot be written, read back or removed."""

    retryable = True
