"""The body of a watch response: newline-delimited JSON events until the watch times out, the
watcher is closed (server stop/restart, slow consumer) or the client goes away.

BOOKMARKs (when the client allows them) are sent after ``bookmark_interval`` seconds without
events and once more just before a timeout, carrying the store's resourceVersion at a moment when
nothing was pending for this watch — so a client resuming from it misses nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from localcluster.errors import ApiError
from localcluster.store import Store
from localcluster.watch import Watcher

_POLL_S = 0.5  # upper bound on how long a stream notices server shutdown late


@dataclass(frozen=True, slots=True)
class WatchOptions:
    bookmark_interval: float
    closing: Callable[[], bool]


def _line(kind: str, obj: object) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"


def expired_stream(error: ApiError) -> Iterator[bytes]:
    """What kube sends for a watch from a compacted resourceVersion: one ERROR event, then EOF."""
    yield _line("ERROR", error.status())


def watch_stream(
    store: Store,
    watcher: Watcher,
    *,
    timeout: float,
    bookmarks: bool,
    options: WatchOptions,
) -> Iterator[bytes]:
    deadline = time.monotonic() + max(0.0, timeout)
    last_sent = time.monotonic()
    try:
        while not options.closing():
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                if bookmarks and (bookmark := store.bookmark(watcher)) is not None:
                    yield _line("BOOKMARK", bookmark)
                return
            wait = min(remaining, _POLL_S)
            if bookmarks:
                wait = min(wait, max(0.01, last_sent + options.bookmark_interval - now))
            events = watcher.take(wait)
            if events is None:
                return
            if events:
                yield b"".join(_line(e.type, e.obj) for e in events)
                last_sent = time.monotonic()
            elif bookmarks and time.monotonic() - last_sent >= options.bookmark_interval:
                bookmark = store.bookmark(watcher)
                if bookmark is not None:
                    yield _line("BOOKMARK", bookmark)
                    last_sent = time.monotonic()
    finally:
        store.unwatch(watcher)
