"""Crashes at every step of prepare, then a new plugin on the same state: nothing leaked, nothing lost.

A crash is a ``Crash`` (a ``BaseException``) raised from the emulated backend's fault hook (inside
slice creation) or from the plugin's step hook (after the CDI spec, after the checkpoint): no
rollback code runs, so the files hold exactly what a killed process leaves. The crashed plugin is
then stopped (stopping never touches state) and a new one starts on the same directories, emulated
GPU state file and CDI directory, and recovers before serving.
"""

from __future__ import annotations

import json

import pytest

from api.checkpoint import PreparedClaim, PreparedDevice, PrepareState
from driver.checkpoint import CheckpointStore
from kubeletplugin.model import ClaimRef
from tests.kubeletplugin.harness import ClaimHandle, Crash, NodeHarness, crash_at


def _ref(claim: ClaimHandle) -> ClaimRef:
    return ClaimRef(uid=claim.uid, namespace=claim.namespace, name=claim.name)  # type: ignore[arg-type]


BACKEND_STEPS = ["before-gi", "after-gi", "after-ci"]
PLUGIN_STEPS = ["after-started", "after-cdi", "after-checkpoint"]


@pytest.mark.parametrize("step", BACKEND_STEPS + PLUGIN_STEPS)
def test_crash_during_prepare_then_restart_leaks_nothing_and_answers_the_same(
    node: NodeHarness, step: str
) -> None:
    devices = ["gpu-0-1g-5gb-1", "gpu-1-3g-20gb-4"]
    # The answer a plugin gives without crashing, on a throw-away claim of the same shape.
    reference = node.start_plugin()
    warmup = node.claim(devices)
    baseline = node.kubelet().prepare([warmup])[warmup.uid]
    assert baseline.error == ""
    node.kubelet().unprepare([warmup])
    node.stop_plugin(reference)

    crashing = node.start_plugin(
        fault_hook=crash_at(step) if step in BACKEND_STEPS else None,
        step_hook=crash_at(step) if step in PLUGIN_STEPS else None,
    )
    claim = node.claim(devices)
    with pytest.raises(Crash):
        crashing.state.prepare([_ref(claim)])
    node.stop_plugin(crashing)

    node.start_plugin()
    report = node.last_report
    instances = node.instances()
    if step == "after-checkpoint":
        assert report.kept == [claim.uid]
        assert len(instances) == 2
    else:
        assert report.rolled_back == [claim.uid]
        assert instances == []  # the half-done prepare was rolled back: no leaked instance
    assert report.orphans_destroyed == []

    answer = node.kubelet().prepare([claim])[claim.uid]
    assert answer.devices == tuple(
        (req, pool, dev, (ids[0].replace(warmup.uid, claim.uid),))
        for req, pool, dev, ids in baseline.devices
    )
    assert answer.error == ""
    after = node.instances()
    assert sorted((g, p, s) for g, p, s, _ in after) == [(0, "1g.5gb", 1), (1, "3g.20gb", 4)]
    if step == "after-checkpoint":
        assert after == instances  # answered from the checkpoint: the GPU was not touched
    entry = CheckpointStore(node.state_dir / "checkpoint.json").load().claim(claim.uid)
    assert entry is not None
    assert entry.state is PrepareState.PREPARE_COMPLETED
    assert len(node.cdi_files()) == 1

    assert node.kubelet().unprepare([claim]) == {claim.uid: ""}
    assert node.instances() == []
    assert node.cdi_files() == []


def test_ordinary_failure_mid_prepare_is_rolled_back_and_a_retry_succeeds(
    node: NodeHarness,
) -> None:
    """An exception (not a crash) rolls back at once; the kubelet's retry then succeeds."""
    crashed_once: list[str] = []

    def crash_first_time(step: str) -> None:
        if step == "after-cdi" and not crashed_once:
            crashed_once.append(step)
            raise RuntimeError("CDI directory hiccup")

    plugin = node.start_plugin(step_hook=crash_first_time)
    claim = node.claim(["gpu-0-7g-40gb-0"])
    answer = node.kubelet().prepare([claim])[claim.uid]
    assert "CDI directory hiccup" in answer.error
    assert node.instances() == []  # an ordinary failure is rolled back at once
    assert claim.uid not in plugin.state.prepared()
    assert node.kubelet().prepare([claim])[claim.uid].error == ""
    assert node.instances() == [(0, "7g.40gb", 0, 1)]


def test_started_entry_with_its_instance_is_adopted_by_the_next_attempt(node: NodeHarness) -> None:
    plugin = node.start_plugin(step_hook=None)
    claim = node.claim(["gpu-1-2g-10gb-2"])
    # Simulate a failed rollback: the instance exists and the entry says PrepareStarted.
    outsider = node.backend()
    outsider.create_slice(gpu_index=1, profile="2g.10gb", start=2)
    outsider.close()
    plugin.store.update(
        lambda cp: cp.with_claim(
            PreparedClaim(
                uid=claim.uid,
                namespace=claim.namespace,
                name=claim.name,
                state=PrepareState.PREPARE_STARTED,
                devices=(
                    PreparedDevice(
                        request_names=("gpu",),
                        pool=node.node,
                        device="gpu-1-2g-10gb-2",
                        gpu_index=1,
                        gpu_uuid="GPU-x",
                        profile="2g.10gb",
                        placement_start=2,
                        placement_size=2,
                    ),
                ),
            )
        )
    )
    before = node.instances()
    assert node.kubelet().prepare([claim])[claim.uid].error == ""
    assert node.instances() == before


def test_recovery_destroys_orphans_but_not_slices_of_live_claims(node: NodeHarness) -> None:
    plugin = node.start_plugin()
    live = node.claim(["gpu-0-3g-20gb-4"])
    assert node.kubelet().prepare([live])[live.uid].error == ""
    node.stop_plugin(plugin)
    outsider = node.backend()
    outsider.create_slice(gpu_index=0, profile="1g.5gb", start=0)
    outsider.create_slice(gpu_index=1, profile="7g.40gb", start=0)
    outsider.close()
    (node.cdi_root / "instaslice.dev-mig_0f0f0f0f-dead.json").write_text("{}")

    node.start_plugin()
    report = node.last_report
    assert len(report.orphans_destroyed) == 2
    assert any("1g.5gb at placement 0 on GPU 0" in o for o in report.orphans_destroyed)
    assert report.specs_removed == ["0f0f0f0f-dead"]
    assert report.kept == [live.uid]
    assert [(g, p, s) for g, p, s, _ in node.instances()] == [(0, "3g.20gb", 4)]
    assert node.kubelet().prepare([live])[live.uid].error == ""


def test_unprepare_cut_short_after_destroying_the_slice_is_finished_by_recovery(
    node: NodeHarness,
) -> None:
    plugin = node.start_plugin()
    claim = node.claim(["gpu-1-3g-20gb-0"])
    node.kubelet().prepare([claim])
    node.stop_plugin(plugin)
    backend = node.backend()  # the crashed unprepare had destroyed the GPU instance only
    (instance,) = backend.instances()
    backend.destroy_slice(gpu_index=instance.gpu_index, gi_id=instance.gi_id)
    backend.close()

    node.start_plugin()
    assert node.last_report.released == [claim.uid]
    assert node.cdi_files() == []
    assert node.kubelet().unprepare([claim]) == {claim.uid: ""}


def test_claim_deleted_while_the_plugin_was_down_is_released(node: NodeHarness) -> None:
    plugin = node.start_plugin()
    gone = node.claim(["gpu-0-1g-5gb-0"])
    stays = node.claim(["gpu-0-1g-5gb-1"])
    node.kubelet().prepare([gone, stays])
    node.stop_plugin(plugin)
    node.delete_claim(gone)

    node.start_plugin()
    assert node.last_report.released == [gone.uid]
    assert node.last_report.kept == [stays.uid]
    assert [(g, p, s) for g, p, s, _ in node.instances()] == [(0, "1g.5gb", 1)]
    assert len(node.cdi_files()) == 1


def test_boot_id_change_resets_the_checkpoint(node: NodeHarness) -> None:
    plugin = node.start_plugin(boot_id="boot-1")
    claim = node.claim(["gpu-1-4g-20gb-0"])
    node.kubelet().prepare([claim])
    node.stop_plugin(plugin)

    node.start_plugin(boot_id="boot-2")
    report = node.last_report
    assert report.rebooted
    assert report.kept == []
    # The emulated state file outlived the "reboot"; real instances would not have.
    assert len(report.orphans_destroyed) == 1
    assert node.instances() == []
    assert node.cdi_files() == []
    stored = CheckpointStore(node.state_dir / "checkpoint.json").load()
    assert stored.boot_id == "boot-2"
    assert stored.claims == {}
    assert node.kubelet().prepare([claim])[claim.uid].error == ""
    assert len(node.instances()) == 1


def test_corrupt_checkpoint_is_rebuilt_from_the_api_gpus_and_cdi_specs(node: NodeHarness) -> None:
    plugin = node.start_plugin()
    claim = node.claim(["gpu-0-2g-10gb-0", "gpu-0-2g-10gb-2"])
    first = node.kubelet().prepare([claim])[claim.uid]
    node.stop_plugin(plugin)
    checkpoint_file = node.state_dir / "checkpoint.json"
    document = json.loads(checkpoint_file.read_text())
    document["data"]["node_name"] = "tampered"
    checkpoint_file.write_text(json.dumps(document))

    node.start_plugin()
    report = node.last_report
    assert report.corrupt_checkpoint
    assert report.rebuilt == [claim.uid]
    assert report.orphans_destroyed == []
    assert (node.state_dir / "checkpoint.json.corrupt").exists()
    before = node.instances()
    assert node.kubelet().prepare([claim])[claim.uid] == first
    assert node.instances() == before
