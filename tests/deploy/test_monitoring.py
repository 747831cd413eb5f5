"""The monitoring component (deploy/components/monitoring): its generated files are current, the
alert rules pass ``promtool check rules`` and their unit tests (``promtool test rules``), every
dashboard query is valid PromQL, every series the dashboard and the rules name is one the daemons
export, and the component renders with the scrape selectors matching our Services.

``promtool`` comes with Debian's ``prometheus`` package (``.ci/run`` installs it); without it these
tests skip, except in CI, where a missing promtool fails them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from api.checkpoint import Checkpoint
from controller.allocation.waitreport import WaitReport
from controller.metrics import ControllerMetrics, WebhookMetrics
from driver.gpu.emulated import EmulatedGpuBackend
from kubeletplugin.metrics import PluginMetrics
from kubeletplugin.nodestatemetrics import NodeStateCollector
from kubeletplugin.slicemetrics import SliceCollector
from kubeletplugin.sliceusage import SliceUsageCache
from tests.deploy import manifests as m

MONITORING = m.DEPLOY / "components" / "monitoring"


GENERATOR = m.monitoring_generator()


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(
                "promtool is not installed (Debian package prometheus): .ci/run installs it"
            )
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return path


def _run(*args: str, cwd: Path = MONITORING) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_generated_files_are_current() -> None:
    assert GENERATOR.main(["--check"]) == 0


def test_the_rule_file_passes_promtool_check() -> None:
    result = _run("check", "rules", "rules.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_alerts_pass_their_unit_tests() -> None:
    result = _run("test", "rules", "rules_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    rules = yaml.safe_load((MONITORING / "rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((MONITORING / "rules_test.yml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert alerts == fired


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool checks the syntax of rule expressions: each query as a recording rule."""
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:panel_{i}", "expr": expr}
                    for i, (_, expr) in enumerate(GENERATOR.queries())
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = _run("check", "rules", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


_SERIES = re.compile(r"\b(instaslice_[a-z0-9_]+)")
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


def _exported() -> set[str]:
    """Every metric family name the controller, the webhook and the kubelet plugin export (with
    the collectors each daemon registers for its scrape-time series)."""
    controller = ControllerMetrics()
    controller.bind_state(pending=lambda: 0, free=dict, leader=lambda: True, holds=dict)
    controller.bind_wait_report(WaitReport, leader=lambda: True)
    plugin = PluginMetrics()
    backend = EmulatedGpuBackend(node_name="n", spec="1xA100-40GB")
    plugin.registry.register(
        SliceCollector(node_name="n", checkpoint=Checkpoint, usage=SliceUsageCache(source=backend))
    )
    plugin.registry.register(
        NodeStateCollector(registered=lambda: True, instances=tuple, checkpoint=Checkpoint)
    )
    registries: list[CollectorRegistry] = [
        controller.registry,
        WebhookMetrics().registry,
        plugin.registry,
    ]
    return {family.name for registry in registries for family in registry.collect()}


def _named() -> Iterator[tuple[str, str]]:
    """(where, series name) of every ``instaslice_*`` series the dashboard and the rules use."""
    for title, expr in GENERATOR.queries():
        for name in _SERIES.findall(expr):
            yield f"panel {title!r}", name
    rules = yaml.safe_load((MONITORING / "rules.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            for name in _SERIES.findall(rule["expr"]):
                yield f"alert {rule['alert']}", name


def test_every_series_named_is_exported_by_a_daemon() -> None:
    exported = _exported()
    missing = []
    for where, name in _named():
        family = next((name[: -len(s)] for s in _SUFFIXES if name.endswith(s)), name)
        if family not in exported and name not in exported:
            missing.append(f"{where}: {name}")
    assert not missing, missing


def test_the_component_scrapes_our_services_and_ships_the_dashboard() -> None:
    objects = m.render_script("gpu", {"COMPONENTS": "monitoring"})
    services = {
        s["metadata"]["name"]: s
        for s in m.find(objects, "Service")
        if "metrics" in [p["name"] for p in s["spec"]["ports"]]
    }
    monitors = m.find(objects, "ServiceMonitor")
    assert len(monitors) == len(services) == 2
    for monitor in monitors:
        wanted = monitor["spec"]["selector"]["matchLabels"]
        (service,) = [
            s for s in services.values() if wanted.items() <= s["metadata"]["labels"].items()
        ]
        assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
        assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    (rule,) = m.find(objects, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((MONITORING / "rules.yml").read_text())
    (dashboard,) = [
        c for c in m.find(objects, "ConfigMap") if c["metadata"]["name"].endswith("dashboard")
    ]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["data"]["instaslice.json"] == (MONITORING / "dashboard.json").read_text()
