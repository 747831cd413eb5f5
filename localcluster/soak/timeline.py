"""What happened during a soak, in order: every entry with its time since the start, written as JSON
lines to ``timeline.jsonl`` as it happens (so a soak cut short still leaves its story)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Entry:
    at_s: float
    """Seconds since the soak started."""
    source: str
    """``fault``, ``churn``, ``violation``, ``phase``..."""
    text: str
    details: dict[str, Any]


class Timeline:
    def __init__(self, path: Path | None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._path = path
        self._clock = clock
        self._started = clock()
        self._lock = threading.Lock()
        self.entries: list[Entry] = []

    def now(self) -> float:
        """Seconds since the soak started."""
        return round(self._clock() - self._started, 1)

    def note(self, source: str, text: str, **details: Any) -> Entry:
        entry = Entry(at_s=self.now(), source=source, text=text, details=details)
        with self._lock:
            self.entries.append(entry)
            if self._path is not None:
                with self._path.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(asdict(entry), default=str) + "\n")
        level = logging.WARNING if source == "violation" else logging.INFO
        log.log(level, "[%7.1fs] %s: %s", entry.at_s, source, text)
        return entry

    def of(self, source: str) -> list[Entry]:
        with self._lock:
            return [e for e in self.entries if e.source == source]
