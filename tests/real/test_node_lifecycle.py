"""A Node object deleted while a pod on it holds a MIG slice (an autoscaler or an operator removing
it while its kubelet still runs), on real Kubernetes.

What happens, and what this test holds to: kube-controller-manager's pod garbage collector deletes
the pods bound to the missing Node — the plugin's own DaemonSet pod among them, whose token, bound
to the Node, stops working at once — and the claims generated for them go with them. The kubelet,
still running, unprepares the claims of the pods it sees go, so their slices are destroyed; the
Node's ResourceSlices, owned by it, are garbage-collected. When the kubelet registers the Node
again and a new plugin pod starts, its recovery releases whatever the old one could not (the claims
are gone), its slices name the new Node as their owner, and the node takes pods again.
"""

from __future__ import annotations

from api import names
from driver.cluster.port import NODES, RESOURCE_CLAIMS, RESOURCE_SLICES, JsonObject
from driver.cluster.views import ClaimView, SliceView
from localcluster.realstack import RealStack
from tests.e2e.conftest import E2E_NS
from tests.e2e.helpers import apply, claim_template, dra_pod, get_pod, running, wait_for

NODE = "node-0"


def _pinned_pod(name: str) -> JsonObject:
    pod = dra_pod(name, template="node-gone", namespace=E2E_NS)
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    return pod


def _claims_on(cluster: RealStack, node: str) -> list[str]:
    return [
        ClaimView.of(c).name
        for c in cluster.api.list_objects(RESOURCE_CLAIMS, namespace=E2E_NS).items
        if any(r.pool == node for r in ClaimView.of(c).results_of(names.DRIVER_NAME))
    ]


def _owner_uids(cluster: RealStack, node: str) -> set[str]:
    slices = cluster.api.list_objects(RESOURCE_SLICES, field_selector=f"spec.nodeName={node}")
    return {
        ref.uid
        for s in slices.items
        if SliceView.of(s).driver == names.DRIVER_NAME
        for ref in SliceView.of(s).meta.owners
    }


def test_a_node_deleted_under_a_running_pod_releases_its_slice(cluster: RealStack) -> None:
    apply(cluster, [claim_template("node-gone", profile="1g.5gb", namespace=E2E_NS)])
    apply(cluster, [_pinned_pod("held")])
    wait_for(cluster, lambda: running(get_pod(cluster, E2E_NS, "held")), message="pod not running")
    assert len(cluster.mig_instances(NODE)) == 1
    old_uid = cluster.api.get(NODES, name=NODE)["metadata"]["uid"]

    cluster.api.delete(NODES, name=NODE)
    wait_for(
        cluster,
        lambda: get_pod(cluster, E2E_NS, "held") is None and not _claims_on(cluster, NODE),
        timeout=60,
        message="the pod of the deleted Node and its claim were not garbage-collected",
    )
    wait_for(
        cluster,
        lambda: not _owner_uids(cluster, NODE),
        message="the deleted Node's ResourceSlices were not garbage-collected",
    )

    cluster.plugins[NODE].stop()  # its DaemonSet pod went with the Node
    cluster.restart_kubelet(NODE)  # the kubelet registers the Node again
    cluster.replace_plugin(NODE)
    new_uid = cluster.api.get(NODES, name=NODE)["metadata"]["uid"]
    assert new_uid != old_uid
    wait_for(
        cluster,
        lambda: _owner_uids(cluster, NODE) == {new_uid},
        message="the new plugin's slices do not name the new Node as their owner",
    )
    wait_for(
        cluster,
        lambda: not cluster.mig_instances(NODE),
        message="the slice of the deleted pod outlived its claim",
    )
    paths = cluster.node_paths(NODE)
    assert not [p for p in paths.cdi_root.glob("*") if p.is_file()]
    cluster.wait_ready()
    apply(cluster, [_pinned_pod("again")])
    wait_for(
        cluster,
        lambda: running(get_pod(cluster, E2E_NS, "again")),
        message="the node takes no pod after it registered again",
    )
