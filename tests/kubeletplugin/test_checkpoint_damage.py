"""A checkpoint file truncated or corrupted at every byte position: the plugin starts, says what it
found, rebuilds from the API server, the GPUs and the CDI specs, leaks nothing, and its next start
finds a good file again (no crash loop).

Every damaged file either decodes to exactly the checkpoint that was written (damage only to
layout) or is refused with ``CheckpointDecodeError`` — proven here for every position, each of
several byte values, and arbitrary bytes. What the plugin does with a refused file does not depend
on where the damage is, only on the refusal; so the plugin is started once for each distinct kind
of refusal those positions produce (and for what no position produces: nesting deep enough to
break a recursive parser, a file too large to be ours, a directory).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.checkpoint import (
    Checkpoint,
    PodRef,
    PreparedClaim,
    PreparedDevice,
    PrepareState,
    ShimBinding,
    SliceSeconds,
    decode_checkpoint,
    encode_checkpoint,
)
from api.errors import CheckpointDecodeError
from driver.checkpoint import MAX_CHECKPOINT_BYTES
from kubeletplugin.health.settings import XidPolicy
from tests.kubeletplugin.harness import ClaimHandle, NodeHarness

Damage = Callable[[bytes, int], bytes]
FLIPS: dict[str, Damage] = {
    "truncated": lambda raw, at: raw[:at],
    "bit-flipped": lambda raw, at: raw[:at] + bytes([raw[at] ^ 0x01]) + raw[at + 1 :],
    "zeroed": lambda raw, at: raw[:at] + b"\x00" + raw[at + 1 :],
    "not-utf8": lambda raw, at: raw[:at] + b"\xff" + raw[at + 1 :],
    "quote": lambda raw, at: raw[:at] + b'"' + raw[at + 1 :],
    "brace": lambda raw, at: raw[:at] + b"}" + raw[at + 1 :],
    "digit": lambda raw, at: raw[:at] + b"7" + raw[at + 1 :],
}


@pytest.fixture
def node(node: NodeHarness) -> NodeHarness:
    """The node, its plugin without an XID watch: it restarts at once (these tests restart it
    often and inject no XID)."""
    node.xid_policy = XidPolicy(ignore_all=True)
    return node


def _device(index: int, *, complete: bool) -> PreparedDevice:
    return PreparedDevice(
        request_names=("gpu",),
        pool="node-a",
        device=f"gpu-{index}-1g-5gb-0",
        gpu_index=index,
        gpu_uuid=f"GPU-{index:08d}-aaaa-bbbb-cccc-000000000000",
        profile="1g.5gb",
        placement_start=0,
        placement_size=1,
        gi_id=7 if complete else None,
        ci_id=0 if complete else None,
        mig_uuid=f"MIG-{index:08d}-dddd-eeee-ffff-000000000000" if complete else None,
        cdi_device_ids=(f"k8s.instaslice.dev/mig=claim-{index}",) if complete else (),
    )


def sample_checkpoint() -> Checkpoint:
    """Both states, a shim binding, every optional field: every field's bytes get damaged."""
    done = PreparedClaim(
        uid="uid-done",
        namespace="team-a",
        name="done",
        state=PrepareState.PREPARE_COMPLETED,
        devices=(_device(0, complete=True),),
        shim=ShimBinding(
            resource_name="nvidia.com/mig-1g.5gb",
            device_plugin_ids=("mig-1",),
            pod_uid="pod-1",
            container_name="main",
            pod_name="pod-one",
            pod_namespace="team-a",
        ),
        pods=(PodRef(name="pod-one", uid="pod-1"),),
        prepared_at=1_700_000_000.5,
    )
    started = PreparedClaim(
        uid="uid-started",
        namespace="team-b",
        name="started",
        state=PrepareState.PREPARE_STARTED,
        devices=(_device(1, complete=False),),
    )
    released = (SliceSeconds(namespace="team-c", profile="2g.10gb", seconds=3600.25),)
    return (
        Checkpoint(node_name="node-a", boot_id="boot-1", released_slice_seconds=released)
        .with_claim(done)
        .with_claim(started)
    )


def _kind(exc: CheckpointDecodeError) -> str:
    """The kind of refusal: its message without the specifics (positions, values, hashes)."""
    text = re.sub(r"\(.*", "", str(exc))
    text = re.sub(r"'[^']*'|\"[^\"]*\"|\d+", "_", text)
    return text.split(":")[0].strip()


def damage_kinds(raw: bytes) -> dict[str, bytes]:
    """Every position, every damage: one damaged file per kind of refusal (the first found)."""
    original = decode_checkpoint(raw)
    kinds: dict[str, bytes] = {}
    for damage in FLIPS.values():
        for at in range(len(raw)):
            damaged = damage(raw, at)
            try:
                decoded = decode_checkpoint(damaged)
            except CheckpointDecodeError as exc:
                kinds.setdefault(_kind(exc), damaged)
                continue
            assert decoded == original, (at, damaged)
    return kinds


def test_every_damaged_position_decodes_to_the_original_or_is_refused() -> None:
    kinds = damage_kinds(encode_checkpoint(sample_checkpoint()))
    # the layers of the format each refuse something: text, JSON, envelope, checksum
    assert {"not UTF-_ text", "not valid JSON", "checksum mismatch"} <= set(kinds), kinds


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_are_refused_with_a_reason(raw: bytes) -> None:
    with pytest.raises(CheckpointDecodeError):
        decode_checkpoint(raw)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_several_bytes_damaged_at_once_decode_to_the_original_or_are_refused(
    data: st.DataObject,
) -> None:
    raw = bytearray(encode_checkpoint(sample_checkpoint()))
    for _ in range(data.draw(st.integers(1, 8))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(CheckpointDecodeError):
        assert decode_checkpoint(bytes(raw)) == sample_checkpoint()


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000,
        b'{"data":' * 100_000,
        b'{"version":1,"checksum":"x","data":{"a":' + b"[" * 5000,
    ],
    ids=["deep-array", "deep-object", "deep-data"],
)
def test_nesting_too_deep_for_the_parser_is_refused_not_raised(raw: bytes) -> None:
    with pytest.raises(CheckpointDecodeError, match="nested deeper"):
        decode_checkpoint(raw)


# --- the plugin on a damaged file ----------------------------------------------------------


@pytest.fixture
def prepared(node: NodeHarness) -> tuple[NodeHarness, list[ClaimHandle]]:
    """Two prepared claims, the plugin stopped: its checkpoint is what gets damaged."""
    plugin = node.start_plugin()
    claims = [node.claim(["gpu-0-1g-5gb-0", "gpu-1-2g-10gb-0"]), node.claim(["gpu-0-3g-20gb-4"])]
    answers = node.kubelet().prepare(claims)
    assert all(answer.error == "" for answer in answers.values())
    node.stop_plugin(plugin)
    return node, claims


REFUSALS = {
    "empty": "the file is empty",
    "not-utf8": "not UTF-_ text",
    "not-json": "not valid JSON",
    "envelope": "envelope fields wrong",
    "checksum": "checksum mismatch",
    "version": "unknown checkpoint version _",
}
"""The kinds of refusal that damage at some position of a real checkpoint produces."""
BEYOND_POSITIONS: dict[str, Callable[[bytes], bytes]] = {
    "deep-nesting": lambda raw: b"[" * 100_000,
    "too-large": lambda raw: raw + b" " * (MAX_CHECKPOINT_BYTES + 1 - len(raw)),
}


def damaged(raw: bytes, case: str) -> bytes:
    """``raw`` damaged at the first position (by the first damage) that gives the ``case``
    refusal, or as ``BEYOND_POSITIONS`` says."""
    if case in BEYOND_POSITIONS:
        return BEYOND_POSITIONS[case](raw)
    return damage_kinds(raw)[REFUSALS[case]]


def test_a_real_checkpoint_damaged_anywhere_gives_only_the_refusals_tested_below(
    prepared: tuple[NodeHarness, list[ClaimHandle]],
) -> None:
    node, _ = prepared
    kinds = damage_kinds((node.state_dir / "checkpoint.json").read_bytes())
    assert set(kinds) == set(REFUSALS.values())


@pytest.mark.parametrize("case", [*REFUSALS, *BEYOND_POSITIONS])
def test_the_plugin_starts_on_a_damaged_checkpoint_rebuilds_it_and_leaks_nothing(
    prepared: tuple[NodeHarness, list[ClaimHandle]], case: str
) -> None:
    node, claims = prepared
    path = node.state_dir / "checkpoint.json"
    before_instances, before_specs = node.instances(), node.cdi_files()
    bad = damaged(path.read_bytes(), case)
    path.write_bytes(bad)

    plugin = node.start_plugin()
    report = node.last_report
    assert report.corrupt_checkpoint
    assert sorted(report.rebuilt) == sorted(c.uid for c in claims)
    assert (node.state_dir / "checkpoint.json.corrupt").read_bytes() == bad
    assert report.orphans_destroyed == []
    assert report.specs_removed == []
    assert node.instances() == before_instances
    assert node.cdi_files() == before_specs
    answers = node.kubelet().prepare(claims)
    assert all(answer.error == "" for answer in answers.values())
    assert node.instances() == before_instances  # answered from the rebuilt entries
    node.stop_plugin(plugin)

    node.start_plugin()  # no crash loop: the next start reads a good file
    assert not node.last_report.corrupt_checkpoint
    assert sorted(node.last_report.kept) == sorted(c.uid for c in claims)
    assert node.kubelet().unprepare(claims) == {c.uid: "" for c in claims}
    assert node.instances() == []
    assert node.cdi_files() == []


def test_a_checkpoint_path_that_is_a_directory_is_set_aside_too(
    prepared: tuple[NodeHarness, list[ClaimHandle]],
) -> None:
    node, claims = prepared
    path = node.state_dir / "checkpoint.json"
    path.unlink()
    path.mkdir()
    (path / "junk").write_text("x")
    node.start_plugin()
    assert node.last_report.corrupt_checkpoint
    assert sorted(node.last_report.rebuilt) == sorted(c.uid for c in claims)
    assert Path(str(path) + ".corrupt").is_dir()
    assert path.is_file()
