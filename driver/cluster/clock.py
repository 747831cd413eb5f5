"""Time as the cluster layer sees it, behind a seam so tests can drive leases and backoff.

Durations (lease expiry, renew deadline, backoff) are measured on the monotonic clock, never on the
wall clock: a node's wall clock may jump, and the API server's timestamps come from other machines.
Wall time is only written into objects for people and other clients to read.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; only differences mean anything."""
        ...

    def now(self) -> datetime:
        """Current wall time, timezone-aware UTC."""
        ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)
