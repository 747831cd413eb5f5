"""Notice kubelet restarts: its ``kubelet.sock`` in the device-plugin directory is recreated.

A restarting kubelet forgets every device plugin, removes the sockets it finds in the directory
(ours included) and creates a new ``kubelet.sock``; plugins must then serve again on fresh sockets
and register again (what NVIDIA's device plugin does on the socket's create event). We poll the
socket's identity (device, inode, change time) once a second instead of using inotify — the
standard library has no inotify binding, a ``stat`` a second costs nothing, and polling also catches
a restart that happened while we were not looking. The owner's ``on_tick`` gets the identity (None
while there is no socket) and decides; it runs on the watcher's thread, also once right at start.
"""

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from driver.daemon.wakeable import WakeableThread

logger = logging.getLogger(__name__)


class SocketIdentity(NamedTuple):
    device: int
    inode: int
    changed_ns: int


def socket_identity(path: Path) -> SocketIdentity | None:
    """Who ``path`` is now; None if it does not exist (or is not a socket)."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    if not path.is_socket():
        return None
    return SocketIdentity(status.st_dev, status.st_ino, status.st_ctime_ns)


class KubeletWatcher:
    def __init__(
        self,
        *,
        kubelet_socket: Path,
        interval_seconds: float,
        on_tick: Callable[[SocketIdentity | None], None],
    ) -> None:
        self._socket = kubelet_socket
        self._interval = interval_seconds
        self._on_tick = on_tick
        self._thread = WakeableThread(self._run, name="shim-kubelet-watch")

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Tick now instead of at the next interval."""
        self._thread.wake()

    def stop(self) -> None:
        self._thread.stop()

    def _run(self) -> None:
        while not self._thread.stopping():
            try:
                self._on_tick(socket_identity(self._socket))
            except Exception:
                logger.exception("device-plugin maintenance failed; retrying")
            self._thread.sleep(self._interval)
