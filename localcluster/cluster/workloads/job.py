"""The Job controller (NonIndexed completion mode): run up to ``parallelism`` pods until
``completions`` have succeeded, then mark the Job ``Complete``; more than ``backoffLimit`` failed
pods mark it ``Failed``. Pods are ``<job>-<5 random>`` with the ``batch.kubernetes.io`` labels.

Counts are taken from the pods that exist (kube tracks finished pods with a finalizer so that
deleting them does not lose the count; not modelled).
"""

from __future__ import annotations

import logging

from driver.cluster.clock import Clock, SystemClock
from driver.cluster.port import JsonObject, format_time, name_of, uid_of
from localcluster.cluster.client import ControlPlaneApi
from localcluster.cluster.loop import InformerFactory
from localcluster.cluster.workloads.base import PodOwnerController
from localcluster.cluster.workloads.common import (
    JOBS,
    delete_pod,
    deletion_order,
    is_active,
    is_ready,
    pod_from_template,
    write_status,
)

log = logging.getLogger(__name__)

DEFAULT_BACKOFF_LIMIT = 6


def _finished(job: JsonObject) -> bool:
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


class JobController(PodOwnerController):
    resource = JOBS

    def __init__(
        self, *, api: ControlPlaneApi, informers: InformerFactory, clock: Clock | None = None
    ) -> None:
        super().__init__(api=api, informers=informers)
        self._clock = clock or SystemClock()

    def _labels(self, job: JsonObject) -> dict[str, str]:
        return {
            "batch.kubernetes.io/controller-uid": uid_of(job),
            "batch.kubernetes.io/job-name": name_of(job),
            "controller-uid": uid_of(job),
            "job-name": name_of(job),
        }

    def sync(self, owner: JsonObject, key: str) -> None:
        spec = owner.get("spec") or {}
        pods = self.owned_pods(owner)
        active = [p for p in pods if is_active(p)]
        succeeded = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Succeeded")
        failed = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Failed")
        parallelism = int(spec.get("parallelism", 1))
        completions = spec.get("completions")
        backoff_limit = int(spec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT))
        now = format_time(self._clock.now())
        outcome: tuple[str, str, str] | None = None
        if _finished(owner):
            wanted = 0
        elif failed > backoff_limit:
            outcome = (
                "Failed",
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            )
            wanted = 0
        elif completions is not None and succeeded >= int(completions):
            outcome = (
                "Complete",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            )
            wanted = 0
        elif completions is None and succeeded > 0:
            wanted = len(active)  # work-queue mode: no new pods once one succeeded
            if not active:
                outcome = (
                    "Complete",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                )
        else:
            remaining = parallelism if completions is None else int(completions) - succeeded
            wanted = max(0, min(parallelism, remaining))
        if self.expectations.satisfied(key):
            if len(active) < wanted:
                log.info("job %s: creating %d pods", key, wanted - len(active))
                self.create_pods(
                    key,
                    [
                        pod_from_template(owner, JOBS, labels=self._labels(owner))
                        for _ in range(wanted - len(active))
                    ],
                )
            elif len(active) > wanted:
                doomed = deletion_order(active)[: len(active) - wanted]
                self.expectations.expect(key, deletes=[uid_of(p) for p in doomed])
                for pod in doomed:
                    delete_pod(self._api, pod)

        def status(current: JsonObject) -> JsonObject:
            result = {
                **(current.get("status") or {}),
                "active": len(active) if outcome is None else 0,
                "succeeded": succeeded,
                "failed": failed,
                "ready": sum(1 for p in active if is_ready(p)),
            }
            result.setdefault("startTime", now)
            if outcome is not None and not _finished(current):
                kind, reason, message = outcome
                conditions = list(result.get("conditions") or [])
                criteria = "SuccessCriteriaMet" if kind == "Complete" else "FailureTarget"
                for condition_type in (criteria, kind):
                    conditions.append(
                        {"type": condition_type, "status": "True", "reason": reason,
                         "message": message, "lastProbeTime": now, "lastTransitionTime": now}
                    )  # fmt: skip
                result["conditions"] = conditions
                if kind == "Complete":
                    result["completionTime"] = now
            return result

        write_status(self._api, JOBS, owner, status)
        if outcome is not None:
            log.info("job %s: %s", key, outcome[0])
