"""The checkpoint as the plugin uses it: an in-memory copy, saved durably with group commit.

The plugin is the only writer of its checkpoint, so after the first load the copy in memory is the
truth and need not be read back and re-validated for every change. Every change must still be on
disk before its caller goes on (a prepare answers only after its ``PrepareCompleted`` is durable),
but when many claims are prepared at once their changes need not each pay a file write and two
fsyncs: ``update`` applies the change in memory at once, then waits until a save that includes it
has finished. Whoever takes the save lock first writes the newest state for everyone who changed
it meanwhile (group commit), so concurrent prepares share saves.

If a save fails, the callers waiting on it get the ``CheckpointError``; their changes stay in memory
(and reach disk with the next successful save). Callers treat the error as a failed step and undo
their change (prepare rolls back, which is itself a change), so memory and disk converge.
"""

import threading
from collections.abc import Callable
from pathlib import Path

from api.checkpoint import Checkpoint
from driver.checkpoint import CheckpointStore


class CheckpointJournal:
    def __init__(self, store: CheckpointStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()
        self._current: Checkpoint | None = None
        self._version = 0
        self._durable = 0

    @property
    def path(self) -> Path:
        return self._store.path

    def load(self) -> Checkpoint:
        """The current checkpoint (read from disk once; ``CheckpointError`` if unusable)."""
        with self._lock:
            return self._loaded()

    def save(self, checkpoint: Checkpoint) -> None:
        """Replace the checkpoint, durably (also when nothing was loaded, e.g. after corruption)."""
        with self._lock:
            self._current = checkpoint
            self._version += 1
            version = self._version
        self._wait_durable(version)

    def update(self, change: Callable[[Checkpoint], Checkpoint]) -> Checkpoint:
        """Apply ``change`` (quick and pure; if it raises nothing changes), return once durable."""
        with self._lock:
            current = self._loaded()
            updated = change(current)
            if updated is current:
                return current
            self._current = updated
            self._version += 1
            version = self._version
        self._wait_durable(version)
        return updated

    def remove_stale_temp_files(self) -> int:
        return self._store.remove_stale_temp_files()

    def _loaded(self) -> Checkpoint:
        if self._current is None:
            self._current = self._store.load()
        return self._current

    def _wait_durable(self, version: int) -> None:
        with self._save_lock:
            with self._lock:
                if self._durable >= version:
                    return
                snapshot, newest = self._current, self._version
            if snapshot is None:  # pragma: no cover - set before any version is handed out
                return
            self._store.save(snapshot)
            with self._lock:
                self._durable = newest
