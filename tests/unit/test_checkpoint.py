"""The checkpoint file: empty when absent, loud when corrupt, durable and private when saved."""

import json
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from api.checkpoint import Checkpoint, PreparedClaim, PrepareState, encode_checkpoint
from driver.checkpoint import CheckpointStore
from driver.errors import CheckpointError


def _claim(uid: str, *, state: PrepareState = PrepareState.PREPARE_STARTED) -> PreparedClaim:
    return PreparedClaim(uid=uid, namespace="ns", name=f"claim-{uid}", state=state)


def _adder(claim: PreparedClaim) -> Callable[[Checkpoint], Checkpoint]:
    return lambda checkpoint: checkpoint.with_claim(claim)


def test_a_missing_file_is_an_empty_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "plugin" / "checkpoint.json")
    assert store.load() == Checkpoint()


def test_save_then_load_round_trips_privately_and_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "plugin" / "checkpoint.json"
    store = CheckpointStore(path)
    checkpoint = Checkpoint(node_name="node-a", boot_id="b1").with_claim(_claim("u1"))
    store.save(checkpoint)
    store.save(checkpoint.with_claim(_claim("u2")))
    assert store.load() == checkpoint.with_claim(_claim("u2"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(path.parent) == ["checkpoint.json"]


@pytest.mark.parametrize(
    ("mangle", "fragment"),
    [
        (lambda data: data[: len(data) // 2], "may be truncated"),
        (lambda data: data.replace(b'"node-a"', b'"node-b"'), "checksum mismatch"),
        (
            lambda data: data.replace(b'"version":2', b'"version":7'),
            "unknown checkpoint version 7",
        ),
        (lambda data: b"", "the file is empty"),
    ],
    ids=["truncated", "edited", "newer-version", "empty"],
)
def test_a_corrupt_file_is_an_error_naming_the_file_and_the_problem(
    tmp_path: Path, mangle: Callable[[bytes], bytes], fragment: str
) -> None:
    path = tmp_path / "checkpoint.json"
    data = encode_checkpoint(Checkpoint(node_name="node-a").with_claim(_claim("u1")))
    path.write_bytes(mangle(data))
    with pytest.raises(CheckpointError) as info:
        CheckpointStore(path).load()
    assert str(path) in str(info.value)
    assert fragment in str(info.value)


def test_an_unreadable_path_is_a_checkpoint_error(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.json").mkdir()
    store = CheckpointStore(tmp_path / "checkpoint.json")
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        store.load()
    with pytest.raises(CheckpointError, match="cannot write checkpoint"):
        store.save(Checkpoint())


def test_update_loses_no_claim_under_concurrent_writers(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    errors: list[BaseException] = []

    def add_claims(worker: int) -> None:
        try:
            for i in range(5):
                store.update(_adder(_claim(f"w{worker}-{i}")))
        except BaseException as exc:  # surfaced by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=add_claims, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(store.load().claims) == sorted(f"w{w}-{i}" for w in range(6) for i in range(5))


def test_update_that_raises_writes_nothing(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    store.save(Checkpoint().with_claim(_claim("u1")))
    before = store.path.read_bytes()

    def fail(_: Checkpoint) -> Checkpoint:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        store.update(fail)
    assert store.path.read_bytes() == before


def test_update_without_a_change_does_not_write(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    assert store.update(lambda cp: cp) == Checkpoint()
    assert not store.path.exists()


def test_update_returns_what_it_saved(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    result = store.update(
        lambda cp: cp.with_claim(_claim("u1")).with_identity(node_name="n", boot_id="b")
    )
    assert result == store.load()
    assert json.loads(store.path.read_bytes())["data"]["boot_id"] == "b"


def test_stale_temp_files_from_a_crash_are_removed(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    (tmp_path / ".checkpoint.json.k3j2.tmp").write_bytes(b"{")
    (tmp_path / ".other.tmp").write_bytes(b"{")
    assert store.remove_stale_temp_files() == 1
    assert sorted(os.listdir(tmp_path)) == [".other.tmp"]
    assert CheckpointStore(tmp_path / "absent" / "checkpoint.json").remove_stale_temp_files() == 0
