"""The console script end to end: a real process, found and driven by the kubelet, stopped by SIGTERM;
``--version``; and a configuration that can never work refused at start in one line (exit status 2),
never retried."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localcluster.apiserver import LocalApiServer
from tests.daemon.flagchecks import assert_refused_in_one_line, assert_version, run_module
from tests.kubeletplugin.harness import Kubelet, NodeHarness


def test_plugin_process_serves_until_sigterm_then_removes_its_sockets(
    apiserver: LocalApiServer,
) -> None:
    node = NodeHarness(api_url=apiserver.url, node="node-m", gpus="1xA100-40GB")
    node.create_node()
    env = {
        **os.environ,
        "NODE_NAME": node.node,
        "INSTASLICE_GPU_BACKEND": "emulated",
        "INSTASLICE_EMULATED_GPUS": node.gpus,
        "INSTASLICE_LOG_FORMAT": "json",
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kubeletplugin",
            "--kube-api-url",
            apiserver.url,
            "--plugin-registry-dir",
            str(node.registry_dir),
            "--plugin-dir",
            str(node.plugin_dir),
            "--cdi-root",
            str(node.cdi_root),
            "--state-dir",
            str(node.state_dir),
            "--emulated-state-file",
            str(node.emulated_state),
            "--metrics-address",
            "",
            "--healthz-address",
            "127.0.0.1:0",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    kubelet = None
    try:
        deadline = time.monotonic() + 30
        while not list(node.registry_dir.glob("*-reg.sock")) and time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()
            time.sleep(0.05)
        kubelet = Kubelet(node.registry_dir)
        claim = node.claim(["gpu-0-3g-20gb-4"])
        assert kubelet.prepare([claim])[claim.uid].error == ""
        assert [(g, p, s) for g, p, s, _ in node.instances()] == [(0, "3g.20gb", 4)]
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 0, stderr
        assert '"claim_uid": "' + claim.uid in stderr  # structured JSON logs carry the claim
        assert list(node.registry_dir.glob("*.sock")) == []
        assert list(node.plugin_dir.glob("*.sock")) == []
        assert len(node.instances()) == 1  # a stop keeps prepared slices
    finally:
        if kubelet is not None:
            kubelet.close()
        if process.poll() is None:
            process.kill()
            process.communicate()
        node.close()


def test_version_prints_the_name_and_the_package_version() -> None:
    assert_version(run_module("kubeletplugin", "--version"), prog="instaslice-kubelet-plugin")


def _emulated(tmp_path: Path, *argv: str) -> list[str]:
    """Flags of an emulated node whose directories are under ``tmp_path``; no API server is
    asked anything before the refusals under test."""
    return [
        "--node-name", "node-r", "--gpu-backend", "emulated", "--emulated-gpus", "1xA100-40GB",
        "--kube-api-url", "http://127.0.0.1:1", "--metrics-address", "", "--healthz-address", "",
        "--plugin-registry-dir", str(tmp_path / "registry"),
        "--plugin-dir", str(tmp_path / "plugin"), "--cdi-root", str(tmp_path / "cdi"),
        "--state-dir", str(tmp_path / "state"), *argv,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--bogus"], "unrecognized arguments: --bogus; see --help"),
        (
            ["--emulated-gpus", "2xFOO"],
            "--emulated-gpus: emulated GPU spec part '2xFOO': unknown GPU model 'FOO'",
        ),
        (["--emulated-gpus", "0xA100-40GB"], "--emulated-gpus: emulated GPU spec part"),
        (["--emulated-state-file", "{tmp}/gpus.bin"], "corrupt state file {tmp}/gpus.bin: not"),
        (["--emulated-state-file", "{tmp}"], "--emulated-state-file {tmp} is not a regular file"),
        (["--state-dir", "{tmp}/gpus.bin/state"], "--state-dir {tmp}/gpus.bin/state: Not a dir"),
        (["--cdi-root", "{tmp}/gpus.bin"], "--cdi-root {tmp}/gpus.bin is not a directory"),
        (
            ["--kube-api-url", "", "--kubeconfig", "{tmp}/kubeconfig"],
            "--kubeconfig {tmp}/kubeconfig: no such file",
        ),
    ],
    ids=["unknown-flag", "unknown-gpu-model", "no-gpus", "binary-state-file",
         "state-file-is-a-directory", "state-dir-under-a-file", "cdi-root-is-a-file",
         "no-kubeconfig"],
)  # fmt: skip
def test_a_configuration_that_can_never_work_is_refused_in_one_line(
    tmp_path: Path, argv: list[str], line: str
) -> None:
    (tmp_path / "gpus.bin").write_bytes(b"\x93\xff\x00 garbage")
    flags = [arg.format(tmp=tmp_path) for arg in argv]
    started = time.monotonic()
    done = run_module("kubeletplugin", *_emulated(tmp_path, *flags))
    assert_refused_in_one_line(
        done, prog="instaslice-kubelet-plugin", line=line.format(tmp=tmp_path)
    )
    assert time.monotonic() - started < 30, "refused at start, not retried"
