"""What the deploy tier checks inside real containers and on the nodes.

A container's view comes from ``kubectl exec``: its environment and the character devices under
``/dev`` named ``nvidia*`` (type and numbers from ``stat``). What it should see comes from the API
(its claims allocated by our driver, with the MIG UUID the plugin recorded for each device) and from
its node's CDI directory (the device nodes each claim's spec names). Leaks are read on the nodes:
the emulated GPUs' MIG instances and the CDI specs, against the claims allocated there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from api import names
from driver.cdi import EMULATED_ENV, SLICE_ENV_PREFIX, VISIBLE_DEVICES_ENV
from driver.cluster.port import PODS, RESOURCE_CLAIMS, JsonObject
from driver.cluster.views import ClaimView, PodView
from localcluster.containerstack import ContainerCluster

GPUS = "2xA100-40GB"
"""What the emulated overlay gives every node (deploy/overlays/emulated)."""
EMULATED_NODE = (1, 3)
"""``/dev/null``'s major and minor: what an emulated slice's device nodes are made from."""
_SEPARATOR = "@@@devices@@@"
_VIEW_SCRIPT = (
    f"env; echo {_SEPARATOR}; "
    "find /dev -type c -name 'nvidia*' | while read -r f; do stat -c '%t:%T %n' \"$f\"; done"
)


@dataclass(frozen=True, slots=True)
class ContainerView:
    """What one container sees, from inside."""

    pod: str
    env: Mapping[str, str]
    device_nodes: Mapping[str, tuple[int, int]]
    """path -> (major, minor) of every ``/dev/**/nvidia*`` character device."""

    @property
    def mig_uuids(self) -> frozenset[str]:
        """The slices it was given: one ``INSTASLICE_MIG_UUID_*`` variable per slice."""
        return frozenset(v for k, v in self.env.items() if k.startswith(SLICE_ENV_PREFIX))


def container_view(cluster: ContainerCluster, pod: JsonObject) -> ContainerView:
    view = PodView.of(pod)
    out = cluster.exec(view.namespace, view.name, _VIEW_SCRIPT)
    env_text, _, devices_text = out.partition(_SEPARATOR)
    env = dict(
        line.split("=", 1) for line in env_text.splitlines() if "=" in line and line[0] != " "
    )
    nodes = {}
    for line in devices_text.splitlines():
        match = re.fullmatch(r"([0-9a-f]+):([0-9a-f]+) (\S+)", line.strip())
        if match:
            nodes[match.group(3)] = (int(match.group(1), 16), int(match.group(2), 16))
    return ContainerView(pod=view.key, env=env, device_nodes=nodes)


def claims_of(cluster: ContainerCluster, pod: JsonObject) -> list[ClaimView]:
    """The pod's claims allocated by our driver: from its claim references, and the shadow claim
    the controller made for a classic pod (owned by the pod)."""
    view = PodView.of(pod)
    found = []
    for claim in cluster.api.list_objects(RESOURCE_CLAIMS, namespace=view.namespace).items:
        claim_view = ClaimView.of(claim)
        if not claim_view.results_of(names.DRIVER_NAME):
            continue
        if claim_view.key in view.claim_keys() or view.uid in claim_view.meta.owner_pod_uids():
            found.append(claim_view)
    return found


def recorded_uuids(claims: Iterable[ClaimView]) -> frozenset[str]:
    """The MIG UUIDs the plugin recorded in the claims' ``status.devices`` after preparing them."""
    return frozenset(
        str(d.data.get("migUUID"))
        for claim in claims
        for d in claim.devices
        if d.driver == names.DRIVER_NAME and d.data.get("migUUID")
    )


@dataclass(frozen=True, slots=True)
class Granted:
    """What the CDI specs of a pod's claims on its node give a container."""

    mig_uuids: frozenset[str]
    device_nodes: frozenset[str]
    env: Mapping[str, str]
    """Variables other than the slice ones (opaque config)."""


def granted(cluster: ContainerCluster, node: str, claims: Iterable[ClaimView]) -> Granted:
    specs = cluster.claim_specs(node)
    uuids: set[str] = set()
    paths: set[str] = set()
    env: dict[str, str] = {}
    for claim in claims:
        spec = specs.get(claim.uid)
        assert spec is not None, f"no CDI spec for claim {claim.key} on {node}"
        devices = list(spec.get("devices") or [])
        assert len(devices) == len(claim.results_of(names.DRIVER_NAME)), (
            f"claim {claim.key}: {len(devices)} CDI devices for its allocated devices"
        )
        for device in devices:
            edits = device.get("containerEdits") or {}
            for item in edits.get("env") or []:
                key, _, value = str(item).partition("=")
                if key.startswith(SLICE_ENV_PREFIX):
                    uuids.add(value)
                elif key not in (VISIBLE_DEVICES_ENV, EMULATED_ENV):
                    env[key] = value
            paths.update(str(n["path"]) for n in edits.get("deviceNodes") or [])
    return Granted(mig_uuids=frozenset(uuids), device_nodes=frozenset(paths), env=env)


def check_container(cluster: ContainerCluster, pod: JsonObject) -> ContainerView:
    """The container holds exactly its claims' slices: their MIG UUIDs (and nothing else) in its
    environment, the visibility list complete, the variables its claims' opaque config asked for,
    and the device nodes the CDI specs name, made from ``/dev/null``. Returns what it saw."""
    view = PodView.of(pod)
    claims = claims_of(cluster, pod)
    assert claims, f"pod {view.key} has no claim allocated by {names.DRIVER_NAME}"
    given = granted(cluster, view.node_name, claims)
    assert len(given.mig_uuids) == sum(len(c.results_of(names.DRIVER_NAME)) for c in claims)
    recorded = recorded_uuids(claims)
    if recorded:  # the plugin records them after a DRA prepare
        assert recorded == given.mig_uuids, f"pod {view.key}: claims record {recorded}"
    seen = container_view(cluster, pod)
    assert seen.mig_uuids == given.mig_uuids, (
        f"pod {view.key} sees {sorted(seen.mig_uuids)}, holds {sorted(given.mig_uuids)}"
    )
    visible = set(seen.env.get(VISIBLE_DEVICES_ENV, "").split(","))
    assert visible == given.mig_uuids, f"pod {view.key}: {VISIBLE_DEVICES_ENV}={sorted(visible)}"
    assert seen.env.get(EMULATED_ENV) == "true"
    for key, value in given.env.items():
        assert seen.env.get(key) == value, f"pod {view.key}: {key}={seen.env.get(key)!r}"
    assert set(seen.device_nodes) == given.device_nodes, (
        f"pod {view.key} has device nodes {sorted(seen.device_nodes)}, its CDI specs name "
        f"{sorted(given.device_nodes)}"
    )
    assert set(seen.device_nodes.values()) == {EMULATED_NODE}
    return seen


def running_pods(cluster: ContainerCluster, namespaces: Iterable[str]) -> list[JsonObject]:
    pods = []
    for namespace in namespaces:
        for pod in cluster.api.list_objects(PODS, namespace=namespace).items:
            view = PodView.of(pod)
            if view.phase == "Running" and view.meta.deletion_timestamp is None:
                pods.append(pod)
    return pods


def check_no_slice_twice(views: Iterable[ContainerView]) -> None:
    owner: dict[str, str] = {}
    for view in views:
        for uuid in view.mig_uuids:
            assert uuid not in owner, f"MIG UUID {uuid} is in {owner.get(uuid)} and {view.pod}"
            owner[uuid] = view.pod


def leaks(cluster: ContainerCluster) -> list[str]:
    """What the nodes hold that no allocated claim accounts for: MIG instances that no claim's CDI
    spec names, CDI specs of claims that are not allocated there. Empty when every node matches."""
    claims = [ClaimView.of(c) for c in cluster.api.list_objects(RESOURCE_CLAIMS).items]
    problems = []
    for node in cluster.node_names:
        here = {
            c.uid: c for c in claims if any(r.pool == node for r in c.results_of(names.DRIVER_NAME))
        }
        specs = cluster.claim_specs(node)
        stale = sorted(set(specs) - set(here))
        if stale:
            problems.append(f"{node}: CDI specs of claims not allocated here: {stale}")
        named = granted(cluster, node, [here[uid] for uid in specs if uid in here]).mig_uuids
        made = {str(i.mig_uuid) for i in cluster.mig_instances(node, gpus=GPUS)}
        if made - named:
            problems.append(f"{node}: MIG instances no claim holds: {sorted(made - named)}")
    return problems


def allocated_claims(cluster: ContainerCluster) -> list[str]:
    return [
        ClaimView.of(c).key
        for c in cluster.api.list_objects(RESOURCE_CLAIMS).items
        if ClaimView.of(c).results_of(names.DRIVER_NAME)
    ]


def node_artifacts(cluster: ContainerCluster) -> dict[str, list[str]]:
    """Per node: MIG instances and claim CDI specs still there (empty lists when clean)."""
    found = {}
    for node in cluster.node_names:
        left = [
            f"instance {i.profile}@{i.placement.start} GPU {i.gpu_index}"
            for i in cluster.mig_instances(node, gpus=GPUS)
        ]
        left += [f"CDI spec {uid}" for uid in cluster.claim_specs(node)]
        if left:
            found[node] = left
    return found


def containers_by_pod(pods: Iterable[JsonObject]) -> dict[str, tuple[str, int]]:
    """pod key -> (container ID, restart count) of its first container."""
    found = {}
    for pod in pods:
        status = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0]
        found[PodView.of(pod).key] = (
            str(status.get("containerID")),
            int(status.get("restartCount") or 0),
        )
    return found


def metric_sum(text: str, name: str) -> float:
    """The sum of every sample of metric ``name`` in a Prometheus text exposition."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )
