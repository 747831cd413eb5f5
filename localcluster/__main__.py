"""``python -m localcluster --port N``: serve a local API server until Ctrl-C or SIGTERM and print
the kubeconfig that points kubectl and our daemons at it."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import tempfile
import threading
from pathlib import Path
from types import FrameType

from localcluster.apiserver import LocalApiServer
from localcluster.audit import JsonLinesAuditFile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--kubeconfig", type=Path, help="where to write the kubeconfig")
    parser.add_argument("--watch-history", type=int, default=10_000)
    parser.add_argument("--require-namespaces", action="store_true")
    parser.add_argument("--graceful-pod-deletion", action="store_true")
    parser.add_argument(
        "--audit-log", type=Path, help="append every request (RBAC attributes) here as JSON lines"
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO)

    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    audit = JsonLinesAuditFile(args.audit_log) if args.audit_log else None
    server = LocalApiServer(
        host=args.host,
        port=args.port,
        watch_history=args.watch_history,
        require_namespaces=args.require_namespaces,
        graceful_pod_deletion=args.graceful_pod_deletion,
        audit=audit,
    )
    with audit or contextlib.nullcontext(), server:
        path = (
            args.kubeconfig
            or Path(tempfile.gettempdir()) / f"localcluster-{server.port}.kubeconfig"
        )
        server.write_kubeconfig(path)
        print(f"serving on {server.url}", flush=True)
        print(f"kubeconfig: {path}", flush=True)
        print(f"  export KUBECONFIG={path}", flush=True)
        done.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
