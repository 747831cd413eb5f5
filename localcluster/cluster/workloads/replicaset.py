"""The ReplicaSet controller: keep ``spec.replicas`` active pods (``<rs>-<5 random>``, owned by the
ReplicaSet), deleting the least advanced first when scaling down, and report counts in status."""

from __future__ import annotations

import logging

from driver.cluster.port import JsonObject, metadata
from localcluster.cluster.workloads.base import PodOwnerController
from localcluster.cluster.workloads.common import (
    REPLICA_SETS,
    delete_pod,
    deletion_order,
    is_active,
    is_ready,
    pod_from_template,
    write_status,
)

log = logging.getLogger(__name__)


class ReplicaSetController(PodOwnerController):
    resource = REPLICA_SETS

    def sync(self, owner: JsonObject, key: str) -> None:
        pods = self.owned_pods(owner)
        active = [p for p in pods if is_active(p)]
        if self.expectations.satisfied(key):
            wanted = int((owner.get("spec") or {}).get("replicas", 1))
            if len(active) < wanted:
                log.info("replicaset %s: creating %d pods", key, wanted - len(active))
                self.create_pods(
                    key,
                    [pod_from_template(owner, REPLICA_SETS) for _ in range(wanted - len(active))],
                )
            elif len(active) > wanted:
                doomed = deletion_order(active)[: len(active) - wanted]
                log.info("replicaset %s: deleting %d pods", key, len(doomed))
                self.expectations.expect(key, deletes=[metadata(p)["uid"] for p in doomed])
                for pod in doomed:
                    delete_pod(self._api, pod)

        def status(current: JsonObject) -> JsonObject:
            ready = sum(1 for p in active if is_ready(p))
            return {
                **(current.get("status") or {}),
                "replicas": len(active),
                "fullyLabeledReplicas": len(active),
                "readyReplicas": ready,
                "availableReplicas": ready,
                "observedGeneration": metadata(current).get("generation", 0),
            }

        write_status(self._api, REPLICA_SETS, owner, status)
