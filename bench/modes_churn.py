"""The mixed-profile churn workload of ``python -m bench.modes --workload churn``.

A request trace from ``instaslice.planning.trace.synthesize`` (Poisson arrivals, exponential lifetimes,
a weighted profile mix with some multi-slice claims, offered load near the fleet's memory slices,
one seed for both modes) is played in real time against the real control plane: at its arrival each
request becomes a ResourceClaim (``count`` slices of its profile on one GPU: the ``matchAttribute``
constraint on the parent GPU's UUID, as in ``samples/dra-pod-3-slices-one-gpu.yaml``) and a pod
using it. A pod bound to a node within ``patience`` seconds is *placed* and deleted with its claim
after its lifetime; one still unbound then is *rejected* and deleted. Without kubelets pods are
deleted with ``gracePeriodSeconds=0`` (what a kubelet's last step does).

Figures per mode, from the published ResourceSlices and the claims' allocations (an informer):
requests, placed, rejected, *stranded* (rejected although one GPU had enough free memory slices at
that moment, placement rules aside — the fragmentation a policy leaves, as ``instaslice.planning.replay``
counts it), time-weighted mean memory-slice utilization between the first and the last arrival, the
most allocations ever seen sharing a memory slice (must be 0), and create → bound p50/p99 of the
placed requests. The trace's fluid floor (``instaslice.planning.replay.fluid_floor``: no GPU
boundaries, a request rejected *at arrival* if too few memory slices are free) and the product's
first-fit replay of the same trace (same reject-at-arrival rule) are computed offline for
comparison. Neither is a strict bound for the live runs: those let a request wait up to
``patience``, and the fluid floor accepts greedily, which on some traces rejects more than
first-fit does.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from api.names import ATTRIBUTE_PARENT_UUID, DRIVER_NAME, SCHEDULING_GATE, profile_device_class
from bench.controller import _percentile
from driver.cluster.informer import Informer, ListWatch
from driver.cluster.port import (
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    Body,
    JsonObject,
    name_of,
)
from driver.errors import ApiNotFoundError, ClusterError
from driver.resourceslices import complete_pools, parse_devices
from instaslice.planning.fleet import Fleet
from instaslice.planning.replay import fluid_floor, replay
from instaslice.planning.trace import TraceRequest, parse_mix, synthesize
from localcluster.cluster.client import LocalClusterClient

NS = "default"
DEFAULT_MIX = "1g.5gb=40,2g.10gb=18,3g.20gb=12,4g.20gb=8,7g.40gb=8,2*1g.5gb=8,3*1g.5gb=6"
"""Mostly small slices, some whole GPUs, some multi-slice claims (``N*``: N slices on one GPU)."""

GpuKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ChurnSettings:
    load: float = 1.0
    events: int = 320
    mean_duration_s: float = 90.0
    patience_s: float = 30.0
    seed: int = 13
    mix: str = DEFAULT_MIX


def make_trace(fleet: Fleet, settings: ChurnSettings) -> tuple[TraceRequest, ...]:
    return synthesize(
        fleet=fleet,
        mix=parse_mix(settings.mix),
        load=settings.load,
        events=settings.events,
        seed=settings.seed,
        mean_duration=settings.mean_duration_s,
    )


def offline(trace: tuple[TraceRequest, ...], fleet: Fleet) -> dict[str, Any]:
    """The trace's fluid floor and the product's first-fit replay (both reject at arrival)."""
    floor = fluid_floor(trace, fleet)
    first_fit = replay(trace, fleet, policy="firstfit")
    return {
        "fluid_floor_rejected": floor.rejected,
        "first_fit_replay": {
            "accepted": first_fit.accepted,
            "rejected": first_fit.rejected,
            "stranded": first_fit.stranded,
            "mean_utilization": round(first_fit.mean_utilization, 3),
        },
    }


class _Gpus:
    """Published devices by (pool, device) and the memory slices each GPU has."""

    def __init__(self, slices: Sequence[Body]) -> None:
        self.mask: dict[tuple[str, str], tuple[GpuKey, int]] = {}
        self.size: dict[GpuKey, int] = {}
        for pool in complete_pools(slices).values():
            for device in parse_devices(pool):
                key = (device.node, device.gpu_index)
                self.mask[(device.node, device.name)] = (key, device.placement.mask)
                self.size[key] = device.memory_slices_total

    @property
    def capacity(self) -> int:
        return sum(self.size.values())

    def used(self, claims: list[JsonObject]) -> tuple[dict[GpuKey, int], int]:
        """Memory-slice masks in use per GPU, and allocations sharing a slice with another."""
        used: dict[GpuKey, int] = {}
        overlaps = 0
        for claim in claims:
            allocation = (claim.get("status") or {}).get("allocation") or {}
            for result in (allocation.get("devices") or {}).get("results") or []:
                found = self.mask.get((result["pool"], result["device"]))
                if found is None:
                    continue
                key, mask = found
                if used.get(key, 0) & mask:
                    overlaps += 1
                used[key] = used.get(key, 0) | mask
        return used, overlaps

    def stranded(self, used: dict[GpuKey, int], slices: int) -> bool:
        return any(size - used.get(k, 0).bit_count() >= slices for k, size in self.size.items())


@dataclass(slots=True)
class _Request:
    index: int
    request: TraceRequest
    slices: int
    created: float | None = None
    bound: float | None = None
    outcome: str | None = None  # placed | rejected
    stranded: bool = False
    deleted: bool = False


def _claim(name: str, request: TraceRequest) -> JsonObject:
    exactly: JsonObject = {"deviceClassName": profile_device_class(request.profile)}
    devices: JsonObject = {"requests": [{"name": "mig", "exactly": exactly}]}
    if request.count > 1:
        exactly.update(allocationMode="ExactCount", count=request.count)
        devices["constraints"] = [
            {"requests": ["mig"], "matchAttribute": f"{DRIVER_NAME}/{ATTRIBUTE_PARENT_UUID}"}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": devices},
    }


def _pod(name: str, *, gated: bool) -> JsonObject:
    spec: JsonObject = {
        "resourceClaims": [{"name": "mig", "resourceClaimName": name}],
        "containers": [
            {"name": "main", "image": "busybox:1", "resources": {"claims": [{"name": "mig"}]}}
        ],
    }
    if gated:
        spec["schedulingGates"] = [{"name": SCHEDULING_GATE}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def play(
    api: LocalClusterClient,
    trace: tuple[TraceRequest, ...],
    fleet: Fleet,
    settings: ChurnSettings,
    *,
    gated: bool,
) -> dict[str, Any]:
    """Play ``trace`` in real time; the figures of the module docstring."""
    gpus = _Gpus(api.list_objects(RESOURCE_SLICES).items)
    requests = [
        _Request(index=i, request=r, slices=(fleet.slices_of(r.profile) or 0) * r.count)
        for i, r in enumerate(trace)
    ]
    by_name = {f"churn-{r.index:04d}": r for r in requests}
    lock = threading.Lock()

    def seen(pod: JsonObject) -> None:
        if not (pod.get("spec") or {}).get("nodeName"):
            return
        with lock:
            item = by_name.get(name_of(pod))
            if item is not None and item.bound is None:
                item.bound = time.monotonic()

    pods = Informer(source=ListWatch(api, PODS, namespace=NS), name="bench-churn-pods")
    pods.add_handler(on_add=seen, on_update=lambda old, new: seen(new))
    claims = Informer(source=ListWatch(api, RESOURCE_CLAIMS, namespace=NS), name="bench-churn-rc")
    for informer in (pods, claims):
        informer.start()
        informer.wait_for_sync(timeout=30)

    def create(item: _Request) -> None:
        name = f"churn-{item.index:04d}"
        api.create(RESOURCE_CLAIMS, _claim(name, item.request), namespace=NS)
        with lock:
            item.created = time.monotonic()
        api.create(PODS, _pod(name, gated=gated), namespace=NS)

    def delete(item: _Request) -> None:
        name = f"churn-{item.index:04d}"
        pod = pods.get(name, namespace=NS)
        try:
            if pod is not None:
                api.delete_pod_now(namespace=NS, name=name, uid=str(pod["metadata"]["uid"]))
            api.delete(RESOURCE_CLAIMS, name=name, namespace=NS)
        except ApiNotFoundError:
            pass

    area = 0.0
    max_overlaps = 0
    samples = 0
    workers = ThreadPoolExecutor(8)
    start = time.monotonic()
    last_arrival = start + trace[-1].t
    last_sample = start
    pending = list(requests)
    try:
        while True:
            now = time.monotonic()
            while pending and start + pending[0].request.t <= now:
                workers.submit(create, pending.pop(0))
            used, overlaps = gpus.used(claims.list())
            max_overlaps = max(max_overlaps, overlaps)
            in_use = sum(m.bit_count() for m in used.values())
            if last_sample < last_arrival:
                area += in_use * (min(now, last_arrival) - last_sample)
                samples += 1
            last_sample = now
            with lock:
                for item in requests:
                    if item.created is None or item.deleted:
                        continue
                    if item.outcome is None and item.bound is not None:
                        item.outcome = "placed"
                    elif item.outcome is None and now - item.created > settings.patience_s:
                        item.outcome = "rejected"
                        item.stranded = gpus.stranded(used, item.slices)
                    if item.outcome == "rejected" or (
                        item.outcome == "placed"
                        and item.bound is not None
                        and now >= item.bound + item.request.duration
                    ):
                        item.deleted = True
                        workers.submit(delete, item)
                unresolved = any(r.outcome is None for r in requests)
            if not pending and not unresolved:
                break
            time.sleep(0.5)
    except ClusterError:
        workers.shutdown(wait=True, cancel_futures=True)
        raise
    workers.shutdown(wait=True)
    for informer in (pods, claims):
        informer.stop()
    placed = [r for r in requests if r.outcome == "placed"]
    rejected = [r for r in requests if r.outcome == "rejected"]
    latencies = [r.bound - r.created for r in placed if r.bound and r.created]
    span = last_arrival - start
    return {
        "requests": len(requests),
        "placed": len(placed),
        "rejected": len(rejected),
        "stranded": sum(1 for r in rejected if r.stranded),
        "rejected_by_profile": _by_profile(rejected),
        "mean_utilization": round(area / span / gpus.capacity, 3) if span > 0 else 0.0,
        "max_overlaps_seen": max_overlaps,
        "utilization_samples": samples,
        "bound_p50_s": round(statistics.median(latencies), 2) if latencies else None,
        "bound_p99_s": round(_percentile(latencies, 0.99), 2) if latencies else None,
    }


def _by_profile(items: list[_Request]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        key = (
            f"{item.request.count}*{item.request.profile}"
            if item.request.count > 1
            else item.request.profile
        )
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))
