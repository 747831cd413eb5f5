"""``deploy/rollout.sh`` (what ``make deploy`` waits with), against a stand-in ``kubectl`` that answers
each query from a table: it fails at once, saying why, for pods of the deployed images that cannot
start and for the plugin's Node warnings since its pod started; it ignores what an earlier rollout
left behind; it succeeds when both workloads are rolled out."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy import manifests as m

CONTROLLER = "reg.example/instaslice-controller:v2"
PLUGIN = "reg.example/instaslice-kubelet-plugin:v2"

FAKE_KUBECTL = """\
import json, sys
rules = json.load(open(sys.argv[1]))
argv = " ".join(sys.argv[2:])
for rule in rules:
    if all(part in argv for part in rule["when"]):
        sys.stdout.write(rule.get("out", ""))
        sys.exit(rule.get("rc", 0))
sys.exit(0)
"""


def _run(
    tmp_path: Path, rules: list[dict[str, object]], *, timeout: int = 20
) -> subprocess.CompletedProcess[str]:
    if shutil.which("sh") is None:
        pytest.skip("sh is not installed")
    table = tmp_path / "rules.json"
    table.write_text(json.dumps(rules), encoding="utf-8")
    fake = tmp_path / "fake_kubectl.py"
    fake.write_text(FAKE_KUBECTL, encoding="utf-8")
    base = [
        {"when": ["get deployment/instaslice-controller -o jsonpath"], "out": CONTROLLER},
        {"when": ["get daemonset/instaslice-kubelet-plugin -o jsonpath"], "out": PLUGIN},
    ]
    table.write_text(json.dumps(base + rules), encoding="utf-8")
    return subprocess.run(
        ["sh", str(m.DEPLOY / "rollout.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "KUBECTL": f"{sys.executable} {fake} {table}",
            "TIMEOUT": str(timeout),
        },
    )


NOT_ROLLED_OUT = [{"when": ["rollout status", "--timeout=1s"], "rc": 1}]


def _containers(*rows: tuple[str, str, str, str]) -> dict[str, object]:
    return {
        "when": ["get pods -l app.kubernetes.io/name=instaslice"],
        "out": "".join("\t".join(row) + "\n" for row in rows),
    }


def test_rolled_out_workloads_end_the_wait_with_success(tmp_path: Path) -> None:
    done = _run(tmp_path, [{"when": ["rollout status"], "out": "successfully rolled out\n"}])
    assert done.returncode == 0, done.stderr


def test_an_image_that_cannot_be_pulled_fails_at_once_naming_it(tmp_path: Path) -> None:
    done = _run(
        tmp_path,
        [
            *NOT_ROLLED_OUT,
            _containers(
                ("controller", CONTROLLER, "ErrImagePull", "pull access denied"),
                ("kubelet-plugin", "docker.io/library/busybox:1.36", "", ""),
            ),
        ],
        timeout=200,
    )
    assert done.returncode == 1
    assert f"rollout: container controller ({CONTROLLER}): ErrImagePull: pull access denied" in (
        done.stderr
    )
    assert "not rolled out after" not in done.stderr  # it did not wait for the timeout


def test_what_an_earlier_rollout_left_behind_is_not_this_rollouts_failure(tmp_path: Path) -> None:
    done = _run(
        tmp_path,
        [
            *NOT_ROLLED_OUT,
            _containers(
                ("controller", "reg.example/instaslice-controller:v1", "ImagePullBackOff", "")
            ),
        ],
        timeout=1,
    )
    assert done.returncode == 1
    assert "not rolled out after 1s" in done.stderr
    assert "ImagePullBackOff" not in done.stderr


def _plugin_state(started: str, warned: str, *, ready: str = "false") -> list[dict[str, object]]:
    return [
        {
            "when": ["get pods -l app.kubernetes.io/component=kubelet-plugin"],
            "out": f"pod\tnode-a\t{started}\t{ready}\t{PLUGIN}\n",
        },
        {
            "when": ["get events -A", "source=instaslice-kubelet-plugin"],
            "out": f"event\tnode-a\t{warned}\tGpuBackendUnavailable\tcannot start the nvml GPU backend\n",
        },
    ]


def test_a_plugin_warning_on_its_node_since_it_started_fails_the_rollout_with_it(
    tmp_path: Path,
) -> None:
    done = _run(
        tmp_path,
        [*NOT_ROLLED_OUT, *_plugin_state("2026-01-01T10:00:00Z", "2026-01-01T10:00:05Z")],
        timeout=200,
    )
    assert done.returncode == 1
    assert "rollout: node node-a: GpuBackendUnavailable: cannot start the nvml GPU backend" in (
        done.stderr
    )


@pytest.mark.parametrize(
    ("warned", "ready"),
    [("2026-01-01T09:59:00Z", "false"), ("2026-01-01T10:00:05Z", "true")],
    ids=["warning-before-the-pod-started", "plugin-ready"],
)
def test_an_older_warning_or_a_ready_plugin_is_no_failure(
    tmp_path: Path, warned: str, ready: str
) -> None:
    done = _run(
        tmp_path,
        [*NOT_ROLLED_OUT, *_plugin_state("2026-01-01T10:00:00Z", warned, ready=ready)],
        timeout=1,
    )
    assert "not rolled out after 1s" in done.stderr
    assert "GpuBackendUnavailable" not in done.stderr
