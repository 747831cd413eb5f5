"""``instaslice uninstall``: who would be stranded (pure), and the procedure against a local API server:
it refuses and changes nothing while pods hold slices; drained, it strands nothing."""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from api import names
from driver.cluster.kube import KubeClusterApi, connect
from driver.cluster.port import (
    DEVICE_CLASSES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    JsonObject,
    gate_names,
)
from driver.errors import ApiNotFoundError, ConfigError
from instaslice import cli
from instaslice.uninstall.manifests import KINDS
from instaslice.uninstall.run import Uninstaller
from instaslice.uninstall.survey import describe_holders, survey
from localcluster.apiserver import LocalApiServer
from tests.cli.objects import claim, pod, pool

NS = "demo"
REPO_ROOT = Path(__file__).resolve().parents[2]
SYSTEM = names.SYSTEM_NAMESPACE


def _owned(obj: JsonObject, kind: str, name: str) -> JsonObject:
    obj["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": kind,
            "name": name,
            "uid": f"uid-{name}",
            "controller": True,
        }
    ]
    return obj


def _with_template_claim(obj: JsonObject, claim_name: str) -> JsonObject:
    obj["spec"]["resourceClaims"] = [{"name": "mig", "resourceClaimTemplateName": "t"}]
    obj["status"]["resourceClaimStatuses"] = [{"name": "mig", "resourceClaimName": claim_name}]
    return obj


# --- survey (pure) ------------------------------------------------------------------------------


def test_a_pod_holds_a_slice_through_reservation_ownership_or_its_own_claim_refs() -> None:
    pods = [
        pod("reserved", node="node-0"),
        _owned(pod("classic", node="node-1"), "ReplicaSet", "web-7d9"),
        _with_template_claim(pod("pending"), "pending-mig"),
        pod("plain"),
        pod("finished", phase="Succeeded"),
    ]
    claims = [
        claim("reserved-mig", "gpu-0-1g-5gb-0", reserved_for=[("reserved", "pod-reserved")]),
        claim("classic-shadow", "gpu-0-1g-5gb-1", owner_pod=("classic", "pod-classic")),
        claim("pending-mig", "gpu-1-1g-5gb-0"),
        claim("finished-mig", "gpu-1-1g-5gb-1", reserved_for=[("finished", "pod-finished")]),
        claim("other-driver", "gpu-0", driver="gpu.example.com", owner_pod=("plain", "pod-plain")),
    ]
    found = survey(pods, claims)
    assert [(h.name, h.claims, h.node, h.owner) for h in found.holders] == [
        ("classic", ("classic-shadow",), "node-1", "ReplicaSet/web-7d9"),
        ("pending", ("pending-mig",), "", ""),
        ("reserved", ("reserved-mig",), "node-0", ""),
    ]
    # a finished pod holds nothing: its claim is released, however late its status says so
    assert found.unreserved_claims == (f"{NS}/finished-mig",)
    assert not found.clear


def test_gated_pods_without_slices_do_not_block_but_are_remembered() -> None:
    found = survey([pod("waiting", gates=(names.SCHEDULING_GATE,)), pod("other", gates=("x",))], [])
    assert found.clear
    assert found.gated == (f"{NS}/waiting",)


def test_the_refusal_lists_each_pod_with_its_node_claims_and_owner() -> None:
    found = survey(
        [pod("a", node="node-0"), _owned(pod("bb", node="node-1"), "ReplicaSet", "web-7d9")],
        [
            claim("a-mig", "gpu-0-1g-5gb-0", reserved_for=[("a", "pod-a")]),
            claim("bb-mig", "gpu-0-1g-5gb-1", reserved_for=[("bb", "pod-bb")]),
            claim("lost", "gpu-0-1g-5gb-2"),
        ],
    )
    assert describe_holders(found) == [
        "  demo/a   node node-0  claims a-mig   no owner: deleting it deletes it for good",
        "  demo/bb  node node-1  claims bb-mig  owned by ReplicaSet/web-7d9",
        "  claim demo/lost: allocated, used by no pod",
    ]


# --- the procedure, on a local API server --------------------------------------------------------


@pytest.fixture
def api(apiserver: LocalApiServer) -> Iterator[KubeClusterApi]:
    with connect(url=apiserver.url) as client:
        yield client


def _manifests() -> list[JsonObject]:
    """What a render holds, of the kinds the local API server serves."""
    selector = {"matchLabels": {"app": "plugin"}}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM}},
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "instaslice-kubelet-plugin", "namespace": SYSTEM},
            "spec": {
                "selector": selector,
                "template": {
                    "metadata": {"labels": {"app": "plugin"}},
                    "spec": {"containers": [{"name": "p", "image": "i"}]},
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "instaslice-webhook", "namespace": SYSTEM},
            "spec": {"ports": [{"port": 443}]},
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "instaslice-pod-gate"},
            "webhooks": [],
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "mig.instaslice.dev"},
            "spec": {},
        },
        # kinds the local API server does not serve: deleting them finds nothing, as on a
        # cluster where they were never created
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "instaslice-controller"},
        },
    ]


def _install(api: KubeClusterApi, objects: list[JsonObject]) -> None:
    for obj in objects:
        resource = KINDS[(obj["apiVersion"], obj["kind"])]
        if obj["kind"] == "ClusterRole":
            continue
        api.create(resource, copy.deepcopy(obj))
    for item in pool("node-0"):
        api.create(RESOURCE_SLICES, item)


def _create_holder(api: KubeClusterApi, name: str) -> None:
    """A running pod and its claim, allocated by our driver, reserved for it and owned by it (as
    a claim made from a template is: the garbage collector takes it with the pod)."""
    body = pod(name, node="node-0")
    body["metadata"].pop("uid")
    created = api.create(PODS, body)
    wanted = claim(
        f"{name}-mig",
        "gpu-0-1g-5gb-0",
        reserved_for=[(name, created["metadata"]["uid"])],
        owner_pod=(name, created["metadata"]["uid"]),
    )
    status = wanted.pop("status")
    wanted["metadata"].pop("uid")
    wanted["spec"] = {
        "devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": "x"}}]}
    }
    made = api.create(RESOURCE_CLAIMS, wanted)
    status["allocation"]["allocationTimestamp"] = "2026-01-01T00:00:00Z"
    api.update_status(RESOURCE_CLAIMS, {**made, "status": status})


class _Clock:
    """Time that passes only when the procedure sleeps. Each sleep also lets a little real time
    pass: what the procedure waits for is done by the local API server's threads (its garbage
    collector deletes a DaemonSet's pods before the DaemonSet), which need it on a loaded
    machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        time.sleep(min(seconds, 0.05))


def _no_metrics(namespace: str, pod: str, port: int) -> str:
    raise AssertionError(f"no plugin pod to ask, yet {namespace}/{pod}:{port} was asked")


def _uninstaller(
    api: KubeClusterApi,
    out: io.StringIO,
    clock: _Clock,
    read_metrics: Callable[[str, str, int], str] = _no_metrics,
) -> Uninstaller:
    return Uninstaller(
        api=api,
        out=out,
        read_metrics=read_metrics,
        timeout_s=30,
        poll_s=1,
        clock=clock,
        sleep=clock.sleep,
    )


def _plugin_pod(api: KubeClusterApi, name: str, node: str, *, ready: bool) -> None:
    """A pod of the plugin DaemonSet (no DaemonSet controller here: made by hand)."""
    body = pod(name, namespace=SYSTEM, node=node)
    body["metadata"].pop("uid")
    body["metadata"]["labels"] = {"app": "plugin"}
    body["spec"]["containers"][0]["ports"] = [{"name": "metrics", "containerPort": 9400}]
    created = api.create(PODS, body)
    created["status"] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    api.update_status(PODS, created)


def _gauge(slices: int) -> str:
    return (
        "# TYPE instaslice_kubelet_plugin_slices_in_use gauge\n"
        f'instaslice_kubelet_plugin_slices_in_use{{gpu="0",profile="1g.5gb"}} {slices}\n'
    )


def _exists(api: KubeClusterApi, obj: JsonObject) -> bool:
    resource = KINDS[(obj["apiVersion"], obj["kind"])]
    namespace = obj["metadata"].get("namespace") if resource.namespaced else None
    try:
        api.get(resource, name=obj["metadata"]["name"], namespace=namespace)
    except ApiNotFoundError:
        return False
    return True


def test_it_refuses_while_a_pod_holds_a_slice_and_changes_nothing(api: KubeClusterApi) -> None:
    objects = _manifests()
    _install(api, objects)
    _create_holder(api, "busy")
    out = io.StringIO()
    assert _uninstaller(api, out, _Clock()).run(objects, drain=False) == 1
    text = out.getvalue()
    assert text.startswith("refusing to uninstall: 1 pod holds MIG slices")
    assert "demo/busy" in text
    assert "claims busy-mig" in text
    assert "make undeploy DRAIN=true" in text
    assert all(_exists(api, o) for o in objects if o["kind"] != "ClusterRole")
    assert api.get(PODS, name="busy", namespace=NS)


def test_drained_it_strands_nothing_and_lifts_the_gate_of_waiting_dra_pods(
    api: KubeClusterApi,
) -> None:
    objects = _manifests()
    _install(api, objects)
    _create_holder(api, "busy")
    waiting = pod("waiting", gates=(names.SCHEDULING_GATE, "other.example.com/hold"))
    waiting["metadata"].pop("uid")
    api.create(PODS, waiting)
    classic = pod("classic", gates=(names.SCHEDULING_GATE,))
    classic["metadata"].pop("uid")
    classic["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-1g.5gb": "1"}}
    api.create(PODS, classic)
    out = io.StringIO()
    assert _uninstaller(api, out, _Clock()).run(objects, drain=True) == 0, out.getvalue()
    assert not any(_exists(api, o) for o in objects)
    with pytest.raises(ApiNotFoundError):
        api.get(PODS, name="busy", namespace=NS)
    assert api.list_objects(RESOURCE_CLAIMS).items == []
    assert api.list_objects(RESOURCE_SLICES).items == []
    # someone else's gate stays: the pod is theirs to release
    assert gate_names(api.get(PODS, name="waiting", namespace=NS)) == ["other.example.com/hold"]
    # only InstaSlice can serve a classic pod: it waits gated for a reinstall
    assert gate_names(api.get(PODS, name="classic", namespace=NS)) == [names.SCHEDULING_GATE]
    assert "kept instaslice.dev/placement on 1 classic pods" in out.getvalue()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("deleted 1 DeviceClasses")
    assert "evicted pod demo/busy" in lines
    assert lines[-1].startswith("InstaSlice removed")
    assert api.list_objects(DEVICE_CLASSES).items == []


def test_a_slice_nothing_releases_fails_the_drain_in_time_with_what_is_left(
    api: KubeClusterApi,
) -> None:
    objects = _manifests()
    _install(api, objects)
    lost = claim("lost", "gpu-0-1g-5gb-0")
    status = lost.pop("status")
    lost["metadata"].pop("uid")
    lost["spec"] = {"devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": "x"}}]}}
    made = api.create(RESOURCE_CLAIMS, lost)
    status["allocation"]["allocationTimestamp"] = "2026-01-01T00:00:00Z"
    api.update_status(RESOURCE_CLAIMS, {**made, "status": status})
    out = io.StringIO()
    clock = _Clock()
    assert _uninstaller(api, out, clock).run(objects, drain=True) == 1
    assert "FAILED: after 30s these still hold slices" in out.getvalue()
    assert "claim demo/lost: allocated, used by no pod" in out.getvalue()
    assert clock.now >= 30
    # the plugins stay: they still have a slice to release
    daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
    assert _exists(api, daemonset)


def test_the_command_deletes_what_the_manifests_file_names(
    api: KubeClusterApi, apiserver: LocalApiServer, tmp_path: Path
) -> None:
    objects = _manifests()
    _install(api, objects)
    manifests = tmp_path / "instaslice.yaml"
    manifests.write_text(yaml.safe_dump_all(objects), encoding="utf-8")
    assert cli.main(["uninstall", "--kube-api-url", apiserver.url, "-f", str(manifests)]) == 0
    assert api.list_objects(DEVICE_CLASSES).items == []


def test_an_unknown_kind_in_the_manifests_is_refused_before_anything_is_deleted(
    api: KubeClusterApi,
) -> None:
    objects = _manifests()
    _install(api, objects)
    strange = [
        *objects,
        {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}},
    ]
    with pytest.raises(ConfigError, match=r"Widget \(example.com/v1\) the uninstall does not"):
        _uninstaller(api, io.StringIO(), _Clock()).run(strange, drain=True)
    assert all(_exists(api, o) for o in objects if o["kind"] != "ClusterRole")


def test_the_plugins_stay_until_their_nodes_have_released_every_slice(api: KubeClusterApi) -> None:
    """The kubelet unprepares a deleted pod's claims after its object is gone: the plugin that
    does it must still be there."""
    objects = _manifests()
    _install(api, objects)
    _plugin_pod(api, "plugin-a", "node-0", ready=True)
    _plugin_pod(api, "plugin-b", "node-1", ready=False)
    asked: list[tuple[str, str, int]] = []
    clock = _Clock()

    def read_metrics(namespace: str, pod_name: str, port: int) -> str:
        asked.append((namespace, pod_name, port))
        return _gauge(2 if clock.now < 5 else 0)

    out = io.StringIO()
    assert _uninstaller(api, out, clock, read_metrics).run(objects, drain=True) == 0
    assert clock.now >= 5  # waited for node-0's two slices
    assert "every node released its slices" in out.getvalue()
    assert set(asked) == {(SYSTEM, "plugin-a", 9400)}  # a plugin that is not ready is not asked
    assert (
        f"WARNING: cannot confirm that node node-1 released its slices: plugin pod {SYSTEM}/plugin-b "
        "is not ready"
    ) in out.getvalue()


def test_slices_a_plugin_never_releases_fail_the_uninstall_before_it_removes_the_plugin(
    api: KubeClusterApi,
) -> None:
    objects = _manifests()
    _install(api, objects)
    _plugin_pod(api, "plugin-a", "node-0", ready=True)
    out = io.StringIO()
    code = _uninstaller(api, out, _Clock(), lambda *_: _gauge(3)).run(objects, drain=True)
    assert code == 1
    assert (
        "FAILED: after 30s the kubelet plugins still hold slices: node node-0: 3" in out.getvalue()
    )
    daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
    assert _exists(api, daemonset)


NOWHERE = "http://127.0.0.1:1"
"""No API server: a refusal that came after connecting would say so."""


@pytest.mark.parametrize(
    ("manifests", "words"),
    [
        pytest.param("", "the manifests are empty", id="empty"),
        pytest.param("---\n# nothing\n---\n", "the manifests are empty", id="only-separators"),
        pytest.param(
            yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}),
            "no the kubelet plugin's DaemonSet and no a DeviceClass",
            id="not-an-installation",
        ),
    ],
)
def test_manifests_that_are_not_an_installation_are_refused_before_connecting(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    manifests: str,
    words: str,
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(manifests))
    code = cli.main(["uninstall", "--kube-api-url", NOWHERE, "-f", "-"])
    captured = capsys.readouterr()
    assert code == 1
    (line,) = captured.err.splitlines()
    assert words in line
    assert "nothing was changed" in line
    assert "removed" not in captured.out


def test_an_empty_manifest_deletes_nothing_on_a_live_cluster(
    api: KubeClusterApi,
    apiserver: LocalApiServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = _manifests()
    _install(api, objects)
    slices = len(api.list_objects(RESOURCE_SLICES).items)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code = cli.main(["uninstall", "--kube-api-url", apiserver.url, "-f", "-"])
    assert code == 1
    assert "InstaSlice removed" not in capsys.readouterr().out
    assert slices > 0
    assert len(api.list_objects(RESOURCE_SLICES).items) == slices
    assert all(_exists(api, o) for o in objects if o["kind"] != "ClusterRole")


def test_make_undeploy_with_an_overlay_that_does_not_render_runs_no_uninstall() -> None:
    done = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-o",
            ".venv/.installed",
            "undeploy",
            "OVERLAY=no-such-overlay",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={
            **{k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")},
            "KUBECONFIG": "/nonexistent/kubeconfig",
        },
    )
    assert done.returncode != 0
    assert "no overlay deploy/overlays/no-such-overlay" in done.stderr
    assert "instaslice uninstall" not in done.stderr  # it never ran
    assert "InstaSlice removed" not in done.stdout
    assert "uninstall" not in done.stdout
