"""One API-server watch response read as a stream of ``WatchEvent``s, closable from any thread.

Apart from ``kube`` (which opens the response) because reading it is its own job: newline-framed
JSON events, ``ERROR`` frames turned into our errors, and a close that wakes a reader blocked in
another thread without handing a half-read connection back to the pool. Plain Python over
urllib3's response (chunked framing and reads are urllib3's and ``http.client``'s): it does not
import ``kubernetes``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import orjson

from api import wire
from driver.closing import ClosedOnExit
from driver.cluster.kube_wire import status_error, with_kind
from driver.cluster.port import Resource, WatchEvent, WatchEventType
from driver.errors import ClusterError

logger = logging.getLogger(__name__)

_READ_SIZE = 65536


class KubeWatchStream(ClosedOnExit):
    """One watch response (a urllib3 response not preloaded) read as it comes, line by line, each
    event decoded by ``orjson``; ``close`` from any thread ends the iteration."""

    def __init__(self, *, resource: Resource, response: Any, path: str) -> None:
        self._resource = resource
        self._raw = response
        self._path = path
        self._lock = threading.Lock()
        self._closed = False
        self._reading = False
        self._released = False

    def __iter__(self) -> Iterator[WatchEvent]:
        with self._lock:
            if self._closed:
                self._release()
                return
            self._reading = True
        buffer = b""
        try:
            while not self._is_closed():
                try:
                    chunk = self._raw.read1(_READ_SIZE)
                except Exception as exc:
                    # after close() from another thread, http.client fails in assorted ways
                    if self._is_closed():
                        return
                    raise ClusterError(f"watch {self._path}: {exc}") from exc
                if not chunk:
                    return
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    event = self._decode(line)
                    if event is not None:
                        yield event
        finally:
            with self._lock:
                self._closed = True
                self._reading = False
                self._release()

    def _decode(self, line: bytes) -> WatchEvent | None:
        if not line.strip():
            return None
        try:
            frame: wire.WatchEventBody = orjson.loads(line)
            kind = str(frame["type"])
            obj = frame["object"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ClusterError(f"watch {self._path}: malformed event {line[:200]!r}") from exc
        if kind == "ERROR":
            code = int(obj.get("code") or 500) if isinstance(obj, dict) else 500
            raise status_error("WATCH", self._path, code, json.dumps(obj).encode())
        try:
            event_type = WatchEventType(kind)
        except ValueError:
            logger.warning("watch %s: ignoring event of unknown type %s", self._path, kind)
            return None
        if event_type is not WatchEventType.BOOKMARK:
            obj = with_kind(self._resource, obj)
        return WatchEvent(type=event_type, object=obj)

    @property
    def closed(self) -> bool:
        return self._is_closed()

    def _is_closed(self) -> bool:
        with self._lock:
            return self._closed

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if not self._reading:
                self._release()
                return
        # A reader is blocked in another thread: wake it by shutting the socket down for reading
        # (urllib3's ``shutdown``); the reader then releases the response itself.
        try:
            self._raw.shutdown()
        except (OSError, RuntimeError, ValueError):  # the socket is gone already
            logger.debug("watch %s: socket already gone", self._path)

    def _release(self) -> None:
        """Close the response (a half-read watch must never go back to the pool); lock held."""
        if self._released:
            return
        self._released = True
        self._raw.close()
        self._raw.release_conn()
