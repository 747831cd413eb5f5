"""The StatefulSet controller (``podManagementPolicy: Parallel`` behaviour whatever the spec says):
pods ``<name>-0 … <name>-(replicas-1)`` with the stable-identity labels, hostname and subdomain;
missing ordinals are created, finished pods deleted so they come back, ordinals past ``replicas``
deleted highest first. Volume claim templates and rolling updates are not modelled."""

from __future__ import annotations

import json
import logging

from driver.cluster.port import PODS, JsonObject, metadata, name_of, namespace_of
from driver.errors import AlreadyExistsError
from localcluster.cluster.podutil import is_deleting, is_terminal
from localcluster.cluster.workloads.base import PodOwnerController
from localcluster.cluster.workloads.common import (
    STATEFUL_SETS,
    delete_pod,
    is_ready,
    pod_from_template,
    write_status,
)
from localcluster.cluster.workloads.deployment import template_hash

log = logging.getLogger(__name__)


def ordinal_of(pod: JsonObject, set_name: str) -> int | None:
    prefix = f"{set_name}-"
    name = name_of(pod)
    if not name.startswith(prefix) or not name[len(prefix) :].isdigit():
        return None
    return int(name[len(prefix) :])


class StatefulSetController(PodOwnerController):
    resource = STATEFUL_SETS

    def sync(self, owner: JsonObject, key: str) -> None:
        spec = owner.get("spec") or {}
        replicas = int(spec.get("replicas", 1))
        set_name = name_of(owner)
        revision = (
            f"{set_name}-{template_hash(json.dumps(spec.get('template') or {}, sort_keys=True))}"
        )
        by_ordinal = {
            ordinal: p
            for p in self.owned_pods(owner)
            if (ordinal := ordinal_of(p, set_name)) is not None
        }
        for ordinal in range(replicas):
            pod = by_ordinal.get(ordinal)
            if pod is None:
                self._create(owner, ordinal, revision)
            elif is_terminal(pod) and not is_deleting(pod):
                log.info("statefulset %s: pod %s finished; recreating it", key, name_of(pod))
                delete_pod(self._api, pod)
        for ordinal in sorted(by_ordinal, reverse=True):
            pod = by_ordinal[ordinal]
            if ordinal >= replicas and not is_deleting(pod):
                delete_pod(self._api, pod)
        pods = [p for o, p in by_ordinal.items() if o < replicas and not is_deleting(p)]

        def status(current: JsonObject) -> JsonObject:
            ready = sum(1 for p in pods if is_ready(p))
            return {
                **(current.get("status") or {}),
                "replicas": len(pods),
                "readyReplicas": ready,
                "availableReplicas": ready,
                "currentReplicas": len(pods),
                "updatedReplicas": len(pods),
                "currentRevision": revision,
                "updateRevision": revision,
                "collisionCount": 0,
                "observedGeneration": metadata(current).get("generation", 0),
            }

        write_status(self._api, STATEFUL_SETS, owner, status)

    def _create(self, owner: JsonObject, ordinal: int, revision: str) -> None:
        name = f"{name_of(owner)}-{ordinal}"
        labels = {
            "statefulset.kubernetes.io/pod-name": name,
            "apps.kubernetes.io/pod-index": str(ordinal),
            "controller-revision-hash": revision,
        }
        pod = pod_from_template(owner, STATEFUL_SETS, name=name, labels=labels)
        pod["spec"]["hostname"] = name
        service = (owner.get("spec") or {}).get("serviceName")
        if service:
            pod["spec"]["subdomain"] = service
        try:
            self._api.create(PODS, pod, namespace=namespace_of(owner))
            log.info("statefulset %s/%s: created %s", namespace_of(owner), name_of(owner), name)
        except AlreadyExistsError:
            pass  # the previous pod of that ordinal is still being deleted
