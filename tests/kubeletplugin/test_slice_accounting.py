"""What the checkpoint keeps for attribution and chargeback: each claim's pods and the time its
slices were made, and the slice-seconds of released slices — through prepare, unprepare, a restart
on an older checkpoint version, and a reboot (docs/design.md D9)."""

from __future__ import annotations

import json
import time

from api.checkpoint import PodRef, SliceSeconds, data_checksum
from kubeletplugin.plugin import KubeletPlugin
from tests.kubeletplugin.harness import ClaimHandle, NodeHarness

POD_UID = "6f1b2c3d-0000-4000-8000-00000000a001"


def _prepared(node: NodeHarness, devices: list[str]) -> tuple[KubeletPlugin, ClaimHandle]:
    plugin = node.start_plugin()
    claim = node.claim(devices, namespace="team-a")
    node.reserve_for_pod(claim, pod="trainer-0", uid=POD_UID)
    answers = node.kubelet().prepare([claim])
    assert answers[claim.uid].error == ""
    return plugin, claim


def _lifetimes(plugin: KubeletPlugin, profile: str) -> float | None:
    return plugin.metrics.registry.get_sample_value(
        "instaslice_kubelet_plugin_slice_lifetime_seconds_count", {"profile": profile}
    )


def test_a_prepared_claim_records_its_pods_and_when_its_slices_were_made(
    node: NodeHarness,
) -> None:
    before = time.time()
    plugin, claim = _prepared(node, ["gpu-0-1g-5gb-0"])
    entry = plugin.store.load().claims[claim.uid]
    assert entry.pods == (PodRef(name="trainer-0", uid=POD_UID),)
    assert entry.prepared_at is not None
    assert before <= entry.prepared_at <= time.time()


def test_unprepare_counts_the_slices_seconds_and_observes_their_lifetimes(
    node: NodeHarness,
) -> None:
    plugin, claim = _prepared(node, ["gpu-0-1g-5gb-0", "gpu-1-1g-5gb-1"])
    an_hour_ago = time.time() - 3600
    plugin.store.update(
        lambda c: c.with_claim(c.claims[claim.uid].model_copy(update={"prepared_at": an_hour_ago}))
    )
    assert node.kubelet().unprepare([claim]) == {claim.uid: ""}
    checkpoint = plugin.store.load()
    assert checkpoint.claim(claim.uid) is None
    (released,) = checkpoint.released_slice_seconds
    assert (released.namespace, released.profile) == ("team-a", "1g.5gb")
    assert 2 * 3600 <= released.seconds < 2 * 3600 + 60
    assert _lifetimes(plugin, "1g.5gb") == 2
    bucket = plugin.metrics.registry.get_sample_value(
        "instaslice_kubelet_plugin_slice_lifetime_seconds_bucket",
        {"profile": "1g.5gb", "le": "7200.0"},
    )
    assert bucket == 2


def _as_version_1(node: NodeHarness) -> None:
    """Rewrite the plugin's checkpoint as a version-1 build wrote it."""
    path = node.state_dir / "checkpoint.json"
    data = json.loads(path.read_bytes())["data"]
    data.pop("released_slice_seconds")
    for claim in data["claims"].values():
        del claim["pods"], claim["prepared_at"]
    envelope = {"version": 1, "checksum": data_checksum(data), "data": data}
    path.write_text(json.dumps(envelope))


def test_a_restart_on_a_version_1_checkpoint_fills_in_the_pods_and_the_start_time(
    node: NodeHarness,
) -> None:
    plugin, claim = _prepared(node, ["gpu-0-2g-10gb-0"])
    node.stop_plugin(plugin)
    _as_version_1(node)
    started = time.time()
    plugin = node.start_plugin()
    assert node.last_report.kept == [claim.uid]
    entry = plugin.store.load().claims[claim.uid]
    assert entry.pods == (PodRef(name="trainer-0", uid=POD_UID),)
    assert entry.prepared_at is not None
    assert started <= entry.prepared_at <= time.time()
    on_disk = json.loads((node.state_dir / "checkpoint.json").read_bytes())
    assert on_disk["version"] == 2


def test_a_reboot_counts_the_seconds_of_the_slices_it_ended(node: NodeHarness) -> None:
    plugin, _ = _prepared(node, ["gpu-0-3g-20gb-4"])
    node.stop_plugin(plugin)
    gpus = node.backend()
    gpus.reset_gpu(gpu_index=0)  # the reboot ended every MIG instance
    gpus.close()
    plugin = node.start_plugin(boot_id="boot-2")
    assert node.last_report.rebooted
    checkpoint = plugin.store.load()
    assert checkpoint.claims == {}
    (released,) = checkpoint.released_slice_seconds
    assert released == SliceSeconds(namespace="team-a", profile="3g.20gb", seconds=released.seconds)
    assert 0 <= released.seconds < 60
    assert _lifetimes(plugin, "3g.20gb") == 1


def test_released_seconds_outlive_a_restart(node: NodeHarness) -> None:
    plugin, claim = _prepared(node, ["gpu-1-1g-5gb-6"])
    assert node.kubelet().unprepare([claim]) == {claim.uid: ""}
    released = plugin.store.load().released_slice_seconds
    node.stop_plugin(plugin)
    plugin = node.start_plugin()
    assert plugin.store.load().released_slice_seconds == released != ()
