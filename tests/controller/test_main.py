"""``instaslice-controller`` as a process: flags and env (every number bounded, every refusal one
line with exit status 2, ``--version``), and the whole daemon against the local API server — its
webhook (self-managed certificate, caBundle patched) gates a pod at creation, the allocator places
it, /readyz and /metrics answer, SIGTERM stops it cleanly."""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from api.names import SCHEDULING_GATE
from controller.settings import build_parser, parse_settings
from controller.webhook.certificates import CertMode
from driver.cluster.port import LEASES, PODS, RESOURCE_CLAIMS, gate_names
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
    ungated,
    wait_for,
)
from tests.daemon.flagchecks import (
    NumericFlag,
    assert_bounded,
    assert_refused_in_one_line,
    assert_version,
    run_module,
)


def test_help_lists_every_flag() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "controller", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    for flag in ("--kubeconfig", "--policy", "--webhook-port", "--cert-mode", "--no-leader-elect",
                 "--lease-duration", "--workers", "--metrics-address", "--healthz-address",
                 "--log-format"):  # fmt: skip
        assert flag in result.stdout


def test_settings_come_from_env_and_flags_win() -> None:
    env = {
        "INSTASLICE_LEADER_ELECT": "false",
        "INSTASLICE_WORKERS": "4",
        "INSTASLICE_LOG_LEVEL": "info",
        "INSTASLICE_CERT_MODE": "cert-manager",
        "INSTASLICE_POLICY": "bestfit",
    }
    settings = parse_settings(["--workers", "7"], environ=env)
    assert settings.leader_elect is False
    assert settings.workers == 7
    assert settings.daemon.log_level == "INFO"
    assert settings.cert_mode is CertMode.CERT_MANAGER
    assert settings.policy == "bestfit"
    defaults = parse_settings([], environ={})
    assert defaults.namespace == "instaslice-system"
    assert defaults.leader_elect is True
    assert (
        defaults.webhook_port,
        defaults.daemon.metrics_address,
        defaults.daemon.healthz_address,
    ) == (9443, ":8080", ":8081")
    assert build_parser().prog == "instaslice-controller"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--policy", "worstfit"], {}, "argument --policy: invalid choice: 'worstfit'"),
        ([], {"INSTASLICE_POLICY": "worstfit"}, "INSTASLICE_POLICY: 'worstfit' is not one of"),
        ([], {"INSTASLICE_LEADER_ELECT": "maybe"}, "INSTASLICE_LEADER_ELECT: 'maybe' is not true"),
        ([], {"INSTASLICE_PREEMPTION": "maybe"}, "INSTASLICE_PREEMPTION: 'maybe' is not one of"),
        (
            ["--lease-duration", "5", "--renew-deadline", "6"],
            {},
            "need --retry-period < --renew-deadline < --lease-duration, got 2, 6, 5",
        ),
        (["--metrics-address", "nonsense"], {}, "--metrics-address: address nonsense must look"),
        (["--namespace", "Instaslice"], {}, "--namespace: Instaslice is not a Kubernetes name"),
        (["--webhook-service", "a.b"], {}, "--webhook-service: a.b is not a Kubernetes name"),
        (["--webhook-config-name", "Gate"], {}, "--webhook-config-name: Gate is not"),
        (["--kube-api-url", "localhost"], {}, "--kube-api-url: API server URL 'localhost'"),
    ],
    ids=["bad-policy", "bad-policy-env", "bad-bool-env", "bad-preemption-env",
         "renew-after-lease", "bad-address", "bad-namespace", "bad-service", "bad-config-name",
         "bad-api-url"],
)  # fmt: skip
def test_bad_settings_exit_with_status_2_and_one_line(
    argv: list[str], env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as raised:
        parse_settings(argv, environ=env)
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("instaslice-controller: error: ")
    assert err.count("\n") == 1
    assert message in err


NUMERIC_FLAGS = [
    NumericFlag("--webhook-port", "0", "65535", "-1", "65536"),
    NumericFlag("--lease-duration", "1", "3600", "0", "3601"),
    NumericFlag("--renew-deadline", "0.1", "3600", "0.09", "3600.5"),
    NumericFlag("--retry-period", "0.1", "3600", "0", "1e9"),
    NumericFlag("--workers", "1", "256", "0", "1000000000"),
    NumericFlag("--kube-api-qps", "0", "100000", "-0.5", "inf"),
    NumericFlag("--kube-api-burst", "1", "100000", "0", "100001"),
    NumericFlag("--handoff-after", "0", "86400", "-1", "86401"),
    NumericFlag("--starvation-after", "0", "86400", "nan", "1e13"),
]


@pytest.mark.parametrize("numeric", NUMERIC_FLAGS, ids=[f.flag for f in NUMERIC_FLAGS])
def test_every_numeric_flag_is_bounded(
    numeric: NumericFlag, capsys: pytest.CaptureFixture[str]
) -> None:
    parse = functools.partial(parse_settings, environ={})
    assert_bounded(build_parser(), parse, numeric, capsys=capsys)


def test_version_prints_the_name_and_the_package_version() -> None:
    assert_version(run_module("controller", "--version"), prog="instaslice-controller")


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--bogus"], "unrecognized arguments: --bogus; see --help"),
        (
            ["--workers", "1000000000"],
            "argument --workers: must be between 1 and 256 (got 1000000000); see --help",
        ),
        (["--kubeconfig", "/nonexistent/kubeconfig"], "--kubeconfig /nonexistent/kubeconfig: no "),
        (
            ["--kube-api-url", "http://127.0.0.1:1", "--webhook-cert-dir", "/dev/null/certs"],
            "--webhook-cert-dir /dev/null/certs: Not a directory",
        ),
    ],
    ids=["unknown-flag", "a-billion-workers", "no-kubeconfig", "cert-dir-under-a-file"],
)
def test_the_process_refuses_in_one_line_with_status_2(argv: list[str], line: str) -> None:
    done = run_module("controller", *argv)
    assert_refused_in_one_line(done, prog="instaslice-controller", line=line)


def test_the_daemon_gates_places_serves_probes_and_stops_on_sigterm(
    gated_server: LocalApiServer, webhook_port: int, tmp_path: Path
) -> None:
    with client(gated_server) as api:
        create_device_classes(api)
        publish_node(api, "node-a", gpus=1)
        api.create(WEBHOOK_CONFIGURATIONS, webhook_configuration(failure_policy="Ignore"))
        metrics, health = free_port(), free_port()
        process = subprocess.Popen(
            controller_command(
                gated_server.url,
                webhook_port=webhook_port,
                cert_dir=tmp_path / "certs",
                healthz_port=health,
                extra=["--identity", "daemon-under-test", "--lease-duration", "3",
                       "--renew-deadline", "2", "--retry-period", "0.5",
                       "--metrics-address", f"127.0.0.1:{metrics}", "--log-format", "json"],
            ),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            wait_for(
                lambda: http_get(f"http://127.0.0.1:{health}/readyz")[0] == 200,
                timeout=30,
                what="/readyz",
            )
            assert http_get(f"http://127.0.0.1:{health}/healthz")[0] == 200
            configuration = api.get(WEBHOOK_CONFIGURATIONS, name="instaslice-pod-gate")
            assert configuration["webhooks"][0]["clientConfig"]["caBundle"]

            api.create(RESOURCE_CLAIMS, claim_object("c"), namespace=NS)
            created = api.create(PODS, pod_object("p", claims=["c"], gates=()), namespace=NS)
            assert gate_names(created) == [SCHEDULING_GATE]  # added by our webhook
            wait_for(lambda: ungated(api, "p"), timeout=20, what="the pod placed")
            claim = api.get(RESOURCE_CLAIMS, name="c", namespace=NS)
            assert claim["status"]["allocation"]["devices"]["results"][0]["pool"] == "node-a"

            def scraped() -> str:
                text = http_get(f"http://127.0.0.1:{metrics}/metrics")[1]
                return text if "instaslice_controller_pods_ungated_total 1.0" in text else ""

            body = wait_for(scraped, what="the ungate counted once")
            assert "instaslice_controller_leader 1.0" in body
            assert 'instaslice_controller_free_placements{profile="1g.5gb"} 6.0' in body
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                code = process.wait(timeout=20)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
                stderr = process.stderr.read() if process.stderr else ""
                if process.stderr:
                    process.stderr.close()
        assert code == 0, stderr[-2000:]
        lease = api.get(LEASES, name="instaslice-controller", namespace=NS)
        assert lease["spec"]["holderIdentity"] == ""  # handed back on SIGTERM
