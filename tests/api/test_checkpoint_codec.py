"""The checkpoint schema and its file format: round trips, and every way the bytes can be wrong."""

import json
from typing import Any

import pytest
from pydantic import ValidationError

from api.checkpoint import (
    CHECKPOINT_VERSION,
    Checkpoint,
    PodRef,
    PreparedClaim,
    PreparedDevice,
    PrepareState,
    ShimBinding,
    SliceSeconds,
    data_checksum,
    decode_checkpoint,
    encode_checkpoint,
)
from api.errors import CheckpointDecodeError

CLAIM_UID = "0b5c4e2a-1111-2222-3333-444455556666"


def _device(*, start: int = 0, complete: bool = True) -> PreparedDevice:
    return PreparedDevice(
        request_names=("gpu",),
        pool="node-a",
        device=f"gpu-0-1g-5gb-{start}",
        gpu_index=0,
        gpu_uuid="GPU-00000000",
        profile="1g.5gb",
        placement_start=start,
        placement_size=1,
        gi_id=start + 7 if complete else None,
        ci_id=0 if complete else None,
        mig_uuid=f"MIG-{start:08d}" if complete else None,
        cdi_device_ids=(f"instaslice.dev/mig={CLAIM_UID}-gpu-0-1g-5gb-{start}",)
        if complete
        else (),
    )


def _checkpoint() -> Checkpoint:
    completed = PreparedClaim(
        uid=CLAIM_UID,
        namespace="team-a",
        name="pod-a-gpu-x7k2q",
        state=PrepareState.PREPARE_COMPLETED,
        devices=(_device(start=0), _device(start=1)),
        pods=(PodRef(name="pod-a", uid="pod-a-uid"),),
        prepared_at=1_700_000_000.25,
    )
    started = PreparedClaim(
        uid="9f000000-0000-0000-0000-000000000001",
        namespace="team-b",
        name="shadow-1",
        state=PrepareState.PREPARE_STARTED,
        devices=(_device(start=2, complete=False),),
        shim=ShimBinding(
            resource_name="nvidia.com/mig-1g.5gb", device_plugin_ids=("mig-1g.5gb-0",)
        ),
    )
    totals = (SliceSeconds(namespace="team-c", profile="3g.20gb", seconds=7200.5),)
    return (
        Checkpoint(node_name="node-a", boot_id="boot-1", released_slice_seconds=totals)
        .with_claim(completed)
        .with_claim(started)
    )


def _envelope(
    data: dict[str, Any], *, version: Any = CHECKPOINT_VERSION, checksum: str | None = None
) -> bytes:
    return json.dumps(
        {"version": version, "checksum": checksum or data_checksum(data), "data": data}
    ).encode()


def test_round_trip_keeps_every_field() -> None:
    checkpoint = _checkpoint()
    assert decode_checkpoint(encode_checkpoint(checkpoint)) == checkpoint


def test_empty_checkpoint_round_trips() -> None:
    assert decode_checkpoint(encode_checkpoint(Checkpoint())) == Checkpoint()


def test_the_envelope_holds_version_checksum_and_data() -> None:
    envelope = json.loads(encode_checkpoint(_checkpoint()))
    assert set(envelope) == {"version", "checksum", "data"}
    assert envelope["version"] == CHECKPOINT_VERSION == 2
    assert envelope["checksum"].startswith("sha256:")
    assert envelope["data"]["claims"][CLAIM_UID]["state"] == "PrepareCompleted"


def test_layout_does_not_matter_only_the_data() -> None:
    envelope = json.loads(encode_checkpoint(_checkpoint()))
    compact = json.dumps(envelope, separators=(",", ":")).encode()
    assert decode_checkpoint(compact) == _checkpoint()


def test_a_changed_value_is_a_checksum_mismatch() -> None:
    envelope = json.loads(encode_checkpoint(_checkpoint()))
    envelope["data"]["claims"][CLAIM_UID]["devices"][0]["gi_id"] = 99
    with pytest.raises(CheckpointDecodeError, match="checksum mismatch: the file says 'sha256:"):
        decode_checkpoint(json.dumps(envelope).encode())


@pytest.mark.parametrize("keep", [0.2, 0.5, 0.99], ids=["fifth", "half", "all-but-the-end"])
def test_a_truncated_file_is_reported_as_such(keep: float) -> None:
    data = encode_checkpoint(_checkpoint())
    with pytest.raises(CheckpointDecodeError, match="may be truncated"):
        decode_checkpoint(data[: int(len(data) * keep)])


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"", "the file is empty"),
        (b"  \n", "the file is empty"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[1, 2]", "expected a JSON object, found list"),
        (_envelope({}, version=3), "unknown checkpoint version 3 (this build reads versions 1, 2)"),
        (_envelope({}, version=0), "unknown checkpoint version 0"),
        (_envelope({}, version="1"), "version must be an integer, found '1'"),
        (_envelope({}, version=True), "version must be an integer, found True"),
        (b'{"version": 1, "data": {}}', "missing ['checksum']"),
        (
            json.dumps({"version": 1, "checksum": "x", "data": {}, "extra": 1}).encode(),
            "unknown ['extra']",
        ),
        (
            json.dumps({"version": 1, "checksum": "x", "data": []}).encode(),
            "data must be a JSON object, found list",
        ),
    ],
    ids=[
        "empty",
        "blank",
        "binary",
        "array",
        "newer-version",
        "version-0",
        "string-version",
        "bool-version",
        "no-checksum",
        "extra-key",
        "data-list",
    ],
)
def test_bad_bytes_name_the_problem(raw: bytes, fragment: str) -> None:
    with pytest.raises(CheckpointDecodeError) as info:
        decode_checkpoint(raw)
    assert fragment in str(info.value)


def test_data_that_breaks_the_schema_names_the_field_even_with_a_good_checksum() -> None:
    data = json.loads(encode_checkpoint(_checkpoint()))["data"]
    data["claims"][CLAIM_UID]["colour"] = "blue"
    data["claims"][CLAIM_UID]["devices"][0]["placement_size"] = 0
    with pytest.raises(CheckpointDecodeError) as info:
        decode_checkpoint(_envelope(data))
    message = str(info.value)
    assert message.startswith("data does not match checkpoint schema version 2")
    assert f"unknown field 'claims.{CLAIM_UID}.colour' in Checkpoint" in message
    assert f"Checkpoint.claims.{CLAIM_UID}.devices.0.placement_size" in message


def test_a_completed_claim_must_have_complete_devices() -> None:
    with pytest.raises(ValidationError, match=r"lack a GPU-instance id"):
        PreparedClaim(
            uid=CLAIM_UID,
            namespace="ns",
            name="c",
            state=PrepareState.PREPARE_COMPLETED,
            devices=(_device(complete=False),),
        )


def test_claims_are_keyed_by_their_uid() -> None:
    claim = _checkpoint().claims[CLAIM_UID]
    with pytest.raises(ValidationError, match="stored under key 'other' has uid"):
        Checkpoint(claims={"other": claim})


def test_functional_updates_leave_the_original_alone() -> None:
    original = _checkpoint()
    without = original.without_claim(CLAIM_UID)
    assert CLAIM_UID in original.claims
    assert without.claim(CLAIM_UID) is None
    assert original.without_claim("absent") == original
    stamped = without.with_identity(node_name="node-b", boot_id="boot-2")
    assert (stamped.node_name, stamped.boot_id, stamped.claims) == (
        "node-b",
        "boot-2",
        without.claims,
    )


# A version-1 file as version-1 builds wrote it: no pods, no prepared_at, no holder's pod name,
# no released slice-seconds.
_VERSION_1_DATA: dict[str, Any] = {
    "node_name": "node-a",
    "boot_id": "boot-1",
    "claims": {
        CLAIM_UID: {
            "uid": CLAIM_UID,
            "namespace": "team-a",
            "name": "shadow-1",
            "state": "PrepareCompleted",
            "devices": [_device(start=0).model_dump(mode="json")],
            "shim": {
                "resource_name": "nvidia.com/mig-1g.5gb",
                "device_plugin_ids": ["mig-1g.5gb-0"],
                "pod_uid": "pod-uid",
                "container_name": "main",
            },
        }
    },
}


def test_a_version_1_file_decodes_with_what_version_2_added_unknown() -> None:
    checkpoint = decode_checkpoint(_envelope(_VERSION_1_DATA, version=1))
    claim = checkpoint.claims[CLAIM_UID]
    assert (claim.pods, claim.prepared_at) == ((), None)
    assert claim.shim is not None
    assert (claim.shim.pod_uid, claim.shim.pod_name, claim.shim.pod_namespace) == (
        "pod-uid",
        None,
        None,
    )
    assert checkpoint.released_slice_seconds == ()
    assert claim.devices == (_device(start=0),)
    envelope = json.loads(encode_checkpoint(checkpoint))
    assert envelope["version"] == 2
    assert decode_checkpoint(encode_checkpoint(checkpoint)) == checkpoint


def test_a_version_1_file_keeps_its_own_checksum_rule() -> None:
    envelope = json.loads(_envelope(_VERSION_1_DATA, version=1))
    envelope["data"]["node_name"] = "node-b"
    with pytest.raises(CheckpointDecodeError, match="checksum mismatch"):
        decode_checkpoint(json.dumps(envelope).encode())


def test_released_adds_the_claims_slice_seconds_to_its_namespace_and_profile() -> None:
    checkpoint = _checkpoint()
    released = checkpoint.released(CLAIM_UID, at=1_700_000_100.25)
    assert released.claim(CLAIM_UID) is None
    assert released.released_slice_seconds == (
        SliceSeconds(namespace="team-a", profile="1g.5gb", seconds=200.0),
        SliceSeconds(namespace="team-c", profile="3g.20gb", seconds=7200.5),
    )
    again = released.with_claim(checkpoint.claims[CLAIM_UID]).released(
        CLAIM_UID, at=1_700_000_010.25
    )
    assert again.released_slice_seconds[0].seconds == 220.0
    assert (released.node_name, released.boot_id) == ("node-a", "boot-1")


@pytest.mark.parametrize(
    ("uid", "at"),
    [
        ("9f000000-0000-0000-0000-000000000001", 1_700_000_100.0),
        ("absent", 1_700_000_100.0),
    ],
    ids=["never-completed", "absent"],
)
def test_released_adds_nothing_for_a_claim_without_an_age(uid: str, at: float) -> None:
    checkpoint = _checkpoint()
    released = checkpoint.released(uid, at=at)
    assert released.released_slice_seconds == checkpoint.released_slice_seconds
    assert released.claim(uid) is None


def test_a_clock_set_back_releases_zero_seconds_not_negative() -> None:
    released = _checkpoint().released(CLAIM_UID, at=1_600_000_000.0)
    assert released.released_slice_seconds[0] == SliceSeconds(
        namespace="team-a", profile="1g.5gb", seconds=0.0
    )
