"""The life of a daemon process, the same for every daemon: logging set up, SIGTERM and SIGINT
handled, the API client made, the daemon's own parts started by its ``serve``, and once a signal
came everything stopped in the reverse order of its start, the client last.

The exit status says what ended the process:

* 0: stopped by a signal;
* 2, with one line on stderr (``parser.refuse``) and no traceback: a configuration that can never
  work — a ``ConfigError`` out of the client's configuration (an unreadable kubeconfig) or out of
  ``serve`` (a state directory that cannot be written, an emulated GPU state file that is not
  one). A restart would not help and a retry inside the process would hide the reason in a loop;
* 1, logged: any other error that ends the process.

What may come right later (an API server not reachable yet, an NVIDIA driver not loaded yet) is no
``ConfigError``: each daemon waits for it while it serves its probes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from driver.cluster.kube import KubeClusterApi, connect
from driver.cluster.throttle import ClientSettings
from driver.daemon.http import HttpEndpoint, Route, endpoints_by_address
from driver.daemon.logs import configure_logging
from driver.daemon.parser import refuse
from driver.daemon.paths import check_file
from driver.daemon.settings import DaemonSettings
from driver.daemon.signals import stop_on_signals
from driver.errors import ConfigError, DriverError

EXIT_FAILED = 1
DEFAULT_CONNECTIONS = ClientSettings().connection_pool_maxsize


@dataclass(frozen=True, slots=True)
class Program:
    """Who the process is: its name (its parser's ``prog``, the prefix of its refusals), the
    logger its start and stop are told through, and the fields its log records carry."""

    name: str
    logger: logging.Logger
    log_fields: Sequence[str]


class Daemon:
    """What a daemon's ``serve`` works with: the API client, the stop event, and the means to have
    its parts stopped with the process (the last started first)."""

    def __init__(
        self, *, api: KubeClusterApi, stop: threading.Event, stack: contextlib.ExitStack
    ) -> None:
        self.api = api
        self.stop = stop
        self._stack = stack

    def on_stop(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` when the process stops, before what was registered earlier."""
        self._stack.callback(callback)

    def serve_http(
        self, routes: Iterable[tuple[str, Mapping[str, Route]]]
    ) -> dict[str, HttpEndpoint]:
        """Start one HTTP endpoint per address (``endpoints_by_address``), each stopped with the
        process; by address."""
        endpoints = endpoints_by_address(routes)
        for endpoint in endpoints.values():
            endpoint.start()
            self.on_stop(endpoint.stop)
        return endpoints

    def wait(self) -> int:
        """Until SIGTERM or SIGINT; the exit status of that graceful stop."""
        self.stop.wait()
        return 0


def run_daemon(
    program: Program,
    settings: DaemonSettings,
    *,
    serve: Callable[[Daemon], int],
    user_agent: str,
    connections: int = DEFAULT_CONNECTIONS,
) -> int:
    """Run ``serve`` as described in the module docstring; the process's exit status. The API
    client sends ``user_agent`` and keeps up to ``connections`` connections alive (one for each
    thread that writes at once)."""
    configure_logging(
        level=settings.log_level, log_format=settings.log_format, fields=program.log_fields
    )
    stop = stop_on_signals(logger=program.logger)
    try:
        if settings.kubeconfig is not None and settings.kube_api_url is None:
            check_file(Path(settings.kubeconfig), flag="--kubeconfig")
        with contextlib.ExitStack() as stack:
            client = ClientSettings(
                qps=settings.kube_api_qps,
                burst=settings.kube_api_burst,
                connection_pool_maxsize=connections,
                user_agent=user_agent,
            )
            api = connect(
                kubeconfig=settings.kubeconfig, url=settings.kube_api_url, settings=client
            )
            stack.callback(api.close)
            try:
                return serve(Daemon(api=api, stop=stop, stack=stack))
            finally:
                stop.set()
    except ConfigError as exc:
        return refuse(program.name, str(exc))
    except (DriverError, OSError) as exc:
        program.logger.error("%s failed: %s", program.name, exc)
        return EXIT_FAILED
