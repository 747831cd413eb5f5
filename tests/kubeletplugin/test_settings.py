"""Flags and their env vars; bad values are CLI errors (exit status 2), each number bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver.cdi_common import CommonEditsChoice
from driver.daemon.flags import env_var
from kubeletplugin.settings import build_parser, parse_settings
from tests.daemon.flagchecks import NumericFlag, assert_bounded


def test_defaults_match_the_kubelet_layout() -> None:
    settings = parse_settings(["--node-name", "n1"], environ={})
    assert settings.node_name == "n1"
    assert settings.gpu_backend == "nvml"
    assert settings.plugin_registry_dir == Path("/var/lib/kubelet/plugins_registry")
    assert settings.plugin_dir == Path("/var/lib/kubelet/plugins/mig.instaslice.dev")
    assert settings.device_plugin_dir == Path("/var/lib/kubelet/device-plugins")
    assert settings.pod_resources_socket == Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    assert settings.cdi_root == Path("/var/run/cdi")
    assert settings.emulated_state_file == Path("/var/lib/instaslice/emulated-gpus.json")
    assert settings.daemon.metrics_address == ":9400"
    assert settings.daemon.healthz_address == ":9401"
    assert settings.daemon.kubeconfig is None
    assert settings.inventory_poll_seconds == 30.0


def test_every_flag_has_its_env_var_and_the_command_line_wins() -> None:
    environ = {
        "INSTASLICE_NODE_NAME": "from-env",
        "INSTASLICE_GPU_BACKEND": "emulated",
        "INSTASLICE_EMULATED_GPUS": "2xA100-40GB",
        "INSTASLICE_STATE_DIR": "/srv/state",
        "INSTASLICE_LOG_LEVEL": "debug",
        "INSTASLICE_LOG_FORMAT": "json",
        "INSTASLICE_KUBE_API_URL": "http://127.0.0.1:8080",
        "INSTASLICE_INVENTORY_POLL_SECONDS": "5",
        "INSTASLICE_KUBE_API_QPS": "0",
    }
    settings = parse_settings(["--node-name", "from-flag"], environ=environ)
    assert settings.node_name == "from-flag"
    assert settings.gpu_backend == "emulated"
    assert settings.emulated_gpus == "2xA100-40GB"
    assert settings.emulated_state_file == Path("/srv/state/emulated-gpus.json")
    assert settings.daemon.log_level == "DEBUG"
    assert settings.daemon.log_format == "json"
    assert settings.daemon.kube_api_url == "http://127.0.0.1:8080"
    assert settings.inventory_poll_seconds == 5.0
    assert settings.daemon.kube_api_qps == 0.0
    assert settings.daemon.kube_api_burst == 100
    flags = [
        a for a in build_parser()._actions if a.option_strings and a.dest not in ("help", "version")
    ]
    assert all(env_var(a.dest) in (a.help or "") for a in flags)


def test_node_name_falls_back_to_node_name_env() -> None:
    assert parse_settings([], environ={"NODE_NAME": "downward"}).node_name == "downward"


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        ([], {}, "--node-name is required"),
        (["--node-name", "n", "--gpu-backend", "cuda"], {}, "invalid choice"),
        (["--node-name", "n"], {"INSTASLICE_GPU_BACKEND": "cuda"}, "INSTASLICE_GPU_BACKEND"),
        (["--node-name", "n", "--gpu-backend", "emulated"], {}, "needs --emulated-gpus"),
        (["--node-name", "n", "--metrics-address", "9400"], {}, "host:port"),
        (["--node-name", "n", "--inventory-poll-seconds", "0"], {}, "between 0.1 and 3600"),
        (["--node-name", "n", "--log-level", "loud"], {}, "invalid choice"),
        (["--node-name", "n"], {"INSTASLICE_LOG_FORMAT": "xml"}, "INSTASLICE_LOG_FORMAT"),
        (["--node-name", "n", "--kube-api-burst", "0"], {}, "between 1 and 100000"),
        (["--node-name", "Node_1"], {}, "--node-name: Node_1 is not a Kubernetes name"),
        (
            ["--node-name", "n", "--gpu-backend", "emulated", "--emulated-gpus", "2xFOO"],
            {},
            "--emulated-gpus: emulated GPU spec part '2xFOO': unknown GPU model 'FOO'",
        ),
        (
            ["--node-name", "n"],
            {"INSTASLICE_GPU_BACKEND": "emulated", "INSTASLICE_EMULATED_GPUS": "0xA100-40GB"},
            "asks for 0 GPUs",
        ),
        (["--node-name", "n", "--kube-api-url", "localhost:8080"], {}, "--kube-api-url: API"),
    ],
    ids=[
        "no-node",
        "bad-backend-flag",
        "bad-backend-env",
        "emulated-without-gpus",
        "bad-address",
        "zero-poll",
        "bad-level",
        "bad-format-env",
        "zero-burst",
        "bad-node-name",
        "unknown-emulated-gpu",
        "no-emulated-gpus-env",
        "bad-api-url",
    ],
)
def test_bad_values_exit_2_with_a_message(
    argv: list[str], environ: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(argv, environ=environ)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


NUMERIC_FLAGS = [
    NumericFlag("--inventory-poll-seconds", "0.1", "3600", "0.05", "3601"),
    NumericFlag("--kube-api-qps", "0", "100000", "-1", "1e400"),
    NumericFlag("--kube-api-burst", "1", "100000", "0", "9" * 400),
]
"""The XIDs and the emulated GPUs' count have tests of their own."""


@pytest.mark.parametrize("numeric", NUMERIC_FLAGS, ids=[f.flag for f in NUMERIC_FLAGS])
def test_every_numeric_flag_is_bounded(
    numeric: NumericFlag, capsys: pytest.CaptureFixture[str]
) -> None:
    def parse(argv: list[str]) -> object:
        return parse_settings(["--node-name", "n", *argv], environ={})

    assert_bounded(build_parser(), parse, numeric, capsys=capsys)


def test_classic_shim_is_on_with_the_nvidia_prefix_by_default() -> None:
    settings = parse_settings(["--node-name", "n1"], environ={})
    assert settings.classic_shim is True
    assert settings.classic_resource_prefix == "nvidia.com/mig-"


def test_classic_shim_can_be_turned_off_and_prefixed_from_env() -> None:
    environ = {
        "INSTASLICE_CLASSIC_SHIM": "off",
        "INSTASLICE_CLASSIC_RESOURCE_PREFIX": "example.com/slice-",
    }
    settings = parse_settings(["--node-name", "n1"], environ=environ)
    assert settings.classic_shim is False
    assert settings.classic_resource_prefix == "example.com/slice-"


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--classic-shim", "maybe"], "invalid choice"),
        (["--classic-resource-prefix", "mig-"], "is not '<domain>/<name-prefix>'"),
        (["--classic-resource-prefix", "Nvidia.com/mig-"], "is not '<domain>/<name-prefix>'"),
    ],
    ids=["bad-mode", "no-domain", "uppercase-domain"],
)
def test_bad_classic_shim_settings_are_cli_errors(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(["--node-name", "n1", *argv], environ={})
    assert exc.value.code == 2
    assert fragment in capsys.readouterr().err


# -- device health: taint effect and XIDs -----------------------------------------------------


def test_health_defaults_taint_no_schedule_and_ignore_the_application_error_xids() -> None:
    health = parse_settings(["--node-name", "n"], environ={}).health
    assert health.taint_effect == "NoSchedule"
    assert [x for x in (13, 31, 43, 45, 68, 109) if health.xids.is_critical(x)] == []
    assert all(health.xids.is_critical(x) for x in (48, 63, 64, 74, 79, 92, 94, 95))


@pytest.mark.parametrize(
    ("argv", "critical", "not_critical"),
    [
        (["--ignore-xids", "48, 94"], [79], [48, 94, 13]),
        (["--critical-xids", "43"], [43, 79], [13]),
        (["--ignore-xids", "all"], [], [48, 79]),
        (["--ignore-xids", "all", "--critical-xids", "79"], [79], [48, 13]),
        (["--ignore-xids", "79", "--critical-xids", "79"], [79], [13]),
    ],
    ids=["ignore-more", "make-critical", "ignore-all", "all-but-one", "critical-wins"],
)
def test_xid_flags(argv: list[str], critical: list[int], not_critical: list[int]) -> None:
    policy = parse_settings(["--node-name", "n", *argv], environ={}).health.xids
    assert [x for x in critical if policy.is_critical(x)] == critical
    assert [x for x in not_critical if policy.is_critical(x)] == []


def test_health_flags_come_from_the_environment_too() -> None:
    environ = {
        "INSTASLICE_UNHEALTHY_TAINT_EFFECT": "NoExecute",
        "INSTASLICE_IGNORE_XIDS": "48",
        "INSTASLICE_CRITICAL_XIDS": "13",
    }
    health = parse_settings(["--node-name", "n"], environ=environ).health
    assert health.taint_effect == "NoExecute"
    assert not health.xids.is_critical(48)
    assert health.xids.is_critical(13)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--unhealthy-taint-effect", "Evict"], "invalid choice"),
        (["--ignore-xids", "48,x"], "--ignore-xids: x is not an XID number"),
        (["--critical-xids", "all"], "--critical-xids: all is not an XID number"),
        (["--critical-xids", "-1"], "--critical-xids: -1 is not an XID number"),
        (["--ignore-xids", "0"], "--ignore-xids: XID 0 is not between 1 and 65535"),
        (["--ignore-xids", "9" * 5000], "XID '999999999999'... (5000 characters) is not between"),
    ],
    ids=["bad-effect", "bad-xid", "critical-all", "negative", "zero", "thousands-of-digits"],
)
def test_bad_health_flags_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(["--node-name", "n", *argv], environ={})
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_common_edits_and_mig_mode_default_to_auto_and_never() -> None:
    settings = parse_settings(["--node-name", "n"], environ={})
    assert settings.cdi_common_edits == CommonEditsChoice(mode="auto")
    assert settings.mig_mode == "never"


def test_common_edits_and_mig_mode_from_env_and_flags() -> None:
    environ = {
        "INSTASLICE_CDI_COMMON_EDITS": "file:/etc/cdi/nvidia.yaml",
        "INSTASLICE_MIG_MODE": "when-idle",
    }
    settings = parse_settings(["--node-name", "n"], environ=environ)
    assert settings.cdi_common_edits == CommonEditsChoice(
        mode="file", path=Path("/etc/cdi/nvidia.yaml")
    )
    assert settings.mig_mode == "when-idle"
    flagged = parse_settings(["--node-name", "n", "--cdi-common-edits", "none"], environ=environ)
    assert flagged.cdi_common_edits == CommonEditsChoice(mode="none")


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (["--cdi-common-edits", "legacy"], {}, "--cdi-common-edits 'legacy' is not one of"),
        (["--cdi-common-edits", "file:"], {}, "needs a path"),
        (["--mig-mode", "always"], {}, "invalid choice"),
        ([], {"INSTASLICE_MIG_MODE": "always"}, "INSTASLICE_MIG_MODE"),
    ],
    ids=["unknown-source", "file-without-path", "bad-mig-mode", "bad-mig-mode-env"],
)
def test_bad_common_edits_and_mig_mode_exit_2(
    argv: list[str], environ: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(["--node-name", "n", *argv], environ=environ)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
