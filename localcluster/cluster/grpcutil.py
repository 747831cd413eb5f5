"""Unix-socket gRPC plumbing for the emulated kubelet: the servers it offers (device-plugin
``Registration``, pod-resources) and the channels it dials to plugins.

Sockets are created fresh (a stale file is removed first, as the kubelet does) and removed on stop;
channels are always closed by their owner so no socket outlives the kubelet.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

log = logging.getLogger(__name__)

MAX_SOCKET_PATH_BYTES = 107
CALL_TIMEOUT_S = 10.0
"""Timeout of one call to a plugin (the kubelet uses 10 s to dial and 45 s for DRA calls)."""


class SocketPathError(ValueError):
    """The socket path does not fit a sockaddr_un."""


def check_socket_path(path: Path) -> None:
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        raise SocketPathError(
            f"socket path {path} is longer than {MAX_SOCKET_PATH_BYTES} bytes; use a shorter root"
        )


class UnixServer:
    """A sync gRPC server on one unix socket."""

    def __init__(self, *, path: Path, register: Callable[[grpc.Server], None], name: str) -> None:
        check_socket_path(path)
        self.path = path
        self._register = register
        self._name = name
        self._server: grpc.Server | None = None

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        server = grpc.server(
            ThreadPoolExecutor(max_workers=8, thread_name_prefix=self._name),
            options=[("grpc.so_reuseport", 0)],
        )
        self._register(server)
        server.add_insecure_port(f"unix:{self.path}")
        server.start()
        self._server = server
        log.debug("%s serving on %s", self._name, self.path)

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(None).wait()
        self.path.unlink(missing_ok=True)


def dial(path: Path | str, *, timeout: float = CALL_TIMEOUT_S) -> grpc.Channel:
    """A channel to a unix socket, ready (connected) or ``grpc.FutureTimeoutError``."""
    channel = grpc.insecure_channel(f"unix:{path}")
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
    except BaseException:
        channel.close()
        raise
    return channel
