"""The churn: a seeded stream of workload changes, one every ``step_s`` seconds, from its own thread.

Each step does one of: scale a Deployment to a random size (0 included), start a Job of two pods
that end after a random time, create a single pod with a random lifetime (while fewer than
``max_singles`` live), delete finished single pods. Which shape each uses is drawn too, so DRA and
classic requests of every profile, and claims of two slices, come and go all the time. A write that
fails (the API server restarting, say) is counted and the churn goes on: the faults are the point.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
from collections import Counter
from typing import Final

from driver.cluster.port import PODS, RESOURCE_CLAIM_TEMPLATES, ClusterApi, PatchType
from driver.errors import ApiNotFoundError, ClusterError
from localcluster.manifests import DEPLOYMENTS, JOBS, apply_object
from localcluster.soak.timeline import Timeline
from localcluster.soak.workloads import (
    KIND_LABEL,
    NAMESPACE,
    SHAPES,
    claim_templates,
    deployment,
    job,
    single_pod,
)

log = logging.getLogger(__name__)

DEPLOYMENTS_BY_SHAPE: Final = {"dep-dra-1g5": ("dra-1g5", 4), "dep-classic-1g5": ("classic-1g5", 4),
                               "dep-dra-2g10": ("dra-2g10", 2)}  # fmt: skip
"""Deployment name → (shape, most replicas)."""
JOB_SHAPES: Final = ("dra-1g10", "classic-2g10", "dra-2x1g5")
SINGLE_SHAPES: Final = ("dra-1g5", "dra-3g20", "dra-2x1g5", "classic-1g5", "dra-1g10")


class Churn:
    def __init__(
        self,
        *,
        api: ClusterApi,
        rng: random.Random,
        timeline: Timeline,
        step_s: float = 4.0,
        max_singles: int = 6,
    ) -> None:
        self._api = api
        self._rng = rng
        self._timeline = timeline
        self._step_s = step_s
        self._max_singles = max_singles
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._serial = 0
        self.actions: Counter[str] = Counter()
        """Workload changes made, by action."""
        self.failed_writes: Counter[str] = Counter()

    def setup(self) -> None:
        """Namespace, claim templates and the Deployments (at zero)."""
        apply_object(
            self._api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        )
        for template in claim_templates():
            apply_object(self._api, template)
        for name, (shape, _) in DEPLOYMENTS_BY_SHAPE.items():
            apply_object(self._api, deployment(name, SHAPES[shape], replicas=0))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="soak-churn", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.wait(self._step_s * (0.5 + self._rng.random())):
            action = self._rng.choices(["scale", "job", "single", "reap"], weights=[3, 2, 4, 2])[0]
            try:
                getattr(self, f"_{action}")()
            except ClusterError as exc:
                self.failed_writes[action] += 1
                log.info("churn %s failed (going on): %s", action, exc)

    def _next_name(self, prefix: str) -> str:
        self._serial += 1
        return f"{prefix}-{self._serial}"

    def _scale(self) -> None:
        name = self._rng.choice(sorted(DEPLOYMENTS_BY_SHAPE))
        _shape, most = DEPLOYMENTS_BY_SHAPE[name]
        replicas = self._rng.randint(0, most)
        self._api.patch(
            DEPLOYMENTS,
            name=name,
            namespace=NAMESPACE,
            patch={"spec": {"replicas": replicas}},
            patch_type=PatchType.MERGE,
        )
        self.actions[f"scale {name}"] += 1
        self._timeline.note("churn", f"scale {name} to {replicas}")

    def _job(self) -> None:
        shape = SHAPES[self._rng.choice(JOB_SHAPES)]
        name = self._next_name(f"job-{shape.name}")
        lifetime = self._rng.randint(15, 45)
        self._api.create(JOBS, job(name, shape, pods=2, lifetime_s=lifetime))
        self.actions["job"] += 1

    def _single(self) -> None:
        live = self._api.list_objects(
            PODS, namespace=NAMESPACE, label_selector=f"{KIND_LABEL}=pod"
        ).items
        if len(live) >= self._max_singles:
            self._reap()
            return
        shape = SHAPES[self._rng.choice(SINGLE_SHAPES)]
        name = self._next_name(f"pod-{shape.name}")
        lifetime = self._rng.randint(20, 90)
        self._api.create(PODS, single_pod(name, shape, lifetime_s=lifetime))
        self.actions["single pod"] += 1

    def _reap(self) -> None:
        """Delete single pods that finished (what a user cleaning up does)."""
        for pod in self._api.list_objects(
            PODS, namespace=NAMESPACE, label_selector=f"{KIND_LABEL}=pod"
        ).items:
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp"):
                with contextlib.suppress(ApiNotFoundError):
                    self._api.delete(PODS, name=pod["metadata"]["name"], namespace=NAMESPACE)
                self.actions["delete finished pod"] += 1

    def quiesce(self) -> None:
        """Stop and delete every workload of the churn (its pods and claims go with them)."""
        self.stop()
        for resource in (DEPLOYMENTS, JOBS):
            for obj in self._api.list_objects(resource, namespace=NAMESPACE).items:
                with contextlib.suppress(ApiNotFoundError):
                    self._api.delete(
                        resource,
                        name=obj["metadata"]["name"],
                        namespace=NAMESPACE,
                        propagation_policy="Background",
                    )
        for pod in self._api.list_objects(PODS, namespace=NAMESPACE).items:
            with contextlib.suppress(ApiNotFoundError):
                self._api.delete(PODS, name=pod["metadata"]["name"], namespace=NAMESPACE)
        for template in self._api.list_objects(RESOURCE_CLAIM_TEMPLATES, namespace=NAMESPACE).items:
            with contextlib.suppress(ApiNotFoundError):
                self._api.delete(
                    RESOURCE_CLAIM_TEMPLATES, name=template["metadata"]["name"], namespace=NAMESPACE
                )
