"""A stand-in controller for ``bench real --paths stubcontroller``: a yardstick, not a product path.

It does per pod exactly the API work our controller must do on the real control plane, and
nothing else: watch pods and claims (the product's informers, transport and watch decoding, with
the same managed-fields transform), then for each pod carrying our scheduling gate write its claim's
delete-protection finalizer, its ``status.allocation`` (reserved for the pod), the pod's
``status.nominatedNodeName`` and lift the gate — the same four writes through the same
``driver.cluster.ops`` functions. There is no placement search, no cache of occupancy, no overlap
check, no metrics, no webhook: each pod takes the next device of a list of ``PROFILE`` devices with
disjoint memory slices, made once from the published ResourceSlices at start. So its CPU per pod is
what the protocol costs a Python controller on this transport — the floor under our controller's
figure, against which the product's CPU per placed pod is judged.

Only for the benchmark's own pods (each names one pre-made claim, asks ``PROFILE``); anything else
is left alone. ``python -m bench.controllerstub --kubeconfig K --healthz-address H:P --workers N``;
``/readyz`` answers 200 once both informers have synced.
"""

from __future__ import annotations

import argparse
import collections
import http.server
import logging
import queue
import signal
import sys
import threading
from collections.abc import Sequence
from datetime import UTC, datetime

from api.names import DRIVER_NAME, SCHEDULING_GATE
from bench.realnodes import PROFILE
from controller.allocation.results import node_selector
from driver.cluster import ops
from driver.cluster.informer import Informer, ListWatch, strip_managed_fields
from driver.cluster.kube import KubeClusterApi, connect
from driver.cluster.port import (
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    Body,
    JsonObject,
    gate_names,
    name_of,
    namespace_of,
)
from driver.cluster.throttle import ClientSettings
from driver.cluster.views import ClaimView
from driver.errors import ClusterError
from driver.resourceslices import complete_pools, parse_devices

logger = logging.getLogger("controllerstub")


def free_devices(slices: Sequence[Body]) -> list[tuple[str, str]]:
    """(node, device) of every published ``PROFILE`` device, keeping only devices whose memory
    slices overlap none kept before on their GPU, node by node, GPU by GPU."""
    kept: list[tuple[str, str]] = []
    used: dict[tuple[str, int], int] = collections.defaultdict(int)
    devices = [d for pool in complete_pools(slices).values() for d in parse_devices(pool)]
    for device in sorted(devices, key=lambda d: (d.node, d.gpu_index, d.placement.start)):
        key = (device.node, device.gpu_index)
        if device.profile == PROFILE and not used[key] & device.placement.mask:
            used[key] |= device.placement.mask
            kept.append((device.node, device.name))
    return kept


class Stub:
    def __init__(self, api: KubeClusterApi, *, workers: int, nominate: bool = True) -> None:
        self._api = api
        self._nominate = nominate
        self._devices = collections.deque(
            free_devices(
                api.list_objects(RESOURCE_SLICES, field_selector=f"spec.driver={DRIVER_NAME}").items
            )
        )
        self._lock = threading.Lock()
        self._queued: set[str] = set()
        self._done: set[str] = set()
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.pods = Informer(
            source=ListWatch(api, PODS), name="stub-pods", transform=strip_managed_fields
        )
        self.claims = Informer(
            source=ListWatch(api, RESOURCE_CLAIMS),
            name="stub-claims",
            transform=strip_managed_fields,
        )
        self.pods.add_handler(on_add=self._seen, on_update=lambda _old, new: self._seen(new))
        self._workers = [
            threading.Thread(target=self._work, name=f"stub-worker-{i}", daemon=True)
            for i in range(workers)
        ]

    def start(self) -> None:
        self.claims.start()
        self.pods.start()
        for worker in self._workers:
            worker.start()

    def ready(self) -> bool:
        return self.pods.has_synced() and self.claims.has_synced()

    def stop(self) -> None:
        for _ in self._workers:
            self._queue.put(None)
        self.pods.stop()
        self.claims.stop()

    def _seen(self, pod: JsonObject) -> None:
        if SCHEDULING_GATE not in gate_names(pod):
            return
        key = f"{namespace_of(pod)}/{name_of(pod)}"
        with self._lock:
            if key in self._queued or key in self._done:
                return
            self._queued.add(key)
        self._queue.put(key)

    def _work(self) -> None:
        while (key := self._queue.get()) is not None:
            try:
                placed = self._place(key)
            except ClusterError as exc:
                logger.warning("pod %s: %s; trying again", key, exc)
                placed = False
            with self._lock:
                self._queued.discard(key)
                if placed:
                    self._done.add(key)
            if not placed:
                threading.Timer(0.2, self._requeue, args=(key,)).start()

    def _requeue(self, key: str) -> None:
        pod = self.pods.get_by_key(key)
        if pod is not None:
            self._seen(pod)

    def _place(self, key: str) -> bool:
        """The four writes for one pod; False if its claim is not cached yet."""
        pod = self.pods.get_by_key(key)
        if pod is None or SCHEDULING_GATE not in gate_names(pod):
            return True
        claims = (pod.get("spec") or {}).get("resourceClaims") or []
        claim_name = claims[0].get("resourceClaimName") if claims else None
        claim = self.claims.get(claim_name, namespace=namespace_of(pod)) if claim_name else None
        if claim is None:
            return False
        allocation = ClaimView.of(claim).allocation
        if allocation is None:
            with self._lock:
                node, device = self._devices.popleft()
            claim = ops.add_claim_finalizer(self._api, claim=claim)
            ops.write_claim_allocation(
                self._api,
                claim=claim,
                allocation={
                    "devices": {
                        "results": [
                            {
                                "request": "mig",
                                "driver": DRIVER_NAME,
                                "pool": node,
                                "device": device,
                            }
                        ]
                    },
                    "nodeSelector": node_selector(node),
                },
                allocated_at=datetime.now(UTC),
                reserved_for=[ops.pod_reference(pod)],
            )
        else:  # allocated by an earlier try whose later writes failed
            node = allocation.node_names()[0]
        if self._nominate:
            pod = ops.nominate_node(self._api, pod=pod, node=node)
        ops.remove_scheduling_gate(self._api, pod=pod)
        return True


def _serve_health(address: str, stub: Stub) -> http.server.ThreadingHTTPServer:
    host, _, port = address.rpartition(":")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path in ("/readyz", "/healthz") and stub.ready()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer((host, int(port)), Handler)
    threading.Thread(target=server.serve_forever, name="stub-health", daemon=True).start()
    return server


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.controllerstub", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--healthz-address", required=True, help="HOST:PORT for /readyz")
    parser.add_argument("--workers", type=int, default=48)
    parser.add_argument(
        "--nominate-node",
        dest="nominate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write status.nominatedNodeName (default); --no-nominate-node: three writes per "
        "pod, as the controller's flag of the same name",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    api = connect(
        kubeconfig=args.kubeconfig,
        settings=ClientSettings(  # as the controller's defaults
            qps=500.0,
            burst=1000,
            connection_pool_maxsize=args.workers + 16,
            user_agent="controllerstub",
        ),
    )
    stub = Stub(api, workers=args.workers, nominate=args.nominate)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = _serve_health(args.healthz_address, stub)
    stub.start()
    stop.wait()
    server.shutdown()
    stub.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
