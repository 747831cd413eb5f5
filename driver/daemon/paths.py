"""Start-up checks of the paths a daemon's flags name: the directories it writes, the files it reads.

A directory the daemon keeps state, sockets or specs in that it cannot write (a read-only mount, a
file where the directory should be) fails the same way on every try: the daemon is refused at start
(``ConfigError``, one line, exit status 2; ``run``) instead of failing later with a traceback or
retrying forever. The checks create nothing: a directory that does not exist yet passes when it
can be created (the daemon creates it, with its own mode, when it starts).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from driver.errors import ConfigError


def check_writable_directory(path: Path, *, flag: str) -> None:
    """``ConfigError`` naming ``flag`` unless ``path`` is a directory this process can write in,
    or one it can create (its nearest existing parent is such a directory)."""
    existing = path
    while True:
        try:
            mode = existing.stat().st_mode
            break
        except FileNotFoundError:
            if existing.parent == existing:
                raise ConfigError(f"{flag} {path}: no such directory") from None
            existing = existing.parent
        except OSError as exc:
            raise ConfigError(f"{flag} {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISDIR(mode):
        where = (
            "is not a directory"
            if existing == path
            else f"cannot be made: {existing} is not a directory"
        )
        raise ConfigError(f"{flag} {path} {where}")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "is not writable" if existing == path else f"cannot be made in {existing}"
        raise ConfigError(f"{flag} {path} {where} (permissions, or a read-only file system)")


def check_file(path: Path, *, flag: str, may_be_missing: bool = False) -> None:
    """``ConfigError`` naming ``flag`` unless ``path`` is a regular file this process can read (or,
    with ``may_be_missing``, is not there yet)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError as exc:
        if may_be_missing:
            return
        raise ConfigError(f"{flag} {path}: no such file") from exc
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{flag} {path} is not a regular file")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{flag} {path} is not readable")
