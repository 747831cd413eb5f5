"""The real cluster-autoscaler (1.36, externalgrpc provider only) as a child process.

``../shared/realstack/autoscaler/build-cluster-autoscaler.sh`` builds it (default
``${TMPDIR:-/tmp}/ca-build/bin/cluster-autoscaler``; ``INSTASLICE_CLUSTER_AUTOSCALER`` names
another). It runs against the real stack's API server as cluster admin, with a cloud config naming
the test provider's gRPC address, and logs to a file.

:class:`AutoscalerSettings` holds the flags that decide how fast it acts; the defaults are
cluster-autoscaler's own where they are short enough for a test (``--scan-interval`` 10 s: the
figure the hand-off delay is weighed against) and shortened where they would make a test wait
minutes (scale-down after 20 s unneeded instead of 10 min, a node found unremovable checked again
after 15 s instead of 5 min).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from localcluster.daemonstack import free_port
from localcluster.realstack import describe_missing as describe_missing_stack
from localcluster.realstack import not_built, stack_path

STOP_TIMEOUT_S = 10.0


def binary_path() -> Path:
    return stack_path("INSTASLICE_CLUSTER_AUTOSCALER", "ca-build", "bin", "cluster-autoscaler")


def describe_missing() -> str | None:
    """One line saying why the autoscaling tier cannot run here, or None when it can."""
    stack = describe_missing_stack()
    if stack is not None:
        return stack
    return not_built(
        "cluster-autoscaler",
        [] if binary_path().is_file() else [str(binary_path())],
        see="../shared/realstack/README.md 'A real cluster-autoscaler'",
    )


@dataclass(frozen=True, slots=True)
class AutoscalerSettings:
    scan_interval_s: int = 10
    scale_down_unneeded_s: int = 20
    scale_down_delay_after_add_s: int = 20
    unremovable_recheck_s: int = 15
    max_node_provision_s: int = 300
    max_graceful_termination_s: int = 30
    verbosity: int = 4

    def args(self) -> list[str]:
        return [
            f"--scan-interval={self.scan_interval_s}s",
            f"--scale-down-unneeded-time={self.scale_down_unneeded_s}s",
            f"--scale-down-delay-after-add={self.scale_down_delay_after_add_s}s",
            "--scale-down-delay-after-delete=0s",
            f"--scale-down-delay-after-failure={self.scale_down_delay_after_add_s}s",
            f"--unremovable-node-recheck-timeout={self.unremovable_recheck_s}s",
            f"--max-node-provision-time={self.max_node_provision_s}s",
            f"--max-graceful-termination-sec={self.max_graceful_termination_s}",
            f"--v={self.verbosity}",
        ]


class ClusterAutoscaler:
    """One cluster-autoscaler process: ``start``, ``stop`` (SIGTERM, then SIGKILL)."""

    def __init__(
        self,
        *,
        binary: Path,
        kubeconfig: Path,
        provider_address: str,
        work_dir: Path,
        settings: AutoscalerSettings | None = None,
    ) -> None:
        self.binary = binary
        self.settings = settings or AutoscalerSettings()
        self.log_file = work_dir / "cluster-autoscaler.log"
        self._work_dir = work_dir
        self._kubeconfig = kubeconfig
        self._provider_address = provider_address
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def argv(self) -> list[str]:
        cloud_config = self._work_dir / "cloud-config.yaml"
        cloud_config.write_text(f'address: "{self._provider_address}"\n', encoding="utf-8")
        return [
            str(self.binary),
            "--cloud-provider=externalgrpc",
            f"--cloud-config={cloud_config}",
            f"--kubeconfig={self._kubeconfig}",
            "--leader-elect=false",
            "--logtostderr",
            f"--address=127.0.0.1:{free_port()}",
            *self.settings.args(),
        ]

    def start(self) -> ClusterAutoscaler:
        if self.running():
            raise RuntimeError("cluster-autoscaler is already running")
        self._work_dir.mkdir(parents=True, exist_ok=True)
        self._log = self.log_file.open("ab")
        self._process = subprocess.Popen(
            self.argv(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                process.wait()
        self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_lines(self, *needles: str) -> list[str]:
        """Its log lines holding every one of ``needles``."""
        try:
            text = self.log_file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if all(n in line for n in needles)]
