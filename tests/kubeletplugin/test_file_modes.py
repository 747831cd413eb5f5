"""Every file and directory the plugin creates has the least mode that still works, whatever the
process umask: sockets and the checkpoint (which lists the node's claims) owner-only; CDI specs
readable by the container runtime and tools, writable by no one else; nothing group- or
world-writable."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeletplugin.health.settings import XidPolicy
from tests.kubeletplugin.harness import NodeHarness

EXPECTED = {
    "plug": 0o750,
    "plug/dra.sock": 0o600,
    "state": 0o700,
    "state/checkpoint.json": 0o600,
    "cdi": 0o755,
}


@pytest.fixture
def node(node: NodeHarness) -> NodeHarness:
    """The node, its plugin without an XID watch: it restarts at once (these tests restart it
    often and inject no XID)."""
    node.xid_policy = XidPolicy(ignore_all=True)
    return node


@pytest.fixture(params=[0o000, 0o022], ids=["umask-000", "umask-022"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_what_the_plugin_creates_has_least_privilege_modes(node: NodeHarness, umask: int) -> None:
    plugin = node.start_plugin()
    claim = node.claim(["gpu-0-1g-5gb-0"])
    assert node.kubelet().prepare([claim])[claim.uid].error == ""
    for relative, mode in EXPECTED.items():
        assert _mode(node.root / relative) == mode, relative
    registration = plugin.registration_socket
    assert _mode(registration) == 0o600
    specs = node.cdi_files()
    assert specs
    for spec in specs:
        assert _mode(spec) == 0o644, spec.name
    created = [node.registry_dir, node.plugin_dir, node.state_dir, node.cdi_root]
    for top in created:
        for path in [top, *top.rglob("*")]:
            assert not _mode(path) & 0o022, f"{path} is group- or world-writable"
            if stat.S_ISSOCK(path.lstat().st_mode) or path.name.startswith("checkpoint"):
                assert not _mode(path) & 0o077, f"{path} is open to others"


def test_a_checkpoint_set_aside_as_corrupt_stays_owner_only(node: NodeHarness, umask: int) -> None:
    plugin = node.start_plugin()
    claim = node.claim(["gpu-0-1g-5gb-0"])
    assert node.kubelet().prepare([claim])[claim.uid].error == ""
    node.stop_plugin(plugin)
    (node.state_dir / "checkpoint.json").write_bytes(b"{broken")
    node.start_plugin()
    assert node.last_report.corrupt_checkpoint
    assert _mode(node.state_dir / "checkpoint.json") == 0o600
    assert not _mode(node.state_dir / "checkpoint.json.corrupt") & 0o077
