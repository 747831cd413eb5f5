"""Every sample a user applies (``kubectl apply -k samples/``) Running as a real container with
exactly its slices, and a claim with an opaque config; the daemons observed as an operator does:
metrics through their Services, ``kubectl logs``, probes."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from datetime import datetime

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from api import names
from driver.cdi import VISIBLE_DEVICES_ENV
from driver.cluster.port import PODS, JsonObject
from driver.cluster.views import PodView
from tests.deploy.manifests import monitoring_generator
from tests.deployed import checks
from tests.deployed.conftest import logs_dir
from tests.deployed.deploy import QUOTA_NS, SAMPLES, SAMPLES_NS, TIER_NS, Deploy, sample_path
from tests.deployed.prometheus import SCRAPE_SECONDS, Prometheus, targets

OPAQUE_ENV = {"HF_HOME": "/models/cache", "TIER_GREETING": "hello from the claim"}


def _claim_pod(
    name: str,
    namespace: str,
    *,
    claim: str = "",
    template: str = "",
    limits: dict[str, str] | None = None,
) -> JsonObject:
    """A busybox pod that sleeps holding one claim (by name, or made from ``template``), or, with
    ``limits``, asking for classic resources instead."""
    app: JsonObject = {
        "name": "app",
        "image": "busybox:1.36",
        "command": ["sh", "-c", "exec sleep 86400"],
        "resources": {"limits": limits} if limits else {"claims": [{"name": "mig"}]},
    }
    spec: JsonObject = {"containers": [app]}
    if not limits:
        source = (
            {"resourceClaimTemplateName": template} if template else {"resourceClaimName": claim}
        )
        spec["resourceClaims"] = [{"name": "mig", **source}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def _opaque_config_workload() -> str:
    """A claim template whose opaque config asks for environment variables, and its pod."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "mig-with-env", "namespace": TIER_NS},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "mig", "exactly": {"deviceClassName": "mig-1g.5gb.instaslice.dev"}}
                    ],
                    "config": [
                        {
                            "requests": ["mig"],
                            "opaque": {
                                "driver": names.DRIVER_NAME,
                                "parameters": {
                                    "apiVersion": "mig.instaslice.dev/v1alpha1",
                                    "kind": "MigDeviceConfig",
                                    "env": OPAQUE_ENV,
                                },
                            },
                        }
                    ],
                }
            }
        },
    }
    pod = _claim_pod("opaque-config", TIER_NS, template="mig-with-env")
    return yaml.safe_dump_all([template, pod])


def test_every_sample_runs_as_a_real_container_with_exactly_its_slices(deployed: Deploy) -> None:
    deployed.install("emulated")
    deployed.namespaces()
    deployed.apply_ok("-k", str(SAMPLES))
    deployed.apply_ok("-f", "-", stdin=_opaque_config_workload())
    pods = [
        *deployed.wait_running(SAMPLES_NS),
        *deployed.wait_running(QUOTA_NS),
        *deployed.wait_running(TIER_NS),
    ]
    deployed.cluster.wait_for(
        lambda: (
            deployed.cluster.kubectl(
                "-n", SAMPLES_NS, "get", "job/mig-job", "-o", "jsonpath={.status.succeeded}"
            ).stdout
            == "4"
        ),
        timeout=180,
        message="job mig-job did not complete",
    )
    running = checks.running_pods(deployed.cluster, [SAMPLES_NS, QUOTA_NS, TIER_NS])
    assert len(running) >= 13, [p["metadata"]["name"] for p in pods]
    views = [checks.check_container(deployed.cluster, pod) for pod in running]
    checks.check_no_slice_twice(views)
    opaque = next(v for v in views if v.pod == f"{TIER_NS}/opaque-config")
    assert {k: opaque.env.get(k) for k in OPAQUE_ENV} == OPAQUE_ENV
    three = next(v for v in views if v.pod == f"{SAMPLES_NS}/three-slices")
    assert len(three.mig_uuids) == 3
    assert checks.leaks(deployed.cluster) == []


def test_metrics_are_scraped_through_the_services(deployed: Deploy) -> None:
    cluster = deployed.cluster
    controller_ip = cluster.kubectl(
        "-n", names.SYSTEM_NAMESPACE, "get", "service", "instaslice-controller-metrics",
        "-o", "jsonpath={.spec.clusterIP}",
    ).stdout  # fmt: skip
    text = _get(f"http://{controller_ip}:8080/metrics")
    assert "instaslice_controller_" in text
    # every plugin behind its Service: each node's figures, from each endpoint
    by_node = _plugin_endpoints(deployed)
    assert set(by_node) == set(cluster.node_names)
    in_use = 0.0
    for address in by_node.values():
        in_use += checks.metric_sum(
            _get(f"http://{address}:9400/metrics"), "instaslice_kubelet_plugin_slices_in_use"
        )
    held = sum(len(v) for v in _held(deployed).values())
    assert in_use == held
    plugin_ip = cluster.kubectl(
        "-n", names.SYSTEM_NAMESPACE, "get", "service", "instaslice-kubelet-plugin-metrics",
        "-o", "jsonpath={.spec.clusterIP}",
    ).stdout  # fmt: skip
    assert "instaslice_kubelet_plugin_gpus" in _get(f"http://{plugin_ip}:9400/metrics")


def _unsatisfiable_workload() -> str:
    """A pod whose claim asks more 1g.5gb slices than any node has: it waits for good (the
    waiting-pod panels need one)."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "too-many", "namespace": TIER_NS},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "mig",
                        "exactly": {"deviceClassName": "mig-1g.5gb.instaslice.dev", "count": 64},
                    }
                ]
            }
        },
    }
    pod = _claim_pod("too-many", TIER_NS, claim="too-many")
    return yaml.safe_dump_all([claim, pod])


def test_prometheus_answers_every_dashboard_panel_and_keeps_the_alerts_silent(
    deployed: Deploy,
) -> None:
    """A real Prometheus scraping as the ServiceMonitors do: every dashboard query returns data,
    and no alert's expression holds on a healthy deployment but the one about the unsatisfiable
    pod the test adds."""
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (Debian: apt-get install prometheus)")
    cluster = deployed.cluster
    deployed.apply_ok("-f", "-", stdin=_unsatisfiable_workload())
    found = targets(lambda *args: cluster.kubectl(*args).stdout)
    expected = 2 + len(cluster.node_names)  # two controller replicas, a plugin per node
    assert len(found) == expected, found
    prometheus = Prometheus(targets=found, log=logs_dir() / "prometheus.log")
    try:
        prometheus.wait(f"count(up == 1) == {expected}", what=f"{expected} targets up")
        prometheus.wait(
            'sum(instaslice_controller_waiting_pods{reason="unsatisfiable"}) > 0',
            what="the unsatisfiable pod counted",
        )
        time.sleep(3 * SCRAPE_SECONDS)  # rates need two samples in their window
        _every_running_slice_is_attributed(deployed, prometheus)
        generator = monitoring_generator()
        empty = [title for title, expr in generator.queries() if not prometheus.query(expr)]
        assert not empty, f"panels without data: {empty}"
        rules = yaml.safe_load(generator.RULES.read_text())
        holding = {
            rule["alert"]: result
            for group in rules["groups"]
            for rule in group["rules"]
            if (result := prometheus.query(rule["expr"]))
        }
        # the pod made for the waiting panels is what InstaSliceUnsatisfiablePods is about
        assert set(holding) == {"InstaSliceUnsatisfiablePods"}, (
            f"alert expressions that hold on a healthy deployment: {holding}"
        )
    finally:
        prometheus.stop()
        cluster.kubectl("-n", TIER_NS, "delete", "pod,resourceclaim", "too-many", check=False)


def _every_running_slice_is_attributed(deployed: Deploy, prometheus: Prometheus) -> None:
    """For every running pod with a slice: ``slice_info`` names it with exactly the MIG UUIDs
    its container sees in NVIDIA_VISIBLE_DEVICES (the series an operator joins on)."""
    attributed: dict[str, set[str]] = {}
    for sample in prometheus.query("instaslice_kubelet_plugin_slice_info"):
        labels = sample["metric"]
        for name in labels["pod_name"].split(","):  # a shared claim lists every pod
            key = f"{labels['pod_namespace']}/{name}"
            attributed.setdefault(key, set()).add(labels["mig_uuid"])
    running = checks.running_pods(deployed.cluster, [SAMPLES_NS, QUOTA_NS, TIER_NS])
    seen = {v.pod: v for v in (checks.container_view(deployed.cluster, p) for p in running)}
    visible = {
        key: set(view.env[VISIBLE_DEVICES_ENV].split(","))
        for key, view in seen.items()
        if view.env.get(VISIBLE_DEVICES_ENV)
    }
    assert visible, "no running pod with a slice"
    assert {k: attributed.get(k) for k in visible} == visible


def test_every_daemon_logs_json_to_kubectl_logs_and_passes_its_probes(deployed: Deploy) -> None:
    cluster = deployed.cluster
    daemons = deployed.api.list_objects(PODS, namespace=names.SYSTEM_NAMESPACE).items
    assert len(daemons) == 4  # two controller replicas, one plugin per node
    for pod in daemons:
        view = PodView.of(pod)
        ready = view.condition("Ready")
        assert ready is not None, f"{view.key} has no Ready condition"
        assert ready.true, f"{view.key} is not ready"
        status = pod["status"]["containerStatuses"][0]
        assert status["restartCount"] == 0, f"{view.key} restarted"
        lines = cluster.kubectl("-n", view.namespace, "logs", view.name).stdout.splitlines()
        assert lines, f"{view.key} logged nothing"
        records = [json.loads(line) for line in lines]
        assert all({"ts", "level", "logger", "msg"} <= set(r) for r in records)
    events = cluster.kubectl(
        "-n", names.SYSTEM_NAMESPACE, "get", "events", "--field-selector", "reason=Unhealthy",
        "-o", "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
    ).stdout  # fmt: skip
    assert "Liveness probe failed" not in events, events


PRIVILEGES_SCRIPT = (
    "id -u; grep '^CapEff:' /proc/self/status; "
    "touch /written 2>/dev/null && echo writable || echo read-only"
)


def test_each_daemon_runs_with_the_privileges_docs_deploy_md_states(deployed: Deploy) -> None:
    """From inside: the controller is UID 65532, the emulated plugin root; neither has a
    capability, and neither can write its root filesystem."""
    expected = {"controller": "65532", "kubelet-plugin": "0"}
    for pod in deployed.api.list_objects(PODS, namespace=names.SYSTEM_NAMESPACE).items:
        view = PodView.of(pod)
        component = view.meta.labels["app.kubernetes.io/component"]
        uid, caps, root = deployed.cluster.exec(view.namespace, view.name, PRIVILEGES_SCRIPT).split(
            "\n"
        )[:3]
        assert uid == expected[component], f"{view.key} runs as {uid}"
        assert caps.split() == ["CapEff:", "0000000000000000"], f"{view.key}: {caps}"
        assert root == "read-only", f"{view.key} can write its root filesystem"


def test_the_large_profile_samples_run_alone(deployed: Deploy) -> None:
    for namespace in (SAMPLES_NS, QUOTA_NS, TIER_NS):
        deployed.delete_namespaced(namespace)
    deployed.cluster.wait_for(
        lambda: not checks.node_artifacts(deployed.cluster),
        timeout=60,
        message="slices left after the samples ended",
        explain=lambda: str(checks.node_artifacts(deployed.cluster)),
    )
    deployed.apply_ok("-k", sample_path("large-profiles"))
    pods = deployed.wait_running(SAMPLES_NS)
    views = [checks.check_container(deployed.cluster, pod) for pod in pods]
    assert len(views) == 2
    checks.check_no_slice_twice(views)
    deployed.delete_namespaced(SAMPLES_NS)


def _plugin_endpoints(deployed: Deploy) -> dict[str, str]:
    """Node -> the address of its ready kubelet plugin behind the metrics Service."""
    endpoints = json.loads(
        deployed.cluster.kubectl(
            "-n", names.SYSTEM_NAMESPACE, "get", "endpointslices",
            "-l", "kubernetes.io/service-name=instaslice-kubelet-plugin-metrics", "-o", "json",
        ).stdout
    )  # fmt: skip
    return {
        e["nodeName"]: e["addresses"][0]
        for s in endpoints["items"]
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready")
    }


def _plugin_samples(deployed: Deploy, family: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of ``instaslice_kubelet_plugin_<family>`` from every node's plugin."""
    out = []
    for address in _plugin_endpoints(deployed).values():
        text = _get(f"http://{address}:9400/metrics")
        for metric in text_string_to_metric_families(text):
            out += [
                (dict(sample.labels), sample.value)
                for sample in metric.samples
                if sample.name == f"instaslice_kubelet_plugin_{family}"
            ]
    return out


def _held(deployed: Deploy) -> dict[str, list[str]]:
    """Node -> MIG UUIDs of the instances on it."""
    return {
        node: [str(i.mig_uuid) for i in deployed.cluster.mig_instances(node, gpus=checks.GPUS)]
        for node in deployed.cluster.node_names
    }


def _get(url: str) -> str:
    """GET from a cluster address, never through the machine's egress proxy."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as reply:
        return str(reply.read().decode())


CHARGE_NS = "instaslice-chargeback"


def _chargeback_workload() -> str:
    """A DRA pod and a classic pod of one 1g.5gb slice each, in a namespace of their own."""
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CHARGE_NS}}
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-slice", "namespace": CHARGE_NS},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "mig", "exactly": {"deviceClassName": "mig-1g.5gb.instaslice.dev"}}
                    ]
                }
            }
        },
    }
    dra = _claim_pod("dra", CHARGE_NS, template="one-slice")
    classic = _claim_pod("classic", CHARGE_NS, limits={"nvidia.com/mig-1g.5gb": "1"})
    return yaml.safe_dump_all([namespace, template, dra, classic])


def _seconds_charged(deployed: Deploy) -> float:
    return sum(
        value
        for labels, value in _plugin_samples(deployed, "slice_seconds_total")
        if labels["claim_namespace"] == CHARGE_NS
    )


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_each_slice_is_attributed_to_its_pod_and_charged_to_its_namespace(
    deployed: Deploy,
) -> None:
    """slice_info names each pod with the MIG UUID it sees, of its kind; the namespace's
    slice-seconds lie between what the pods' creation and their containers' start give (a slice
    is made after the one, before the other; timestamps are whole seconds); an ended pod's
    series is gone from its plugin's next scrape and its seconds stay counted."""
    deployed.apply_ok("-f", "-", stdin=_chargeback_workload())
    try:
        pods = deployed.wait_running(CHARGE_NS)
        seen = {PodView.of(p).name: checks.container_view(deployed.cluster, p) for p in pods}
        info = {
            labels["pod_name"]: labels
            for labels, _ in _plugin_samples(deployed, "slice_info")
            if labels["pod_namespace"] == CHARGE_NS
        }
        assert {name: {info[name]["mig_uuid"]} for name in info} == {
            name: set(view.env[VISIBLE_DEVICES_ENV].split(",")) for name, view in seen.items()
        }
        assert {name: labels["kind"] for name, labels in info.items()} == {
            "dra": "dra",
            "classic": "classic",
        }
        before = time.time()
        charged = _seconds_charged(deployed)
        after = time.time()
        created = [_epoch(p["metadata"]["creationTimestamp"]) for p in pods]
        started = [
            _epoch(p["status"]["containerStatuses"][0]["state"]["running"]["startedAt"])
            for p in pods
        ]
        low = sum(before - s - 1 for s in started)
        high = sum(after - c + 1 for c in created)
        assert low <= charged <= high, (low, charged, high)

        gone = info["classic"]["mig_uuid"]
        deployed.cluster.kubectl("-n", CHARGE_NS, "delete", "pod", "classic", "--wait=true")
        deployed.cluster.wait_for(
            lambda: all(
                labels["mig_uuid"] != gone for labels, _ in _plugin_samples(deployed, "slice_info")
            ),
            timeout=60,
            message="the ended pod's slice_info stayed",
        )
        assert _seconds_charged(deployed) >= charged  # released seconds stay counted
    finally:
        deployed.delete_namespaced(CHARGE_NS)
        deployed.cluster.kubectl("delete", "namespace", CHARGE_NS, "--ignore-not-found")
