"""Errors raised by the ``api`` package, and the one place pydantic's errors become readable lines.

``api/`` may import only the standard library and pydantic, so it cannot raise the driver's
``ConfigError`` or ``CheckpointError`` itself. It raises the two types below (both ``ValueError``s)
and the driver translates them where it calls in, keeping the cause::

    try:
        config = parse_opaque_config(parameters)
    except ValidationFailed as exc:
        raise ConfigError(f"claim {namespace}/{name}: {exc}") from exc
"""

from collections.abc import Sequence

from pydantic import ValidationError
from pydantic_core import ErrorDetails

_MAX_INPUT_CHARS = 60


class ValidationFailed(ValueError):  # noqa: N818 - reads as what happened: "validation failed"
    """Something a user or a file handed us does not match its schema.

    ``problems`` holds one readable line per error, e.g. ``unknown field 'foo' in MigDeviceConfig``;
    ``str(exc)`` joins them with ``"; "``.
    """

    def __init__(self, subject: str, problems: Sequence[str]) -> None:
        self.subject = subject
        self.problems = tuple(problems) or (f"invalid {subject}",)
        super().__init__("; ".join(self.problems))

    @classmethod
    def from_pydantic(cls, subject: str, exc: ValidationError) -> "ValidationFailed":
        return cls(subject, [describe_error(subject, error) for error in exc.errors()])


class CheckpointDecodeError(ValueError):
    """Bytes that should hold a node checkpoint cannot be read back; the message says why."""


def describe_error(subject: str, error: ErrorDetails) -> str:
    """One pydantic error as a line a person can act on, naming the field path and the bad value."""
    path = ".".join(str(part) for part in error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"unknown field {path!r} in {subject}"
    if kind == "missing":
        return f"missing required field {path!r} in {subject}"
    message = error["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    where = f"{subject}.{path}" if path else subject
    return f"{where}: {message} (got {_short_repr(error.get('input'))})"


def _short_repr(value: object) -> str:
    text = repr(value)
    if len(text) > _MAX_INPUT_CHARS:
        return text[: _MAX_INPUT_CHARS - 3] + "..."
    return text
