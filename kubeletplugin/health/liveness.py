"""Liveness: both plugin sockets really answer, the way the kubelet would call them.

As NVIDIA's and the example driver's health servers do, ``/healthz`` dials the registration socket
(``GetInfo``) and the DRA socket (``NodePrepareResources`` with an empty request, which must
succeed), and reports a failed registration the kubelet told us about (``NotifyRegistrationStatus``).
It also lists unhealthy GPUs, for a person reading the body, without failing: a broken GPU is not
cured by restarting the plugin (its devices are tainted instead, see ``publisher``).
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from kubeletplugin.dra.registration import RegistrationTracker
from kubeletplugin.node.inventory import NodeInventory
from protos.dra.v1 import api_pb2 as dra_v1
from protos.dra.v1 import api_pb2_grpc as dra_v1_grpc
from protos.pluginregistration import api_pb2 as reg
from protos.pluginregistration import api_pb2_grpc as reg_grpc


@dataclass(frozen=True, slots=True)
class HealthReport:
    ok: bool
    checks: tuple[str, ...]

    def body(self) -> bytes:
        return ("\n".join(self.checks) + "\n").encode()


class HealthChecker:
    def __init__(
        self,
        *,
        registration_socket: Path,
        dra_socket: Path,
        tracker: RegistrationTracker,
        timeout_seconds: float = 2.0,
        inventory: Callable[[], NodeInventory] | None = None,
    ) -> None:
        self._registration_socket = registration_socket
        self._dra_socket = dra_socket
        self._tracker = tracker
        self._timeout = timeout_seconds
        self._inventory = inventory

    def check(self) -> HealthReport:
        checks: list[str] = []
        ok = True
        try:
            with grpc.insecure_channel(f"unix://{self._registration_socket}") as channel:
                info = reg_grpc.RegistrationStub(channel).GetInfo(
                    reg.InfoRequest(), timeout=self._timeout
                )
            checks.append(f"ok: registration socket answers GetInfo ({info.name})")
        except grpc.RpcError as exc:
            ok = False
            checks.append(f"fail: registration socket {self._registration_socket}: {_why(exc)}")
        try:
            with grpc.insecure_channel(f"unix://{self._dra_socket}") as channel:
                dra_v1_grpc.DRAPluginStub(channel).NodePrepareResources(
                    dra_v1.NodePrepareResourcesRequest(), timeout=self._timeout
                )
            checks.append("ok: DRA socket answers NodePrepareResources")
        except grpc.RpcError as exc:
            ok = False
            checks.append(f"fail: DRA socket {self._dra_socket}: {_why(exc)}")
        state = self._tracker.state
        if state.registered is False:
            ok = False
            checks.append(f"fail: kubelet reported registration failure: {state.error}")
        elif state.registered is None:
            checks.append("ok: kubelet has not reported registration yet")
        else:
            checks.append("ok: registered with the kubelet")
        if self._inventory is not None:
            checks.append(_gpu_health_line(self._inventory()))
        return HealthReport(ok=ok, checks=tuple(checks))

    def route(self) -> tuple[int, str, bytes]:
        """``/healthz``: 200 when healthy, 503 otherwise; the body lists each check."""
        report = self.check()
        return (200 if report.ok else 503), "text/plain; charset=utf-8", report.body()

    def ready_route(self) -> tuple[int, str, bytes]:
        """``/readyz``: healthy *and* registered by the kubelet. A plugin the kubelet never
        registered serves no pod (its sockets are where no kubelet looks): not ready, though
        alive (``kubeletplugin.dra.registration.RegistrationWatchdog`` says why on the Node)."""
        report = self.check()
        ok = report.ok and self._tracker.state.registered is True
        body = report.body() + (b"" if ok or not report.ok else b"not ready: not registered\n")
        return (200 if ok else 503), "text/plain; charset=utf-8", body


def _gpu_health_line(inventory: NodeInventory) -> str:
    unhealthy = inventory.unhealthy_gpus
    total = len(inventory.gpus) + len(inventory.non_mig_gpus) + len(unhealthy)
    if not unhealthy:
        return f"ok: {total} GPUs, none unhealthy"
    listed = "; ".join(f"GPU {g.index}: {g.health_reason or 'no reason given'}" for g in unhealthy)
    return f"ok: {len(unhealthy)} of {total} GPUs unhealthy, their devices tainted ({listed})"


def _why(exc: grpc.RpcError) -> str:
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    name = getattr(code(), "name", "error") if callable(code) else "error"
    return f"{name}: {details() if callable(details) else exc}"
