"""Unix-socket gRPC servers the way the kubelet expects them (what the Go helper's ``endpoint.go`` does).

A socket file left behind by a killed plugin would make ``bind`` fail, so it is removed before
listening and again on stop. The socket is made owner-only (0600): the kubelet runs as root, and
nobody else on the node may call prepare/unprepare. Unix socket paths are limited to 107 bytes, so an
over-long path is refused with a clear message instead of gRPC's opaque bind error.
"""

import logging
import os
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

import grpc

from driver.errors import ConfigError

logger = logging.getLogger(__name__)

MAX_SOCKET_PATH_BYTES: Final = 107
SOCKET_MODE: Final = 0o600
DIRECTORY_MODE: Final = 0o750


def remove_stale_socket(path: Path) -> None:
    """Remove ``path`` if it is a socket (or a leftover plain file); refuse to touch a directory."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        raise ConfigError(f"socket path {path} is a directory")
    path.unlink(missing_ok=True)
    logger.info("removed stale socket %s", path)


def ensure_directory(path: Path, *, mode: int = DIRECTORY_MODE) -> None:
    """Create ``path`` (and parents) if missing; a directory we create gets ``mode``."""
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(mode)


class UnixGrpcServer:
    """One sync gRPC server on one unix socket; ``register`` adds the servicers before start."""

    def __init__(
        self,
        *,
        path: Path,
        register: Callable[[grpc.Server], None],
        max_workers: int = 16,
        name: str = "grpc",
    ) -> None:
        if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
            raise ConfigError(
                f"socket path {path} is longer than {MAX_SOCKET_PATH_BYTES} bytes (unix limit)"
            )
        self.path = path
        self._register = register
        self._max_workers = max_workers
        self._name = name
        self._server: grpc.Server | None = None

    @property
    def target(self) -> str:
        """The gRPC dial target of this socket."""
        return f"unix://{self.path}"

    def start(self) -> None:
        ensure_directory(self.path.parent)
        remove_stale_socket(self.path)
        server = grpc.server(
            ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix=self._name)
        )
        self._register(server)
        try:
            server.add_insecure_port(f"unix:{self.path}")
        except RuntimeError as exc:
            server.stop(None)
            raise ConfigError(f"cannot listen on {self.path}: {exc}") from exc
        server.start()
        os.chmod(self.path, SOCKET_MODE)
        self._server = server
        logger.info("serving %s on %s", self._name, self.path)

    def stop(self, *, grace_seconds: float | None = 1.0) -> None:
        """Stop serving (in-flight calls get ``grace_seconds``) and remove the socket file."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace_seconds).wait()
        self.path.unlink(missing_ok=True)
