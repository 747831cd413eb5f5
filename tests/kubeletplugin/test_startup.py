"""What the plugin does on its Node before serving: the common CDI edits (a Warning event when
``auto`` finds no NVIDIA Container Toolkit) and ``--mig-mode when-idle`` (each step an event)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driver.cdi_common import CommonEdits, CommonEditsChoice, resolve_common_edits
from driver.cluster.events import EventRecorder
from driver.cluster.port import EVENTS, JsonObject
from driver.errors import ConfigError
from driver.gpu.emulated import EmulatedGpuBackend
from kubeletplugin.node.events import NodeEvents
from kubeletplugin.node.setup import REASON_CDI_COMMON_EDITS_MISSING, prepare_node
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
