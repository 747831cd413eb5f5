"""Client-side request throttling: the QPS/burst limit client-go has and the python client lacks.

Without it a controller that writes for many pods at once can flood the API server (which then
answers 429 and slows everyone); with it, bursts go out at once and a sustained flow is held to
``qps``. The bucket is shared by every thread using one adapter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from driver.cluster.clock import Clock, SystemClock


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How one adapter talks to the API server."""

    qps: float = 50.0
    """Sustained requests per second; ``0`` disables throttling."""
    burst: int = 100
    """Requests allowed at once before ``qps`` applies."""
    connection_pool_maxsize: int = 32
    """Kept-alive connections to the server; size it for the threads that write concurrently."""
    connect_timeout: float = 5.0
    request_timeout: float = 30.0
    """Read timeout of one ordinary request (watches use their own ``timeoutSeconds`` + slack)."""
    page_size: int = 500
    """``limit`` of each page when listing; pages are joined with ``continue`` tokens."""
    user_agent: str = "instaslice"

    def __post_init__(self) -> None:
        if self.qps < 0 or self.burst < 1:
            raise ValueError(f"qps must be >= 0 and burst >= 1, got {self.qps}/{self.burst}")
        if self.connection_pool_maxsize < 1 or self.page_size < 1:
            raise ValueError("connection_pool_maxsize and page_size must be >= 1")


class TokenBucket:
    """``burst`` tokens, refilled at ``qps`` per second; each request takes one.

    ``reserve`` is the pure part (how long the caller must wait, with the token already taken, so
    concurrent callers queue up fairly); ``acquire`` waits that long.
    """

    def __init__(
        self,
        *,
        qps: float,
        burst: int,
        clock: Clock | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._qps = qps
        self._burst = float(burst)
        self._clock = clock or SystemClock()
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = float(burst)
        self._last = self._clock.monotonic()

    def reserve(self) -> float:
        """Take a token now; return how many seconds to wait before using it."""
        if self._qps <= 0:
            return 0.0
        with self._lock:
            now = self._clock.monotonic()
            self._tokens = min(self._burst, self._tokens + (now - self._last) * self._qps)
            self._last = now
            self._tokens -= 1.0
            if self._tokens >= 0:
                return 0.0
            return -self._tokens / self._qps

    def acquire(self) -> None:
        delay = self.reserve()
        if delay > 0:
            self._sleep(delay)
