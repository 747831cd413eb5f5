"""One NVML call and its failure as our error, shared by the NVML backend and its health probes.

A failing pynvml call raises the library's ``NVMLError``; we turn it into ``NvmlCallError`` (a
``BackendError``) that keeps the ``NVML_ERROR_*`` code, so callers can tell "not supported" or
"GPU lost" from a real failure. pynvml-free: the library is whatever ``NvmlLibrary`` is injected.
"""

from collections.abc import Callable
from typing import ParamSpec, TypeVar

from driver.errors import BackendError
from driver.gpu import nvml_api as api

P = ParamSpec("P")
R = TypeVar("R")


class NvmlCallError(BackendError):
    """An NVML call failed; ``code`` is its ``NVML_ERROR_*`` value (``None`` if it had none)."""

    def __init__(self, message: str, *, code: int | None) -> None:
        super().__init__(message)
        self.code = code


def call_nvml(
    nvml: api.NvmlLibrary, what: str, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs
) -> R:
    """``fn(*args, **kwargs)``; an ``nvml.NVMLError`` becomes ``NvmlCallError`` naming ``what``."""
    try:
        return fn(*args, **kwargs)
    except nvml.NVMLError as exc:
        code = getattr(exc, "value", None)
        raise NvmlCallError(
            f"NVML {what} failed: {exc} (code {code})",
            code=code if isinstance(code, int) else None,
        ) from exc
