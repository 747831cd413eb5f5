"""Opening the files a user names, without letting one block or stream forever.

``open`` of a FIFO nothing writes to blocks, and a device (``/dev/zero``) never ends: the commands
read only regular files, opened without blocking and checked with ``fstat`` before anything is
read. A file written to is opened without blocking too: a FIFO that nothing reads fails at once.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO


def open_regular_file(path: Path) -> IO[bytes]:
    """``path`` opened for binary reading; ``OSError`` (``strerror`` saying why) unless it is a
    regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise OSError(0, f"it is {kind}", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_for_writing(path: Path) -> IO[bytes]:
    """``path`` created or truncated for binary writing; a FIFO that nothing reads is ``OSError``
    ``ENXIO`` at once instead of blocking, a pipe with a reader is written as usual."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, 0o666)
    try:
        os.set_blocking(fd, True)
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise
