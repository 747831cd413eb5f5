"""The node checkpoint on disk: load, save atomically, read-modify-write under one lock.

The schema and byte format are ``api.checkpoint``; this module only adds the file: a missing file is
an empty checkpoint (first start on the node), a file that cannot be decoded (or is larger than
``MAX_CHECKPOINT_BYTES``) is a ``CheckpointError`` naming the file and the problem (never silently
replaced: it may be the only record of slices that exist), and every save is durable before it
returns (temp file, fsync, ``os.replace``, fsync of the directory) with mode 0600 — the file lists
the node's claims and is nobody else's business.
"""

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

from api.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from api.errors import CheckpointDecodeError
from driver.atomicfile import remove_stale_temp_files, write_atomically
from driver.errors import CheckpointError

logger = logging.getLogger(__name__)

CHECKPOINT_FILE_NAME: Final = "checkpoint.json"
CHECKPOINT_FILE_MODE: Final = 0o600
MAX_CHECKPOINT_BYTES: Final = 16 * 1024 * 1024
"""Far above any node's checkpoint (a few hundred bytes per prepared claim); a bigger file is not
one of ours and is refused unread, so a corrupt file cannot take the plugin's memory."""


class CheckpointStore:
    """One checkpoint file, shared by the threads of the kubelet plugin.

    ``update`` is the way to change it: it holds the lock from load to save, so two prepares never
    lose each other's claim.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.RLock()

    @property
    def path(self) -> Path:
        return self._path

    def load(self) -> Checkpoint:
        """The checkpoint on disk; empty if there is no file yet."""
        with self._lock:
            try:
                with self._path.open("rb") as file:
                    raw = file.read(MAX_CHECKPOINT_BYTES + 1)
            except FileNotFoundError:
                return Checkpoint()
            except OSError as exc:
                raise CheckpointError(f"cannot read checkpoint {self._path}: {exc}") from exc
            if len(raw) > MAX_CHECKPOINT_BYTES:
                raise CheckpointError(
                    f"checkpoint {self._path} is unusable: larger than {MAX_CHECKPOINT_BYTES} bytes"
                )
            try:
                return decode_checkpoint(raw)
            except CheckpointDecodeError as exc:
                raise CheckpointError(f"checkpoint {self._path} is unusable: {exc}") from exc

    def save(self, checkpoint: Checkpoint) -> None:
        """Replace the file with ``checkpoint``, durably."""
        data = encode_checkpoint(checkpoint)
        with self._lock:
            try:
                self._path.parent.mkdir(parents=True, exist_ok=True)
                write_atomically(self._path, data, mode=CHECKPOINT_FILE_MODE)
            except OSError as exc:
                raise CheckpointError(f"cannot write checkpoint {self._path}: {exc}") from exc
        logger.debug("saved checkpoint %s (%d claims)", self._path, len(checkpoint.claims))

    def update(self, change: Callable[[Checkpoint], Checkpoint]) -> Checkpoint:
        """Load, apply ``change``, save if it changed anything; return the result.

        ``change`` runs under the store's lock and must be quick and pure (no GPU or API calls).
        If it raises, nothing is written.
        """
        with self._lock:
            current = self.load()
            updated = change(current)
            if updated != current:
                self.save(updated)
            return updated

    def remove_stale_temp_files(self) -> int:
        """Remove temporary files a crash during ``save`` left behind; return how many."""
        with self._lock:
            if not self._path.parent.is_dir():
                return 0
            return len(
                remove_stale_temp_files(self._path.parent, target_name_prefix=self._path.name)
            )
