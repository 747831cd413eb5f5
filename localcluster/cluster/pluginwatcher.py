"""The kubelet's plugin watcher and DRA plugin manager, for one emulated node.

The real kubelet watches ``plugins_registry/``: a new socket is dialled, ``GetInfo`` says what it
is; a ``DRAPlugin`` offering ``v1.DRAPlugin`` (preferred) or ``v1beta1.DRAPlugin`` is registered
under its driver name with the endpoint it names, then told ``NotifyRegistrationStatus(true)``;
anything else is told ``false`` with the reason. A socket that disappears deregisters its plugin,
one that is re-created (a restarted plugin) is registered again; failed attempts are retried with
backoff. Like the kubelet's client, the DRA endpoint is not dialled until the first call.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from localcluster.cluster.grpcutil import CALL_TIMEOUT_S, dial
from protos.dra.v1 import api_pb2 as dra_v1
from protos.dra.v1 import api_pb2_grpc as dra_v1_grpc
from protos.dra.v1beta1 import api_pb2 as dra_v1beta1
from protos.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from protos.pluginregistration import api_pb2 as reg_pb2
from protos.pluginregistration import api_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)

DRA_PLUGIN_TYPE = "DRAPlugin"
DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
"""Services the kubelet can use, in the order it prefers them."""
_RETRY_INITIAL_S = 0.1
_RETRY_MAX_S = 2.0


@dataclass(frozen=True, slots=True)
class DraClaim:
    """What the kubelet sends for one claim: nothing but its identity."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PrepareResult:
    """One claim's answer: ``error`` non-empty means it failed (its devices are ignored)."""

    error: str
    devices: tuple[PreparedDevice, ...] = ()


class DraPluginClient:
    """The kubelet's client of one registered DRA plugin."""

    def __init__(self, *, driver: str, endpoint: str, service: str) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.service = service
        self._channel = grpc.insecure_channel(f"unix:{endpoint}")
        if service == "v1.DRAPlugin":
            self._pb: object = dra_v1
            self._stub: object = dra_v1_grpc.DRAPluginStub(self._channel)
        else:
            self._pb = dra_v1beta1
            self._stub = dra_v1beta1_grpc.DRAPluginStub(self._channel)

    def _request(self, name: str, claims: Sequence[DraClaim]) -> object:
        message = getattr(self._pb, name)
        claim_type = self._pb.Claim  # type: ignore[attr-defined]
        return message(
            claims=[claim_type(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
        )

    def prepare(self, claims: Sequence[DraClaim]) -> dict[str, PrepareResult]:
        """``NodePrepareResources``; a claim missing from the answer is reported as failed."""
        request = self._request("NodePrepareResourcesRequest", claims)
        response = self._stub.NodePrepareResources(request, timeout=CALL_TIMEOUT_S)  # type: ignore[attr-defined]
        results: dict[str, PrepareResult] = {}
        for claim in claims:
            if claim.uid not in response.claims:
                results[claim.uid] = PrepareResult(error="claim missing from the plugin's answer")
                continue
            answer = response.claims[claim.uid]
            devices = tuple(
                PreparedDevice(
                    request_names=tuple(d.request_names),
                    pool=d.pool_name,
                    device=d.device_name,
                    cdi_device_ids=tuple(d.cdi_device_ids),
                )
                for d in answer.devices
            )
            results[claim.uid] = PrepareResult(error=answer.error, devices=devices)
        return results

    def unprepare(self, claims: Sequence[DraClaim]) -> dict[str, str]:
        """``NodeUnprepareResources``: claim uid → error ("" when done)."""
        request = self._request("NodeUnprepareResourcesRequest", claims)
        response = self._stub.NodeUnprepareResources(request, timeout=CALL_TIMEOUT_S)  # type: ignore[attr-defined]
        return {
            c.uid: (
                response.claims[c.uid].error
                if c.uid in response.claims
                else "claim missing from the plugin's answer"
            )
            for c in claims
        }

    def close(self) -> None:
        self._channel.close()


class DraPluginRegistry:
    """Registered DRA plugins by driver name; the latest registration of a driver wins."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_path: dict[Path, DraPluginClient] = {}
        self._order: list[Path] = []

    def get(self, driver: str) -> DraPluginClient | None:
        with self._lock:
            for path in reversed(self._order):
                client = self._by_path[path]
                if client.driver == driver:
                    return client
        return None

    def drivers(self) -> list[str]:
        with self._lock:
            return sorted({c.driver for c in self._by_path.values()})

    def add(self, path: Path, client: DraPluginClient) -> None:
        with self._lock:
            old = self._by_path.pop(path, None)
            if path in self._order:
                self._order.remove(path)
            self._by_path[path] = client
            self._order.append(path)
        if old is not None:
            old.close()

    def remove(self, path: Path) -> None:
        with self._lock:
            client = self._by_path.pop(path, None)
            if path in self._order:
                self._order.remove(path)
        if client is not None:
            log.info("deregistered DRA plugin %s (%s)", client.driver, path)
            client.close()

    def close(self) -> None:
        with self._lock:
            clients = list(self._by_path.values())
            self._by_path.clear()
            self._order.clear()
        for client in clients:
            client.close()


@dataclass(slots=True)
class _Attempt:
    identity: tuple[int, int]
    registered: bool = False
    next_try: float = 0.0
    delay: float = _RETRY_INITIAL_S


class PluginWatcher:
    """Polls the registration directory (the kubelet uses inotify; the outcome is the same)."""

    def __init__(
        self, *, directory: Path, registry: DraPluginRegistry, poll_interval: float = 0.05
    ) -> None:
        self._dir = directory
        self._registry = registry
        self._poll = poll_interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._known: dict[Path, _Attempt] = {}
        self.registrations = 0
        """Successful registrations so far (for tests)."""

    def start(self) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"plugin-watcher-{self._dir}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15.0)
            self._thread = None
        for path in list(self._known):
            self._registry.remove(path)
        self._known.clear()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._scan()
            except Exception:
                log.exception("plugin watcher on %s failed", self._dir)
            self._stop.wait(self._poll)

    def _sockets(self) -> dict[Path, tuple[int, int]]:
        found: dict[Path, tuple[int, int]] = {}
        try:
            entries = list(os.scandir(self._dir))
        except FileNotFoundError:
            return found
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISSOCK(info.st_mode):
                found[Path(entry.path)] = (info.st_ino, info.st_mtime_ns)
        return found

    def _scan(self) -> None:
        now = time.monotonic()
        current = self._sockets()
        for path in list(self._known):
            if current.get(path) != self._known[path].identity:
                self._known.pop(path)
                self._registry.remove(path)
        for path, identity in sorted(current.items()):
            attempt = self._known.setdefault(path, _Attempt(identity=identity))
            if attempt.registered or now < attempt.next_try or self._stop.is_set():
                continue
            if self._register(path):
                attempt.registered = True
                self.registrations += 1
            else:
                attempt.next_try = now + attempt.delay
                attempt.delay = min(_RETRY_MAX_S, attempt.delay * 2)

    def _register(self, path: Path) -> bool:
        try:
            channel = dial(path, timeout=1.0)
        except grpc.FutureTimeoutError:
            log.debug("plugin socket %s does not answer yet", path)
            return False
        try:
            stub = reg_grpc.RegistrationStub(channel)
            try:
                info = stub.GetInfo(reg_pb2.InfoRequest(), timeout=CALL_TIMEOUT_S)
            except grpc.RpcError as exc:
                log.info("GetInfo on %s failed: %s", path, exc)
                return False
            problem = self._validate(info)
            if problem:
                self._notify(stub, registered=False, error=problem)
                log.warning("plugin at %s refused: %s", path, problem)
                return True  # told; not retried until the socket changes
            service = next(s for s in DRA_SERVICES if s in info.supported_versions)
            client = DraPluginClient(driver=info.name, endpoint=info.endpoint, service=service)
            self._registry.add(path, client)
            if not self._notify(stub, registered=True, error=""):
                self._registry.remove(path)
                return False
            log.info("registered DRA plugin %s at %s (%s)", info.name, info.endpoint, service)
            return True
        finally:
            channel.close()

    @staticmethod
    def _validate(info: reg_pb2.PluginInfo) -> str:
        if info.type != DRA_PLUGIN_TYPE:
            return f"RegisterPlugin error -- no handler registered for plugin type: {info.type}"
        if not info.name:
            return "RegisterPlugin error -- plugin name is empty"
        if not any(s in info.supported_versions for s in DRA_SERVICES):
            return (
                "RegisterPlugin error -- plugin validation failed with err: none of the "
                f"supported services {list(info.supported_versions)} are known: {list(DRA_SERVICES)}"
            )
        return ""

    @staticmethod
    def _notify(stub: reg_grpc.RegistrationStub, *, registered: bool, error: str) -> bool:
        try:
            stub.NotifyRegistrationStatus(
                reg_pb2.RegistrationStatus(plugin_registered=registered, error=error),
                timeout=CALL_TIMEOUT_S,
            )
        except grpc.RpcError as exc:
            if registered:
                log.info("NotifyRegistrationStatus failed: %s", exc)
                return False
        return True
