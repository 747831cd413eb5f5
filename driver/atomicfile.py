"""Replace a file so readers see the old bytes or the new ones, never a mix, even across a crash.

Used for files other processes read while we write them (CDI specs, loaded by the container runtime)
and files that must survive a power cut whole (the node checkpoint). The temporary file lives in
the target's directory (``os.replace`` is atomic only within one file system), starts with ``.`` and
ends with ``.tmp`` so a directory scanner looking for ``*.json`` never picks it up.
"""

import contextlib
import logging
import os
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

TEMP_SUFFIX = ".tmp"


def write_atomically(path: Path, data: bytes, *, mode: int) -> None:
    """Write ``data`` to ``path``: temp file, fsync, ``os.replace``, fsync the directory.

    ``mode`` is applied to the new file before it becomes visible. Raises ``OSError``; on failure
    the temporary file is removed and ``path`` is untouched.
    """
    directory = path.parent
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_directory(directory)


def fsync_directory(directory: Path) -> None:
    """Make a rename or unlink in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temp_files(directory: Path, *, target_name_prefix: str) -> list[Path]:
    """Remove temp files a crash left behind for targets named ``<prefix>…``; return them."""
    removed: list[Path] = []
    for candidate in directory.glob(f".{target_name_prefix}*{TEMP_SUFFIX}"):
        with contextlib.suppress(FileNotFoundError):
            candidate.unlink()
            removed.append(candidate)
            logger.info("removed stale temporary file %s", candidate)
    return removed
