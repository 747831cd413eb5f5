"""``with`` for objects that only need ``close()`` on the way out.

API clients, watch streams and files we own follow one rule: entering returns the object itself,
leaving closes it whatever happened (``close`` must be safe to call twice). Subclassing
``ClosedOnExit`` states that once instead of in every class.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class ClosedOnExit(ABC):
    """A context manager that closes itself on exit; subclasses define ``close``."""

    @abstractmethod
    def close(self) -> None:
        """Release what the object holds."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
