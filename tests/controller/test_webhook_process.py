"""The webhook in its own process: the controller starts it, restarts it when it dies, and it ends
with the controller, even one killed with ``SIGKILL``; its answers come from its own caches."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path

import pytest

from api.names import SCHEDULING_GATE
from controller.metrics import ControllerMetrics, WebhookMetrics
from controller.settings import parse_settings
from controller.webhook.child import WebhookChild
from controller.webhook.process import main as webhook_main
from driver.cluster.port import PODS, RESOURCE_CLAIMS, gate_names
from localcluster.apiserver import LocalApiServer
from localcluster.stack import free_port
from tests.controller.daemon import (
    ROOT,
    WEBHOOK_CONFIGURATIONS,
    controller_command,
    http_get,
    webhook_configuration,
)
from tests.controller.harness import (
    NS,
    claim_object,
    client,
    create_device_classes,
    pod_object,
    publish_node,
    wait_for,
)

GATED_ONCE = 'instaslice_webhook_admissions_total{decision="gated"} 1.0'


def _scrape_with(port: int, line: str) -> str | None:
    """The controller's /metrics if it holds ``line``."""
    text = http_get(f"http://127.0.0.1:{port}/metrics")[1]
    return text if line in text else None


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live processes whose parent is ``pid`` (Linux ``/proc``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) != pid or fields[0] == "Z":
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
        found.append((int(entry.name), command))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _gone(pid: int) -> bool:
    return not _alive(pid)


def _webhook_children(pid: int) -> list[int]:
    return [child for child, command in _children(pid) if "controller.webhook.process" in command]


def test_the_flag_is_on_by_default_and_can_be_turned_off() -> None:
    assert parse_settings([], environ={}).webhook_process is True
    assert parse_settings(["--no-webhook-process"], environ={}).webhook_process is False
    env = {"INSTASLICE_WEBHOOK_PROCESS": "false"}
    assert parse_settings([], environ=env).webhook_process is False


def test_the_webhook_process_refuses_port_zero() -> None:
    assert webhook_main(["--webhook-port", "0", "--kube-api-url", "http://127.0.0.1:1"]) == 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_controller_runs_restarts_and_takes_down_its_webhook_process(
    gated_server: LocalApiServer, webhook_port: int, tmp_path: Path
) -> None:
    with client(gated_server) as api:
        create_device_classes(api)
        publish_node(api, "node-a", gpus=1)
        # Fail: a pod created while no webhook answers is refused, never let through ungated, so
        # each create below proves an answer.
        api.create(WEBHOOK_CONFIGURATIONS, webhook_configuration(failure_policy="Fail"))
        health, metrics = free_port(), free_port()
        process = subprocess.Popen(
            controller_command(
                gated_server.url,
                webhook_port=webhook_port,
                cert_dir=tmp_path / "certs",
                healthz_port=health,
                extra=["--no-leader-elect", "--metrics-address", f"127.0.0.1:{metrics}",
                       "--log-level", "WARNING"],
            ),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        children: list[int] = []
        try:
            ready = f"http://127.0.0.1:{health}/readyz"
            wait_for(lambda: http_get(ready)[0] == 200, timeout=30, what="/readyz")
            children = wait_for(
                lambda: _webhook_children(process.pid), timeout=30, what="webhook child"
            )
            assert len(children) == 1
            first = children[0]

            api.create(RESOURCE_CLAIMS, claim_object("c1"), namespace=NS)
            created = api.create(PODS, pod_object("p1", claims=["c1"], gates=()), namespace=NS)
            assert gate_names(created) == [SCHEDULING_GATE]
            # one scrape target: the controller's /metrics carries the webhook process's figures
            # (counted just after the answer is sent: it may lag the create's return)
            scraped = wait_for(
                partial(_scrape_with, metrics, GATED_ONCE), timeout=10, what="webhook metrics"
            )
            assert "instaslice_controller_pods_ungated_total" in scraped

            os.kill(first, signal.SIGKILL)
            wait_for(lambda: not _alive(first), timeout=30, what="the first webhook process gone")
            restarted = wait_for(
                lambda: [c for c in _webhook_children(process.pid) if c != first],
                timeout=30,
                what="the webhook process started again",
            )
            children = restarted
            wait_for(
                lambda: http_get(ready)[0] == 200, timeout=30, what="/readyz after the restart"
            )
            api.create(RESOURCE_CLAIMS, claim_object("c2"), namespace=NS)
            created = api.create(PODS, pod_object("p2", claims=["c2"], gates=()), namespace=NS)
            assert gate_names(created) == [SCHEDULING_GATE]  # answered by the new process
            # ... read from the new process (its counters start again)
            wait_for(partial(_scrape_with, metrics, GATED_ONCE), timeout=10, what="new metrics")
        finally:
            process.kill()  # as a crash or an OOM kill would end it
            process.wait()
        for child in children:
            wait_for(partial(_gone, child), timeout=30, what="the child ended")


def test_no_webhook_process_running_means_no_figures_of_its_own() -> None:
    assert WebhookChild(argv=[], stop=threading.Event()).scrape() == b""


def test_a_webhook_served_in_the_controller_counts_in_the_controllers_registry() -> None:
    controller = ControllerMetrics()
    WebhookMetrics(controller.registry).answered(200, 0.002, {"response": {"allowed": True}})
    text = controller.exposition().decode()
    assert "instaslice_controller_pods_ungated_total" in text
    assert 'instaslice_webhook_admissions_total{decision="allowed"} 1.0' in text
