"""What the plugin does on its Node before serving: the paths its flags name checked (a directory it
cannot write is refused at start), the common CDI edits (a Warning event when ``auto`` finds no
NVIDIA Container Toolkit) and ``--mig-mode when-idle`` (each step an event)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from driver.cdi_common import CommonEdits, CommonEditsChoice, resolve_common_edits
from driver.cluster.events import EventRecorder
from driver.cluster.port import EVENTS, JsonObject
from driver.errors import ConfigError
from driver.gpu.emulated import EmulatedGpuBackend
from kubeletplugin.node.events import NodeEvents
from kubeletplugin.node.setup import (
    REASON_CDI_COMMON_EDITS_MISSING,
    check_paths,
    prepare_node,
)
from kubeletplugin.settings import Settings, parse_settings
from tests.kubeletplugin.harness import NodeHarness
from tests.unit.test_cdi_common import FILE_SPEC


def _settings(*flags: str) -> Settings:
    return parse_settings(["--node-name", "node-a", *flags], environ={})


def _events(node: NodeHarness) -> list[JsonObject]:
    return [
        e
        for e in node.api.list_objects(EVENTS, namespace="default").items
        if e["involvedObject"]["kind"] == "Node" and e["involvedObject"]["name"] == node.node
    ]


def _node_events(node: NodeHarness) -> NodeEvents:
    recorder = EventRecorder(api=node.api, component="instaslice-kubelet-plugin", host=node.node)
    return NodeEvents(api=node.api, events=recorder, node_name=node.node)


def _no_toolkit(tmp_path: Path) -> CommonEdits:
    return resolve_common_edits(
        CommonEditsChoice(mode="auto"),
        emulated=False,
        toolkit_spec_dirs=[tmp_path],
        find_nvidia_ctk=lambda _: None,
    )


PATH_FLAGS = ("--state-dir", "--cdi-root", "--plugin-dir", "--plugin-registry-dir")


def _paths(tmp_path: Path, **changed: Path) -> Settings:
    paths = {flag: changed.get(flag, tmp_path / flag.strip("-")) for flag in PATH_FLAGS}
    return _settings(
        *(part for flag, path in paths.items() for part in (flag, str(path))),
        "--gpu-backend", "emulated", "--emulated-gpus", "A100-40GB",
    )  # fmt: skip


def test_directories_that_can_be_made_pass_and_none_is_made(tmp_path: Path) -> None:
    check_paths(_paths(tmp_path))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag", PATH_FLAGS)
def test_a_directory_the_plugin_cannot_make_is_refused_naming_its_flag(
    tmp_path: Path, flag: str
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=re.escape(f"{flag} {blocker}/dir: ")):
        check_paths(_paths(tmp_path, **{flag: blocker / "dir"}))


def test_an_emulated_state_file_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    settings = _settings("--gpu-backend", "emulated", "--emulated-gpus", "A100-40GB",
                         "--state-dir", str(tmp_path), "--cdi-root", str(tmp_path),
                         "--plugin-dir", str(tmp_path), "--plugin-registry-dir", str(tmp_path),
                         "--emulated-state-file", str(tmp_path))  # fmt: skip
    with pytest.raises(ConfigError, match=r"--emulated-state-file .* is not a regular file"):
        check_paths(settings)


def test_auto_without_toolkit_warns_on_the_node(node: NodeHarness, tmp_path: Path) -> None:
    backend = EmulatedGpuBackend(node_name=node.node, spec="1xA100-40GB")
    common = prepare_node(
        _settings(),
        backend=backend,
        node_events=_node_events(node),
        resolve=lambda _: _no_toolkit(tmp_path),
    )
    assert common.edits is None
    (event,) = _events(node)
    assert (event["type"], event["reason"]) == ("Warning", REASON_CDI_COMMON_EDITS_MISSING)
    assert "/dev/nvidiactl" in event["message"]


def test_common_edits_from_a_file_post_nothing(node: NodeHarness, tmp_path: Path) -> None:
    spec = tmp_path / "driver.json"
    spec.write_text(json.dumps(FILE_SPEC))
    settings = _settings(
        "--gpu-backend",
        "emulated",
        "--emulated-gpus",
        "A100-40GB",
        "--cdi-common-edits",
        f"file:{spec}",
    )
    backend = EmulatedGpuBackend(node_name=node.node, spec="1xA100-40GB")
    common = prepare_node(settings, backend=backend, node_events=_node_events(node))
    assert common.mode == "file"
    assert _events(node) == []


def test_an_unusable_explicit_source_stops_the_start(node: NodeHarness, tmp_path: Path) -> None:
    settings = _settings("--cdi-common-edits", f"file:{tmp_path / 'missing.json'}")
    backend = EmulatedGpuBackend(node_name=node.node, spec="1xA100-40GB")
    with pytest.raises(ConfigError, match=r"missing\.json"):
        prepare_node(settings, backend=backend, node_events=_node_events(node))


@pytest.mark.parametrize(("mig_mode", "enabled"), [("never", False), ("when-idle", True)])
def test_mig_mode_flag_decides_whether_mig_is_enabled(
    node: NodeHarness, tmp_path: Path, mig_mode: str, enabled: bool
) -> None:
    backend = EmulatedGpuBackend(node_name=node.node, spec="2xA100-40GB", mig_disabled=[1])
    prepare_node(
        _settings(
            "--gpu-backend", "emulated", "--emulated-gpus", "2xA100-40GB", "--mig-mode", mig_mode
        ),
        backend=backend,
        node_events=_node_events(node),
    )
    assert backend.gpus()[1].mig_enabled is enabled
    reasons = sorted((e["type"], e["reason"]) for e in _events(node))
    if enabled:
        assert reasons == [
            ("Normal", "MigModeEnabled"),
            ("Normal", "MigModeEnabling"),
            ("Normal", "MigModeGpuReset"),
        ]
    else:
        assert reasons == []
