"""TLS client sockets for the lab's own calls (kube-apiserver's webhook calls, readiness probes),
closed on every failure.

``SSLContext.wrap_socket`` takes the plain socket's descriptor over before it checks whether the
peer is still connected; on Python 3.11 before 3.11.8 a reset that arrives between connect and
wrap (a webhook process killed at that moment, which the lab does on purpose) raises from that
check without closing the new TLS socket (cpython#113280). The descriptor is then closed only by
the collector, with a ``ResourceWarning`` the test suite treats as an error. ``wrap_client`` closes
it on the way out: the socket is found in the failing call's frames, where it is ``self``.
"""

from __future__ import annotations

import socket
import ssl


def wrap_client(
    context: ssl.SSLContext, raw: socket.socket, *, server_hostname: str
) -> ssl.SSLSocket:
    """``context.wrap_socket(raw, server_hostname=…)`` (handshake included); on failure both
    sockets are closed before the error propagates."""
    try:
        return context.wrap_socket(raw, server_hostname=server_hostname)
    except BaseException as exc:
        trace = exc.__traceback__
        while trace is not None:
            created = trace.tb_frame.f_locals.get("self")
            if isinstance(created, ssl.SSLSocket):
                created.close()
            trace = trace.tb_next
        raw.close()
        raise
