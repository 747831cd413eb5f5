"""A real Prometheus (Debian's ``prometheus`` package) scraping the deployed daemons the way the
monitoring component's ServiceMonitors do: every ready endpoint of the two metrics Services, ``job``
set to the Service's name, ``namespace`` and ``pod`` of the target. Debian builds Prometheus
without Kubernetes service discovery, so the endpoints are read from the Services' EndpointSlices
here (what the ServiceMonitor's discovery reads) and given as static targets with those labels. It
loads the component's alert rules and answers PromQL over its HTTP API. Listens on loopback only;
its data lives in a temporary directory removed on stop."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from api import names
from localcluster.daemonstack import free_port

SERVICES = {"instaslice-controller-metrics": 8080, "instaslice-kubelet-plugin-metrics": 9400}
"""The metrics Services and their port (deploy/base/metrics.yaml)."""
RULES = Path(__file__).resolve().parents[2] / "deploy" / "components" / "monitoring" / "rules.yml"
SCRAPE_SECONDS = 1


@dataclass(frozen=True, slots=True)
class Target:
    service: str
    address: str
    pod: str


def targets(kubectl: Callable[..., str]) -> list[Target]:
    """Every ready endpoint behind the metrics Services (``kubectl`` returns a command's stdout)."""
    found = []
    for service in SERVICES:
        slices = json.loads(
            kubectl(
                "-n", names.SYSTEM_NAMESPACE, "get", "endpointslices",
                "-l", f"kubernetes.io/service-name={service}", "-o", "json",
            )
        )  # fmt: skip
        for item in slices["items"]:
            for endpoint in item.get("endpoints") or []:
                if (endpoint.get("conditions") or {}).get("ready"):
                    pod = (endpoint.get("targetRef") or {}).get("name", "")
                    found.append(Target(service, endpoint["addresses"][0], pod))
    return found


def scrape_config(found: Sequence[Target]) -> dict[str, Any]:
    """The ServiceMonitors' scrape, as plain Prometheus configuration."""
    return {
        "global": {
            "scrape_interval": f"{SCRAPE_SECONDS}s",
            "evaluation_interval": f"{SCRAPE_SECONDS}s",
        },
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": service,
                "static_configs": [
                    {
                        "targets": [f"{t.address}:{port}"],
                        "labels": {"namespace": names.SYSTEM_NAMESPACE, "pod": t.pod},
                    }
                    for t in found
                    if t.service == service
                ],
            }
            for service, port in SERVICES.items()
        ],
    }


class Prometheus:
    def __init__(self, *, targets: Sequence[Target], log: Path) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed (apt-get install prometheus)")
        self._dir = Path(tempfile.mkdtemp(prefix="instaslice-prometheus-"))
        config = self._dir / "prometheus.yml"
        config.write_text(yaml.safe_dump(scrape_config(targets)))
        self.url = f"http://127.0.0.1:{free_port()}"
        self._log = log.open("w")
        self._process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self._dir / 'data'}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
            body = json.loads(response.read())
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar, as one sample) ``expr`` gives now."""
        data = self._get("/api/v1/query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def wait(self, expr: str, *, timeout: float = 120, what: str = "") -> list[dict[str, Any]]:
        """``query(expr)`` once it returns something."""
        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                raise AssertionError(f"prometheus exited ({self._process.returncode})")
            try:
                result = self.query(expr)
            except OSError:
                result = []  # not listening yet
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what or expr}")
            time.sleep(SCRAPE_SECONDS)
