"""Minimal, faithful workload controllers (what kube-controller-manager runs for Deployments,
ReplicaSets, Jobs and StatefulSets), enough for the end-to-end scenarios: scaling, completions,
ordered names. Pods they create go through the API server (and its admission webhooks) like any."""

from __future__ import annotations

from localcluster.cluster.client import ControlPlaneApi
from localcluster.cluster.loop import InformerFactory
from localcluster.cluster.workloads.deployment import DeploymentController
from localcluster.cluster.workloads.job import JobController
from localcluster.cluster.workloads.replicaset import ReplicaSetController
from localcluster.cluster.workloads.statefulset import StatefulSetController

__all__ = ["WorkloadControllers"]


class WorkloadControllers:
    """The four controllers, started and stopped together on shared informers."""

    def __init__(self, *, api: ControlPlaneApi, informers: InformerFactory) -> None:
        self.deployments = DeploymentController(api=api, informers=informers)
        self.replica_sets = ReplicaSetController(api=api, informers=informers)
        self.jobs = JobController(api=api, informers=informers)
        self.stateful_sets = StatefulSetController(api=api, informers=informers)
        self._all = (self.deployments, self.replica_sets, self.jobs, self.stateful_sets)

    def start(self) -> None:
        for controller in self._all:
            controller.start()

    def stop(self) -> None:
        for controller in reversed(self._all):
            controller.stop()
