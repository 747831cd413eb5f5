"""What the end-to-end scenarios do to the stack and check on it.

Objects come from ``samples/`` wherever a sample fits (the files users read); the few others are
built here in the same shape. Waits poll the API server; the invariant check reads the GPUs (the
emulated backends' state files), the checkpoints, the CDI directories and the API.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from api import names
from driver.checkpoint import CheckpointStore
from driver.cluster.port import (
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    JsonObject,
    PatchType,
    gate_names,
)
from driver.errors import ApiNotFoundError, DriverError
from instaslice.status import ClusterView, TakenSlice, allocated_claims
from localcluster.manifests import (
    DEPLOYMENTS,
    JOBS,
    REPLICASETS,
    STATEFULSETS,
    load_file,
)
from localcluster.realstack import RealStack
from localcluster.stack import SAMPLES_DIR, InstaSliceStack

T = TypeVar("T")

Stack = InstaSliceStack | RealStack
"""The scenarios run on both: the local emulation and real Kubernetes (``tests/real``)."""

SAMPLES_NS = "instaslice-demo"
QUOTA_NS = "instaslice-quota-demo"
KUEUE_GATE = "kueue.x-k8s.io/admission"
WAIT_S = 20.0


# --- objects ----------------------------------------------------------------------------------


def sample(relative: str) -> list[JsonObject]:
    """The objects of ``samples/<relative>``, as a user applies them."""
    return load_file(SAMPLES_DIR / relative)


def sample_object(relative: str, kind: str, name: str | None = None) -> JsonObject:
    for obj in sample(relative):
        if obj.get("kind") == kind and (name is None or obj["metadata"]["name"] == name):
            return obj
    raise LookupError(f"samples/{relative} has no {kind} {name or ''}")


def renamed(obj: JsonObject, name: str) -> JsonObject:
    copied = copy.deepcopy(obj)
    copied["metadata"]["name"] = name
    return copied


def claim_template(name: str, *, profile: str, count: int = 1, namespace: str) -> JsonObject:
    exactly: JsonObject = {"deviceClassName": names.profile_device_class(profile)}
    if count != 1:
        exactly.update(allocationMode="ExactCount", count=count)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "mig", "exactly": exactly}]}}},
    }


def _pod_with_claim(
    name: str,
    *,
    claim: JsonObject,
    namespace: str,
    gates: Iterable[str] = (),
    annotations: dict[str, str] | None = None,
) -> JsonObject:
    """A pod whose one container uses the pod claim ``mig`` (``claim``: its source)."""
    spec: JsonObject = {
        "resourceClaims": [{"name": "mig", **claim}],
        "containers": [
            {
                "name": "app",
                "image": "busybox:1.36",
                "resources": {"requests": {"cpu": "10m"}, "claims": [{"name": "mig"}]},
            }
        ],
    }
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    metadata: JsonObject = {"name": name, "namespace": namespace}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def dra_pod(
    name: str,
    *,
    template: str,
    namespace: str,
    gates: Iterable[str] = (),
    annotations: dict[str, str] | None = None,
) -> JsonObject:
    """A pod with one claim made from the ResourceClaimTemplate ``template``."""
    return _pod_with_claim(
        name,
        claim={"resourceClaimTemplateName": template},
        namespace=namespace,
        gates=gates,
        annotations=annotations or {},
    )


def claim_pod(name: str, *, claim: str, namespace: str) -> JsonObject:
    """A pod using the existing ResourceClaim ``claim``."""
    return _pod_with_claim(name, claim={"resourceClaimName": claim}, namespace=namespace)


def classic_pod(name: str, *, profile: str, count: int = 1, namespace: str) -> JsonObject:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "busybox:1.36",
                    "resources": {"limits": {names.classic_resource_name(profile): count}},
                }
            ]
        },
    }


def apply(stack: Stack, objects: Iterable[JsonObject]) -> None:
    stack.apply(objects)


# --- reading ----------------------------------------------------------------------------------


def pods(stack: Stack, namespace: str, *, label: str | None = None) -> list[JsonObject]:
    return stack.api.list_objects(PODS, namespace=namespace, label_selector=label).items


def get_pod(stack: Stack, namespace: str, name: str) -> JsonObject | None:
    try:
        return stack.api.get(PODS, name=name, namespace=namespace)
    except ApiNotFoundError:
        return None


def phase(pod: JsonObject | None) -> str:
    if pod is None:
        return "Gone"
    return str((pod.get("status") or {}).get("phase") or "Pending")


def running(pod: JsonObject | None) -> bool:
    return phase(pod) == "Running" and not (pod or {}).get("metadata", {}).get("deletionTimestamp")


def slices_of_pod(
    view: ClusterView, namespace: str, name: str
) -> list[tuple[str, int, TakenSlice]]:
    key = f"{namespace}/{name}"
    return [
        (gpu.node, gpu.index, item)
        for gpu in view.gpus
        for item in gpu.taken
        if any(ref.key == key for ref in item.pods)
    ]


def wait_for(
    stack: Stack,
    predicate: Callable[[], T | None],
    *,
    timeout: float = WAIT_S,
    message: str = "",
    explain: Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate``; on timeout the error says ``message`` and what ``explain`` tells then.
    ``timeout`` is scaled by the stack's ``timeout_scale`` (real kubelets start pods slower)."""
    try:
        return stack.wait_for(
            predicate, timeout=timeout * stack.timeout_scale, interval=0.1, message=message
        )
    except TimeoutError as exc:
        if explain is None:
            raise
        raise TimeoutError(f"{message} {explain()}".strip()) from exc


def wait_running(
    stack: Stack, namespace: str, count: int, *, label: str | None = None
) -> list[JsonObject]:
    """Until exactly ``count`` pods (of ``label``) exist and all run; returns them by name."""

    def check() -> list[JsonObject] | None:
        found = [p for p in pods(stack, namespace, label=label) if phase(p) != "Succeeded"]
        if len(found) == count and all(running(p) for p in found):
            return sorted(found, key=lambda p: str(p["metadata"]["name"]))
        return None

    try:
        return wait_for(stack, check)
    except TimeoutError as exc:
        seen = ", ".join(
            f"{p['metadata']['name']}={phase(p)}{' gated' if is_gated(p) else ''}"
            for p in pods(stack, namespace, label=label)
        )
        raise TimeoutError(
            f"want {count} running pods in {namespace} ({label}); have: {seen}"
        ) from exc


def wait_pod_running(stack: Stack, namespace: str, name: str) -> JsonObject:
    def check() -> JsonObject | None:
        pod = get_pod(stack, namespace, name)
        return pod if pod is not None and running(pod) else None

    return wait_for(stack, check, message=f"pod {namespace}/{name} is not running")


def remove_gate(stack: Stack, pod: JsonObject, gate: str) -> None:
    gates = pod["spec"].get("schedulingGates") or []
    stack.api.patch(
        PODS,
        name=pod["metadata"]["name"],
        namespace=pod["metadata"]["namespace"],
        patch=[
            {"op": "test", "path": "/spec/schedulingGates", "value": gates},
            {
                "op": "replace",
                "path": "/spec/schedulingGates",
                "value": [g for g in gates if g["name"] != gate],
            },
        ],
        patch_type=PatchType.JSON,
    )


def scale(stack: Stack, kind: str, namespace: str, name: str, replicas: int) -> None:
    resource = {"Deployment": DEPLOYMENTS, "StatefulSet": STATEFULSETS}[kind]
    stack.api.patch(
        resource,
        name=name,
        namespace=namespace,
        patch={"spec": {"replicas": replicas}},
        patch_type=PatchType.MERGE,
    )


def container_env(stack: Stack, pod: JsonObject, container: str = "app") -> dict[str, str]:
    """The environment the emulated kubelet started the container with (CDI edits applied)."""
    node = pod["spec"]["nodeName"]
    _, envs = stack.kubelet(node).container_devices(pod["metadata"]["uid"], container)
    return envs


def visible_devices(stack: Stack, pod: JsonObject, container: str = "app") -> set[str]:
    value = container_env(stack, pod, container).get("NVIDIA_VISIBLE_DEVICES", "")
    return {v for v in value.split(",") if v}


def placement_reason(stack: Stack, namespace: str, name: str) -> str | None:
    """The reason of the pod's ``instaslice.dev/Placement`` condition (None without one)."""
    pod = get_pod(stack, namespace, name) or {}
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == names.PLACEMENT_CONDITION:
            return str(condition.get("reason"))
    return None


def is_gated(pod: JsonObject | None) -> bool:
    return pod is not None and names.SCHEDULING_GATE in gate_names(pod)


# --- cleaning up ------------------------------------------------------------------------------


def delete_everything(stack: Stack, namespaces: Iterable[str]) -> None:
    """What a user deletes: workloads, pods, claims they made, templates (shadow claims go with
    their pods; generated claims with theirs)."""
    api = stack.api
    for namespace in namespaces:
        for resource in (DEPLOYMENTS, STATEFULSETS, JOBS, REPLICASETS):
            for obj in api.list_objects(resource, namespace=namespace).items:
                _delete(stack, resource, obj, propagation="Background")
        for pod in api.list_objects(PODS, namespace=namespace).items:
            _delete(stack, PODS, pod)
        for claim in api.list_objects(RESOURCE_CLAIMS, namespace=namespace).items:
            owners = claim["metadata"].get("ownerReferences") or []
            if not any(o.get("kind") == "Pod" for o in owners):
                _delete(stack, RESOURCE_CLAIMS, claim)
        for template in api.list_objects(RESOURCE_CLAIM_TEMPLATES, namespace=namespace).items:
            _delete(stack, RESOURCE_CLAIM_TEMPLATES, template)


def _delete(
    stack: Stack, resource: Any, obj: JsonObject, *, propagation: str | None = None
) -> None:
    with contextlib.suppress(ApiNotFoundError):
        stack.api.delete(
            resource,
            name=obj["metadata"]["name"],
            namespace=obj["metadata"].get("namespace"),
            propagation_policy=propagation,
        )


# --- invariants -------------------------------------------------------------------------------


def invariant_violations(stack: Stack, namespaces: Iterable[str] = ()) -> list[str]:
    """What must hold whenever the cluster has settled (docs/design.md D1: every MIG slice is one allocated
    claim, and a pod uses exactly the slices allocated to it). Empty when all is well."""
    problems: list[str] = []
    view = stack.view()
    for namespace in namespaces:
        for pod in pods(stack, namespace):
            if running(pod):
                problems += _pod_sees_its_own_slices(stack, view, pod)
    claims = allocated_claims(
        stack.api.list_objects(RESOURCE_CLAIMS).items, driver=names.DRIVER_NAME
    )
    for item in view.overlapping():
        problems.append(f"{item.claim_key} {item.device} overlaps another allocation")
    for stray in view.strays:
        problems.append(
            f"{stray.claim_namespace}/{stray.claim_name} allocated unpublished {stray.device}"
        )
    owners: dict[tuple[str, str], list[str]] = {}
    for claim in claims:
        for result in claim["status"]["allocation"]["devices"]["results"]:
            if result.get("driver") == names.DRIVER_NAME:
                owners.setdefault((result["pool"], result["device"]), []).append(
                    f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
                )
    for (pool, device), holders in owners.items():
        if len(holders) > 1:
            problems.append(f"{pool}/{device} allocated to {holders}")
    taken = {(g.node, g.index, t.profile, t.placement.start): t for g in view.gpus for t in g.taken}
    for node in stack.node_names:
        for instance in stack.mig_instances(node):
            key = (node, instance.gpu_index, instance.profile, instance.placement.start)
            if key not in taken:
                problems.append(
                    f"MIG instance {instance.profile}@{instance.placement.start} on {node} "
                    f"gpu{instance.gpu_index} ({instance.mig_uuid}) is owned by no claim"
                )
    existing = {
        (node, i.gpu_index, i.profile, i.placement.start)
        for node in stack.node_names
        for i in stack.mig_instances(node)
        if i.complete
    }
    for key, item in taken.items():
        if any(p.phase == "Running" for p in item.pods) and key not in existing:
            problems.append(
                f"{item.claim_key} is allocated {item.device} on {key[0]} and its pod runs, "
                "but no MIG instance exists there"
            )
    return problems


def _sources(container: JsonObject) -> int:
    """How many of our CDI sources feed a container: each claim it uses, and its classic request."""
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    classic = any(k.startswith(names.CLASSIC_RESOURCE_PREFIX) for k in limits)
    return len(resources.get("claims") or []) + int(classic)


def _pod_sees_its_own_slices(stack: Stack, view: ClusterView, pod: JsonObject) -> list[str]:
    """Every container's ``NVIDIA_VISIBLE_DEVICES`` names only slices of its pod, and together
    they name all of them. One exception, a known limit of CDI (docs/design.md F9: the last device
    setting a variable wins): a container fed by several claims (or a claim and a classic request)
    has each source's list in turn, so there the variable must name a non-empty subset — its
    device nodes are the real grant (checked on GPU nodes by the test pod and ``check``)."""
    meta, spec = pod["metadata"], pod["spec"]
    held = slices_of_pod(view, meta["namespace"], meta["name"])
    own = {item.mig_uuid for _, _, item in held}
    seen: set[str] = set()
    classic = 0
    partial = False
    where = f"pod {meta['namespace']}/{meta['name']}"
    problems = []
    for container in spec.get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        classic += sum(
            int(v) for k, v in limits.items() if k.startswith(names.CLASSIC_RESOURCE_PREFIX)
        )
        try:
            visible = visible_devices(stack, pod, container["name"])
        except KeyError:
            return [f"{where} runs but its container was not started"]
        seen |= visible
        if _sources(container) > 1:
            partial = True
            if not visible:
                problems.append(f"{where} container {container['name']} sees no MIG device")
    if (seen != own and not partial) or not seen <= own:
        problems.append(
            f"{where} sees MIG devices {sorted(seen)} but holds {sorted(map(str, own))}"
        )
    # Classic slices come from shadow claims (controller mode) or from the claim kube-scheduler
    # made for the pod's extended resources (scheduler mode: pod.status.extendedResourceClaimStatus).
    extended = ((pod.get("status") or {}).get("extendedResourceClaimStatus") or {}).get(
        "resourceClaimName"
    )
    extended_key = f"{meta['namespace']}/{extended}" if extended else None
    if (
        classic
        and len([h for h in held if h[2].shadow or h[2].claim_key == extended_key]) != classic
    ):
        problems.append(f"{where} asks {classic} classic slices but holds {len(held)}")
    return problems


def wait_invariants(stack: Stack, namespaces: Iterable[str] = (), *, timeout: float = 10.0) -> None:
    """The invariants, given a few seconds to settle (a slice being destroyed right after its
    pod went is not a leak yet); overlaps are never tolerated."""
    deadline = time.monotonic() + timeout
    while True:
        problems = invariant_violations(stack, namespaces)
        overlaps = [p for p in problems if "overlaps" in p or "allocated to [" in p]
        assert not overlaps, overlaps
        if not problems:
            return
        if time.monotonic() >= deadline:
            raise AssertionError("invariants violated:\n  " + "\n  ".join(problems))
        time.sleep(0.1)


def node_leftovers(stack: Stack, nodes: Iterable[str] | None = None) -> list[str]:
    """MIG instances, CDI specs and checkpoint entries left on the nodes (default: every node in
    the stack; a node that left it may be named, its state is still readable)."""
    left: list[str] = []
    for node in stack.node_names if nodes is None else nodes:
        paths = stack.node_paths(node)
        left += [f"{node}: MIG {i.profile}@{i.placement.start}" for i in stack.mig_instances(node)]
        if paths.cdi_root.is_dir():
            left += [f"{node}: CDI spec {p.name}" for p in paths.cdi_root.glob("*") if p.is_file()]
        claims = CheckpointStore(paths.checkpoint).load().claims
        left += [f"{node}: checkpoint claim {c.namespace}/{c.name}" for c in claims.values()]
    return left


def cdi_specs(stack: Stack, node: str) -> list[Path]:
    root = stack.node_paths(node).cdi_root
    return sorted(p for p in root.glob("*") if p.is_file()) if root.is_dir() else []


# --- one scenario ------------------------------------------------------------------------------


@contextlib.contextmanager
def scenario(stack: Stack, namespaces: Sequence[str], *, cleanup_s: float) -> Iterator[Stack]:
    """Around one scenario: the daemons must be up; afterwards the invariants are checked while
    its pods still run, then everything it made is deleted and the nodes must end with no MIG
    instance, no CDI spec and no checkpoint entry (a failed cleanup is forced out, so the next
    scenario starts clean)."""
    stack.check_daemons()
    yield stack
    try:
        wait_invariants(stack, namespaces)
    finally:
        delete_everything(stack, namespaces)
        try:
            wait_for(
                stack,
                lambda: not _scenario_objects(stack, namespaces),
                timeout=cleanup_s,
                explain=lambda: f"not removed: {_scenario_objects(stack, namespaces)}",
            )
            wait_for(
                stack,
                lambda: not node_leftovers(stack),
                timeout=cleanup_s,
                explain=lambda: f"left on the nodes: {node_leftovers(stack)}",
            )
        except TimeoutError:
            _repair(stack, namespaces, cleanup_s)
            raise


def attach_daemon_logs(report: Any, stack: Stack) -> None:
    """Add each daemon's log tail to a failed test's report."""
    controllers = getattr(stack, "controllers", None) or (
        [stack.controller] if stack.controller else []
    )
    for process in [*stack.plugins.values(), *controllers]:
        report.sections.append((f"{process.name} log", process.log_tail(60)))


def _scenario_objects(stack: Stack, namespaces: Sequence[str]) -> list[str]:
    left = []
    for namespace in namespaces:
        for resource in (PODS, RESOURCE_CLAIMS):
            for obj in stack.api.list_objects(resource, namespace=namespace).items:
                meta, status = obj["metadata"], obj.get("status") or {}
                state = {
                    "phase": status.get("phase"),
                    "deleting": bool(meta.get("deletionTimestamp")),
                    "finalizers": meta.get("finalizers"),
                    "reservedFor": [r.get("name") for r in status.get("reservedFor") or []],
                    "allocated": bool(status.get("allocation")),
                }
                shown = {k: v for k, v in state.items() if v}
                left.append(f"{resource.kind} {namespace}/{meta['name']} {shown}")
    return left


def _repair(stack: Stack, namespaces: Sequence[str], cleanup_s: float) -> None:
    """Force out what a failed cleanup left (claims held by finalizers), best effort."""
    for namespace in namespaces:
        for claim in stack.api.list_objects(RESOURCE_CLAIMS, namespace=namespace).items:
            claim["metadata"]["finalizers"] = []
            with contextlib.suppress(DriverError):
                stack.api.update(RESOURCE_CLAIMS, claim)
            with contextlib.suppress(DriverError):
                stack.api.delete(
                    RESOURCE_CLAIMS, name=claim["metadata"]["name"], namespace=namespace
                )
    with contextlib.suppress(TimeoutError):
        wait_for(stack, lambda: not node_leftovers(stack), timeout=cleanup_s)
