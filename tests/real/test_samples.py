"""Every sample a user applies, on real Kubernetes: all of ``samples/`` at once (as ``kubectl apply
-k samples/``) Running with their own slices, then deleted clean; the quota sample enforced by the
real API server for both ways of asking (its own refusal message, nothing placed or leaked)."""

from __future__ import annotations

import pytest

from driver.cluster.port import PODS, RESOURCE_CLAIMS, JsonObject, PatchType
from driver.errors import ClusterError
from localcluster.daemonstack import local_metrics
from localcluster.manifests import DEPLOYMENTS, read_kustomization
from localcluster.realstack import RealStack
from localcluster.stack import SAMPLES_DIR
from tests.e2e.conftest import E2E_NS
from tests.e2e.helpers import (
    QUOTA_NS,
    SAMPLES_NS,
    apply,
    classic_pod,
    get_pod,
    is_gated,
    phase,
    placement_reason,
    pods,
    running,
    sample,
    wait_for,
)


def _samples() -> list[JsonObject]:
    return [o for o in read_kustomization(SAMPLES_DIR) if o.get("kind") != "Namespace"]


def _all_running(stack: RealStack) -> bool:
    found = pods(stack, SAMPLES_NS) + pods(stack, QUOTA_NS)
    return bool(found) and all(running(p) or phase(p) == "Succeeded" for p in found)


def _not_running(stack: RealStack) -> list[str]:
    """Each pod that is neither Running nor Succeeded: phase, gates, node and conditions."""
    found = pods(stack, SAMPLES_NS) + pods(stack, QUOTA_NS)
    return [
        f"{p['metadata']['namespace']}/{p['metadata']['name']}: phase {phase(p)!r}, "
        f"gates {[g.get('name') for g in p['spec'].get('schedulingGates') or []]}, "
        f"node {p['spec'].get('nodeName')!r}, conditions "
        f"{[(c.get('type'), c.get('status'), c.get('reason'), c.get('message')) for c in (p.get('status') or {}).get('conditions') or []]}"
        for p in found
        if not (running(p) or phase(p) == "Succeeded")
    ]


def _delete_quota(stack: RealStack) -> None:
    stack.kubectl(["delete", "resourcequota", "--all", "-n", QUOTA_NS, "--ignore-not-found"])


def test_every_sample_runs_with_its_own_slices_and_is_removed_clean(classic: RealStack) -> None:
    objects = _samples()
    try:
        apply(classic, objects)
        try:
            wait_for(classic, lambda: _all_running(classic), timeout=60, message="not running")
        except TimeoutError:
            raise AssertionError(f"samples not running: {_not_running(classic)}") from None
        expected = sum(
            int((o.get("spec") or {}).get("replicas", 1))
            for o in objects
            if o.get("kind") in ("Pod", "Deployment", "StatefulSet", "Job")
        )
        assert len(pods(classic, SAMPLES_NS) + pods(classic, QUOTA_NS)) >= expected
        # (the cluster fixture checks what every container got, overlaps and leftovers)
    finally:
        _delete_quota(classic)


def test_the_large_profile_samples_run_alone(cluster: RealStack) -> None:
    apply(cluster, sample("large-profiles/dra-pod-4g.20gb.yaml"))
    apply(cluster, sample("large-profiles/dra-pod-7g.40gb.yaml"))
    wait_for(
        cluster,
        lambda: (
            all(running(p) for p in pods(cluster, SAMPLES_NS))
            and len(pods(cluster, SAMPLES_NS)) == 2
        ),
    )


def _refused(stack: RealStack, obj: JsonObject) -> str:
    with pytest.raises(ClusterError) as refused:
        stack.api.create(PODS if obj["kind"] == "Pod" else RESOURCE_CLAIMS, obj, namespace=QUOTA_NS)
    return str(refused.value)


def test_the_real_resource_quota_refuses_dra_and_classic_requests_over_it(
    classic: RealStack,
) -> None:
    quota = [o for o in sample("quota.yaml") if o["kind"] == "ResourceQuota"]
    classic_deployment = [o for o in sample("quota.yaml") if o["kind"] == "Deployment"]
    try:
        apply(classic, quota + classic_deployment)
        wait_for(classic, lambda: len([p for p in pods(classic, QUOTA_NS) if running(p)]) == 2)
        # classic: a third 1g.5gb pod is over requests.nvidia.com/mig-1g.5gb (2)
        over = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "over-classic", "namespace": QUOTA_NS},
            "spec": {
                "containers": [
                    {
                        "name": "app",
                        "image": "busybox:1.36",
                        "resources": {
                            "requests": {"cpu": "10m", "memory": "16Mi"},
                            "limits": {"memory": "64Mi", "nvidia.com/mig-1g.5gb": 1},
                        },
                    }
                ]
            },
        }
        message = _refused(classic, over)
        assert "exceeded quota" in message
        assert "requests.nvidia.com/mig-1g.5gb" in message
        # DRA: the generic class allows 1 device; a claim asking 3 is refused at creation
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "over-dra", "namespace": QUOTA_NS},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "mig",
                            "exactly": {
                                "deviceClassName": "mig.instaslice.dev",
                                "allocationMode": "ExactCount",
                                "count": 3,
                            },
                        }
                    ]
                }
            },
        }
        message = _refused(classic, claim)
        assert "exceeded quota" in message
        assert "mig.instaslice.dev.deviceclass" in message
        # scaling the Deployment past the quota: the ReplicaSet cannot create the third pod
        classic.api.patch(
            DEPLOYMENTS,
            name="quota-classic",
            namespace=QUOTA_NS,
            patch={"spec": {"replicas": 3}},
            patch_type=PatchType.MERGE,
        )
        wait_for(
            classic,
            lambda: any(
                "exceeded quota" in str(e.get("message"))
                for e in classic.events(QUOTA_NS)
                if e.get("reason") == "FailedCreate"
            ),
            message="no FailedCreate event for the third replica",
        )
        assert len(pods(classic, QUOTA_NS)) == 2
        assert not classic.api.list_objects(RESOURCE_CLAIMS, namespace=E2E_NS).items
    finally:
        _delete_quota(classic)


def _wait_lines(stack: RealStack) -> list[str]:
    """The ``instaslice_controller_waiting_pods`` samples of every controller replica (only the
    leader reports who waits)."""
    lines = []
    for port in stack.replica_metrics_ports:
        lines += [
            x
            for x in local_metrics(port).splitlines()
            if x.startswith("instaslice_controller_waiting_pods{")
        ]
    return lines


def _waiting_for_quota(stack: RealStack) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in _wait_lines(stack) if 'reason="quota"' in line
    )


def test_a_shadow_claim_over_the_class_quota_leaves_the_pod_waiting_with_the_reason(
    classic: RealStack,
) -> None:
    """A quota on the per-profile class key, not on the classic one: the pod is admitted, its
    shadow claim is refused by the real quota admission; the pod waits gated with reason
    QuotaExceeded (counted as a wait for quota) and is placed once the quota has room."""
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "class-slices", "namespace": QUOTA_NS},
        "spec": {"hard": {"mig-1g.5gb.instaslice.dev.deviceclass.resource.k8s.io/devices": "1"}},
    }
    try:
        apply(classic, [quota])
        apply(classic, [classic_pod("first", profile="1g.5gb", namespace=QUOTA_NS)])
        wait_for(classic, lambda: running(get_pod(classic, QUOTA_NS, "first")))
        apply(classic, [classic_pod("second", profile="1g.5gb", namespace=QUOTA_NS)])
        wait_for(
            classic,
            lambda: placement_reason(classic, QUOTA_NS, "second") == "QuotaExceeded",
            message="the second pod never said QuotaExceeded",
        )
        assert is_gated(get_pod(classic, QUOTA_NS, "second"))
        try:
            wait_for(classic, lambda: _waiting_for_quota(classic) == 1.0, timeout=30)
        except TimeoutError:
            raise AssertionError(
                f"not counted as a wait for quota: {_wait_lines(classic)}"
            ) from None
        classic.api.delete(PODS, name="first", namespace=QUOTA_NS)
        wait_for(
            classic,
            lambda: running(get_pod(classic, QUOTA_NS, "second")),
            timeout=90,
            message="the second pod was not placed once the quota had room",
        )
        assert _waiting_for_quota(classic) == 0.0
    finally:
        _delete_quota(classic)
