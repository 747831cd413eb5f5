"""The Deployment controller, reduced to what scaling needs: one ReplicaSet per pod template,
named ``<deployment>-<pod-template-hash>`` and owned by the Deployment, carrying the Deployment's
replicas; ReplicaSets of older templates are scaled to 0 (a ``Recreate`` rollout). Status sums
the ReplicaSets' counts."""

from __future__ import annotations

import copy
import json
import logging

from driver.cluster.informer import Informer
from driver.cluster.port import JsonObject, metadata, name_of, namespace_of, object_key, uid_of
from driver.errors import AlreadyExistsError, ConflictError
from localcluster.cluster.client import ControlPlaneApi
from localcluster.cluster.loop import InformerFactory, KeyedLoop, ensure_index
from localcluster.cluster.workloads.common import (
    BY_CONTROLLER,
    DEPLOYMENTS,
    REPLICA_SETS,
    controller_of,
    controller_uids,
    owner_ref,
    write_status,
)

log = logging.getLogger(__name__)

POD_TEMPLATE_HASH = "pod-template-hash"
_SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # kube's rand.SafeEncodeString


def template_hash(text: str) -> str:
    """FNV-1a (32 bit) of ``text``, its decimal digits spelled in kube's safe alphabet."""
    value = 0x811C9DC5
    for byte in text.encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return "".join(_SAFE_ALPHABET[ord(ch) % len(_SAFE_ALPHABET)] for ch in str(value))


class DeploymentController:
    def __init__(self, *, api: ControlPlaneApi, informers: InformerFactory) -> None:
        self._api = api
        self._deployments: Informer = informers.informer(DEPLOYMENTS)
        self._replica_sets: Informer = informers.informer(REPLICA_SETS)
        self._loop = KeyedLoop(name="deployment-controller", sync=self._sync, workers=2)

    def start(self) -> None:
        ensure_index(self._replica_sets, BY_CONTROLLER, controller_uids)
        self._deployments.add_handler(
            on_add=lambda d: self._loop.add(object_key(d)),
            on_update=lambda _, d: self._loop.add(object_key(d)),
        )
        self._replica_sets.add_handler(
            on_add=self._on_replica_set,
            on_update=lambda _, rs: self._on_replica_set(rs),
            on_delete=self._on_replica_set,
        )
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()

    def _on_replica_set(self, replica_set: JsonObject) -> None:
        ref = controller_of(replica_set, DEPLOYMENTS)
        if ref is not None:
            self._loop.add(f"{namespace_of(replica_set)}/{ref.get('name')}")

    def _sync(self, key: str) -> None:
        deployment = self._deployments.get_by_key(key)
        if deployment is None or "deletionTimestamp" in metadata(deployment):
            return
        spec = deployment.get("spec") or {}
        template = spec.get("template") or {}
        pod_hash = template_hash(json.dumps(template, sort_keys=True))
        owned = [
            rs
            for rs in self._replica_sets.by_index(BY_CONTROLLER, uid_of(deployment))
            if namespace_of(rs) == namespace_of(deployment)
        ]
        replicas = int(spec.get("replicas", 1))
        current = next(
            (
                rs
                for rs in owned
                if (metadata(rs).get("labels") or {}).get(POD_TEMPLATE_HASH) == pod_hash
            ),
            None,
        )
        if current is None:
            current = self._create_replica_set(deployment, pod_hash, replicas)
        elif int((current.get("spec") or {}).get("replicas", 1)) != replicas:
            self._scale(current, replicas)
        for old in owned:
            if old is not current and int((old.get("spec") or {}).get("replicas", 1)) != 0:
                self._scale(old, 0)

        def status(stored: JsonObject) -> JsonObject:
            counts = [rs.get("status") or {} for rs in owned]
            available = sum(int(c.get("availableReplicas", 0)) for c in counts)
            new_status = (current or {}).get("status") or {}
            condition = {
                "type": "Available",
                "status": "True" if available >= replicas else "False",
                "reason": "MinimumReplicasAvailable" if available >= replicas else "MinimumReplicasUnavailable",
                "message": "Deployment has minimum availability." if available >= replicas
                else "Deployment does not have minimum availability.",
            }  # fmt: skip
            previous = next(
                (
                    c
                    for c in (stored.get("status") or {}).get("conditions") or []
                    if c.get("type") == "Available"
                ),
                None,
            )
            if previous is not None and previous.get("status") == condition["status"]:
                condition = previous
            return {
                **(stored.get("status") or {}),
                "replicas": sum(int(c.get("replicas", 0)) for c in counts),
                "updatedReplicas": int(new_status.get("replicas", 0)),
                "readyReplicas": sum(int(c.get("readyReplicas", 0)) for c in counts),
                "availableReplicas": available,
                "observedGeneration": metadata(stored).get("generation", 0),
                "conditions": [condition],
            }

        write_status(self._api, DEPLOYMENTS, deployment, status)

    def _create_replica_set(
        self, deployment: JsonObject, pod_hash: str, replicas: int
    ) -> JsonObject | None:
        spec = deployment.get("spec") or {}
        template = copy.deepcopy(spec.get("template") or {})
        template.setdefault("metadata", {})
        template["metadata"]["labels"] = {
            **(template["metadata"].get("labels") or {}),
            POD_TEMPLATE_HASH: pod_hash,
        }
        selector = copy.deepcopy(spec.get("selector") or {})
        selector["matchLabels"] = {
            **(selector.get("matchLabels") or {}),
            POD_TEMPLATE_HASH: pod_hash,
        }
        body: JsonObject = {
            "metadata": {
                "name": f"{name_of(deployment)}-{pod_hash}",
                "namespace": namespace_of(deployment),
                "labels": dict(template["metadata"]["labels"]),
                "ownerReferences": [owner_ref(DEPLOYMENTS, deployment)],
            },
            "spec": {"replicas": replicas, "selector": selector, "template": template},
        }
        try:
            created = self._api.create(REPLICA_SETS, body, namespace=namespace_of(deployment))
        except AlreadyExistsError:
            return None  # the informer has not shown it yet; the next sync finds it
        log.info("deployment %s: created replicaset %s", name_of(deployment), name_of(created))
        return created

    def _scale(self, replica_set: JsonObject, replicas: int) -> None:
        updated = copy.deepcopy(replica_set)
        updated["spec"]["replicas"] = replicas
        try:
            self._api.update(REPLICA_SETS, updated)
            log.info("replicaset %s scaled to %d", name_of(replica_set), replicas)
        except ConflictError:
            raise
