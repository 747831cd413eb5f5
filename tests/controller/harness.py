"""A cluster for controller tests on the local API server: nodes publishing slices as the kubelet
plugin does, DeviceClasses as deploy/ ships them, claims and pods as users and kube-controller-
manager create them, controllers run in-process, and the overlap check every test ends with."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from typing import Any

from api import wire
from api.names import (
    DEVICE_CLASS_ANY,
    DRIVER_NAME,
    SCHEDULING_GATE,
    classic_resource_name,
    profile_device_class,
)
from controller.allocation.allocator import AllocatorConfig
from controller.allocation.sync import SyncConfig
from controller.app import Controller
from driver.cluster import ops
from driver.cluster.kube import KubeClusterApi, configuration_for_url
from driver.cluster.leader import LeaderElectionConfig
from driver.cluster.port import (
    DEVICE_CLASSES,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    ClusterApi,
    JsonObject,
    gate_names,
)
from driver.cluster.throttle import ClientSettings
from driver.mig.catalog import CATALOG
from driver.resourceslices import GpuInventory, build_pool, complete_pools, parse_devices
from driver.taints import DeviceTaint
from localcluster.apiserver import LocalApiServer

NS = "default"
KUEUE_GATE = "kueue.x-k8s.io/admission"


def client(server: LocalApiServer, *, workers: int = 8) -> KubeClusterApi:
    settings = ClientSettings(qps=0, connection_pool_maxsize=max(8, workers + 8))
    return KubeClusterApi(configuration=configuration_for_url(server.url), settings=settings)


def cluster_api(server: LocalApiServer, stack: ExitStack, *, workers: int = 8) -> KubeClusterApi:
    """A client closed with ``stack``, on a cluster that has our DeviceClasses (the setup every
    in-process controller test starts from; tests publish their own nodes)."""
    api = stack.enter_context(client(server, workers=workers))
    create_device_classes(api)
    return api


# -- objects -----------------------------------------------------------------------------------


def node_object(
    name: str,
    *,
    cpu: str = "64",
    memory: str = "512Gi",
    labels: dict[str, str] | None = None,
    taints: Sequence[JsonObject] = (),
) -> JsonObject:
    spec: JsonObject = {"taints": list(taints)} if taints else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": spec,
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}},
    }


def publish_node(
    api: ClusterApi,
    name: str,
    *,
    gpus: int = 8,
    model: str = "A100-40GB",
    device_taints: Mapping[int, Sequence[DeviceTaint]] | None = None,
    **node: Any,
) -> JsonObject:
    """A Node and its ResourceSlices, as the kubelet plugin publishes them (``device_taints``:
    GPU index → taints on each of its devices, as for an unhealthy GPU)."""
    gpu_model = CATALOG[model]
    node_obj = node_object(name, **node)
    # what the device-plugin shim advertises for classic requests (kube-scheduler needs it)
    node_obj["status"]["allocatable"].update(
        {classic_resource_name(p.name): str(p.max_count * gpus) for p in gpu_model.profiles}
    )
    created = api.create(NODES, node_obj)
    owner: wire.OwnerReference = {
        "apiVersion": "v1",
        "kind": "Node",
        "name": name,
        "uid": created["metadata"]["uid"],
    }
    inventory = [
        GpuInventory(
            index=i,
            uuid=f"GPU-{name}-{i}",
            product_name=gpu_model.product_name,
            memory_slices=gpu_model.memory_slices,
            profiles=gpu_model.profiles,
        )
        for i in range(gpus)
    ]
    for slice_obj in build_pool(
        node=name, gpus=inventory, generation=1, owner=owner, taints=device_taints
    ):
        api.create(RESOURCE_SLICES, slice_obj)
    return created


def selector(expression: str) -> JsonObject:
    return {"cel": {"expression": expression}}


def profile_expression(profile: str) -> str:
    return f'device.attributes["{DRIVER_NAME}"].profile == "{profile}"'


def create_device_classes(api: ClusterApi) -> None:
    """Our classes, as deploy/base/deviceclasses.yaml has them."""
    driver = f'device.driver == "{DRIVER_NAME}"'
    api.create(
        DEVICE_CLASSES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DEVICE_CLASS_ANY},
            "spec": {"selectors": [selector(driver)]},
        },
    )
    profiles = sorted({p for m in CATALOG.values() for p in m.profile_names})
    for profile in profiles:
        api.create(
            DEVICE_CLASSES,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": profile_device_class(profile)},
                "spec": {"selectors": [selector(f"{driver} && {profile_expression(profile)}")]},
            },
        )


def request(
    name: str = "mig",
    *,
    profile: str | None = "1g.5gb",
    device_class: str | None = None,
    count: int = 1,
    selectors: Sequence[str] = (),
    all_devices: bool = False,
    tolerations: Sequence[JsonObject] = (),
) -> JsonObject:
    exactly: JsonObject = {
        "deviceClassName": device_class or (profile_device_class(profile) if profile else ""),
    }
    if all_devices:
        exactly["allocationMode"] = "All"
    else:
        exactly["count"] = count
    if selectors:
        exactly["selectors"] = [selector(s) for s in selectors]
    if tolerations:
        exactly["tolerations"] = list(tolerations)
    return {"name": name, "exactly": exactly}


def claim_object(
    name: str,
    *,
    requests: Sequence[JsonObject] = (),
    constraints: Sequence[JsonObject] = (),
    config: Sequence[JsonObject] = (),
) -> JsonObject:
    devices: JsonObject = {"requests": list(requests) or [request()]}
    if constraints:
        devices["constraints"] = list(constraints)
    if config:
        devices["config"] = list(config)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": devices},
    }


def pod_object(
    name: str,
    *,
    claims: Iterable[str] = (),
    gates: Sequence[str] = (SCHEDULING_GATE,),
    classic: dict[str, int] | None = None,
    cpu: str | None = None,
    **spec: Any,
) -> JsonObject:
    container: JsonObject = {"name": "main", "image": "busybox:1"}
    resources: JsonObject = {}
    if classic:
        resources["limits"] = {k: str(v) for k, v in classic.items()}
    if cpu:
        resources["requests"] = {"cpu": cpu}
    if resources:
        container["resources"] = resources
    body: JsonObject = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": [container], **spec},
    }
    claim_names = list(claims)
    if claim_names:
        body["spec"]["resourceClaims"] = [
            {"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claim_names)
        ]
    if gates:
        body["spec"]["schedulingGates"] = [{"name": g} for g in gates]
    return body


def release_claim(api: ClusterApi, name: str) -> None:
    """What kube-controller-manager does once a claim's last consumer is gone: clear the
    allocation, drop the delete-protection finalizer, (here also) delete the claim."""
    claim = ops.clear_claim_allocation(api, claim=api.get(RESOURCE_CLAIMS, name=name, namespace=NS))
    claim["metadata"]["finalizers"] = []
    api.update(RESOURCE_CLAIMS, claim)
    api.delete(RESOURCE_CLAIMS, name=name, namespace=NS)


def create_pod_with_claim(api: ClusterApi, name: str, claim: JsonObject | None = None) -> None:
    """A claim (default: one 1g.5gb, named ``<pod>-claim``) and a gated pod using it."""
    claim = claim or claim_object(f"{name}-claim")
    api.create(RESOURCE_CLAIMS, claim, namespace=NS)
    api.create(PODS, pod_object(name, claims=[claim["metadata"]["name"]]), namespace=NS)


# -- controllers -------------------------------------------------------------------------------


def start_controller(
    server: LocalApiServer,
    stack: ExitStack,
    *,
    identity: str = "controller-a",
    workers: int = 8,
    leader_election: bool = False,
    lease_duration: int = 2,
    sync: SyncConfig | None = None,
) -> Controller:
    api = stack.enter_context(client(server, workers=workers))
    election = (
        LeaderElectionConfig(
            identity=identity,
            namespace=NS,
            lease_duration=lease_duration,
            renew_deadline=lease_duration * 0.6,
            retry_period=lease_duration * 0.2,
        )
        if leader_election
        else None
    )
    controller = Controller(
        api=api,
        config=AllocatorConfig(workers=workers, name=identity, sync=sync or SyncConfig()),
        leader_election=election,
        identity=identity,
    )
    controller.start()
    stack.callback(controller.stop)
    return controller


# -- waiting and checking ----------------------------------------------------------------------


def wait_for(predicate: Callable[[], Any], *, timeout: float = 10.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.02)


def wait_for_progress(
    count: Callable[[], int],
    *,
    target: int = 0,
    stall: float = 60.0,
    interval: float = 0.25,
    what: str = "",
) -> None:
    """Poll ``count`` (work left: gated pods, say) until it is at most ``target``; fail only when
    it has not gone down for ``stall`` seconds. A slow, loaded machine is not a stuck controller:
    this waits as long as work gets done, and still catches work that is never done. ``interval``
    is long enough that the polling (a list of every pod, say) does not starve the controllers it
    waits for, which share this process."""
    best = count()
    progressed = time.monotonic()
    while best > target:
        time.sleep(interval)
        now = count()
        if now < best:
            best, progressed = now, time.monotonic()
        elif time.monotonic() - progressed > stall:
            raise AssertionError(
                f"timed out waiting for {what or count}: {best} left (target {target}), "
                f"none done for {stall:.0f}s"
            )


def get_pod(api: ClusterApi, name: str) -> JsonObject:
    return api.get(PODS, name=name, namespace=NS)


def ungated(api: ClusterApi, name: str) -> bool:
    return SCHEDULING_GATE not in gate_names(get_pod(api, name))


def placement_condition(pod: JsonObject) -> JsonObject | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "instaslice.dev/Placement":
            return dict(condition)
    return None


def condition_reason(api: ClusterApi, name: str) -> str | None:
    condition = placement_condition(get_pod(api, name))
    return None if condition is None else str(condition.get("reason"))


def allocated_claims(api: ClusterApi) -> list[JsonObject]:
    return [
        c
        for c in api.list_objects(RESOURCE_CLAIMS, namespace=NS).items
        if (c.get("status") or {}).get("allocation")
    ]


def assert_no_overlap(api: ClusterApi) -> int:
    """No (node, device) allocated twice and no two allocated slices sharing a memory slice (or the
    media engine) on one GPU; returns how many devices are allocated."""
    slices = api.list_objects(RESOURCE_SLICES).items
    devices = {
        (d.node, d.name): d for pool in complete_pools(slices).values() for d in parse_devices(pool)
    }
    taken: dict[tuple[str, str], str] = {}
    per_gpu: dict[tuple[str, int], list[tuple[int, int, bool, str]]] = {}
    for claim in allocated_claims(api):
        who = claim["metadata"]["name"]
        for result in claim["status"]["allocation"]["devices"]["results"]:
            if result["driver"] != DRIVER_NAME:
                continue
            key = (result["pool"], result["device"])
            assert key not in taken, f"{key} allocated to {taken[key]} and {who}"
            taken[key] = who
            device = devices[key]
            per_gpu.setdefault((device.node, device.gpu_index), []).append(
                (device.placement.start, device.placement.end, device.media_extensions, who)
            )
    for gpu, slots in per_gpu.items():
        for i, (start, end, media, who) in enumerate(slots):
            for other_start, other_end, other_media, other in slots[i + 1 :]:
                assert not (start < other_end and other_start < end), (
                    f"{who} and {other} overlap on GPU {gpu}"
                )
                assert not (media and other_media), f"{who} and {other} share the +me engine"
    return len(taken)
