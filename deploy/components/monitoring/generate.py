"""Write the monitoring component's generated files, so they never drift from their sources.

- ``prometheusrule.yaml``: ``rules.yml`` (the plain Prometheus rule file, the one source of the
  alerts) as a prometheus-operator ``PrometheusRule``.
- ``dashboard.json``: the Grafana dashboard, from ``PANELS`` below. Every panel's query is also in
  ``queries()``, which the tests hand to a real Prometheus (``promtool`` for the syntax; the deploy
  tier evaluates each against the deployed daemons and wants data back).

Run ``python deploy/components/monitoring/generate.py`` (or ``make monitoring``) after changing
either source; ``--check`` exits 1 when a committed file differs (a test runs it).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE / "rules.yml"
PROMETHEUS_RULE = HERE / "prometheusrule.yaml"
DASHBOARD = HERE / "dashboard.json"

CONTROLLER_JOB = "instaslice-controller-metrics"
PLUGIN_JOB = "instaslice-kubelet-plugin-metrics"


@dataclass(frozen=True)
class Panel:
    title: str
    expr: str
    legend: str = ""
    unit: str = "short"
    kind: str = "timeseries"
    description: str = ""


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


def _p99(metric: str, by: str = "le") -> str:
    return f"histogram_quantile(0.99, sum by ({by}) (rate({metric}_bucket[5m])))"


PANELS: tuple[Row, ...] = (
    Row(
        "Fleet",
        (
            Panel(
                "MIG slices in use, by profile",
                "sum by (profile) (instaslice_kubelet_plugin_slices_in_use)",
                "{{profile}}",
            ),
            Panel(
                "Free placements, by profile",
                "max by (profile) (instaslice_controller_free_placements)",
                "{{profile}}",
                description="Instances of each profile that could still be created, each GPU "
                "counted for that profile alone.",
            ),
            Panel(
                "Slices in use, top 10 namespaces",
                "topk(10, count by (pod_namespace) (instaslice_kubelet_plugin_slice_info))",
                "{{pod_namespace}}",
                kind="bargauge",
            ),
            Panel(
                "Slice-hours, last 24 h, top 10 namespaces",
                "topk(10, sum by (claim_namespace) "
                "(increase(instaslice_kubelet_plugin_slice_seconds_total[24h])) / 3600)",
                "{{claim_namespace}}",
                kind="bargauge",
                description="For chargeback: slice-seconds accumulated by the pods of each "
                "namespace, in hours.",
            ),
        ),
    ),
    Row(
        "Slices and their pods",
        (
            Panel(
                "Memory used per slice, by pod",
                "sum by (pod_namespace, pod_name, profile) ("
                "instaslice_kubelet_plugin_slice_memory_used_bytes * on (mig_uuid) "
                "group_left (pod_namespace, pod_name, profile) "
                "instaslice_kubelet_plugin_slice_info)",
                "{{pod_namespace}}/{{pod_name}} ({{profile}})",
                unit="bytes",
                description="Each slice's memory in use (NVML, per MIG device), attributed to "
                "its pod through slice_info.",
            ),
            Panel(
                "Slices by kind of request",
                "count by (kind) (instaslice_kubelet_plugin_slice_info)",
                "{{kind}}",
                description="dra: a ResourceClaim; classic: an nvidia.com/mig-* request served "
                "through a shadow claim.",
            ),
        ),
    ),
    Row(
        "Waiting pods",
        (
            Panel(
                "Pods waiting, by reason",
                "sum by (reason) (instaslice_controller_waiting_pods)",
                "{{reason}}",
                description="no-capacity, fragmented (defragmentation would help), node-filter, "
                "reserved, preempting, quota, gated-elsewhere, unsatisfiable, invalid, hand-off, "
                "pending (README: Status, metrics and health).",
            ),
            Panel(
                "Oldest waiting pod, by profile",
                "max by (profile) (instaslice_controller_oldest_waiting_pod_seconds)",
                "{{profile}}",
                unit="s",
            ),
            Panel(
                "Stranded share of free memory slices, by GPU model",
                "sum by (model) (instaslice_controller_stranded_memory_slices) "
                "/ sum by (model) (instaslice_controller_free_memory_slices)",
                "{{model}}",
                unit="percentunit",
                description="Free memory slices on GPUs where no profile a waiting pod asks for "
                "fits, over all free memory slices (0 while nobody waits for capacity).",
            ),
            Panel(
                "Creation to placement, p99",
                _p99("instaslice_controller_allocation_latency_seconds"),
                "p99",
                unit="s",
            ),
        ),
    ),
    Row(
        "Nodes",
        (
            Panel(
                "Kubelet plugins answering",
                f'sum(up{{job="{PLUGIN_JOB}"}})',
                "up",
                kind="stat",
            ),
            Panel(
                "Kubelet plugins registered with their kubelet",
                "sum(instaslice_kubelet_plugin_registered)",
                "registered",
                kind="stat",
            ),
            Panel(
                "GPUs by health",
                "sum by (health) (instaslice_kubelet_plugin_gpus)",
                "{{health}}",
            ),
            Panel(
                "MIG instances without a claim (must be 0)",
                "sum(instaslice_kubelet_plugin_unowned_instances)",
                "leaked",
                kind="stat",
            ),
            Panel(
                "Prepare and unprepare, p99",
                _p99("instaslice_kubelet_plugin_claim_operation_seconds", "le, operation"),
                "{{operation}}",
                unit="s",
            ),
        ),
    ),
    Row(
        "Pod webhook",
        (
            Panel(
                "Webhook answer time, p99",
                _p99("instaslice_webhook_request_duration_seconds"),
                "p99",
                unit="s",
            ),
            Panel(
                "Admissions, by decision",
                "sum by (decision) (rate(instaslice_webhook_admissions_total[5m]))",
                "{{decision}}",
                unit="reqps",
            ),
        ),
    ),
)


def queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel, in dashboard order."""
    return [(panel.title, panel.expr) for row in PANELS for panel in row.panels]


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "gridPos": {"h": 8, "w": 6, "x": x, "y": y},
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "targets": [{"refId": "A", "expr": panel.expr, "legendFormat": panel.legend}],
    }


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y = 0
    for row in PANELS:
        panels.append(
            {
                "id": len(panels) + 1,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        for i, panel in enumerate(row.panels):
            panels.append(_panel(panel, len(panels) + 1, x=(i % 4) * 6, y=y + (i // 4) * 8))
        y += 8 * ((len(row.panels) + 3) // 4)
    return {
        "uid": "instaslice",
        "title": "InstaSlice: MIG slices",
        "tags": ["instaslice", "gpu", "mig"],
        "timezone": "browser",
        "schemaVersion": 39,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                }
            ]
        },
        "panels": panels,
    }


def prometheus_rule() -> dict[str, Any]:
    rules = yaml.safe_load(RULES.read_text())
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "instaslice",
            "namespace": "instaslice-system",
            "labels": {"app.kubernetes.io/name": "instaslice"},
        },
        "spec": rules,
    }


def rendered() -> dict[Path, str]:
    header = (
        "# Generated by deploy/components/monitoring/generate.py from rules.yml: edit that file\n"
        "# and run `make monitoring`.\n"
    )
    return {
        PROMETHEUS_RULE: header + yaml.safe_dump(prometheus_rule(), sort_keys=False, width=100),
        DASHBOARD: json.dumps(dashboard(), indent=2) + "\n",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is out of date")
    args = parser.parse_args(argv)
    stale = [
        path for path, text in rendered().items() if not path.exists() or path.read_text() != text
    ]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(HERE.parents[2])} is out of date: run `make monitoring`")
        return 1 if stale else 0
    for path in stale:
        path.write_text(rendered()[path])
        print(f"wrote {path.relative_to(HERE.parents[2])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
