"""The in-memory checkpoint with group commit: every change durable on return, saves shared."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from api.checkpoint import Checkpoint, PreparedClaim, PrepareState
from driver.checkpoint import CheckpointStore
from driver.errors import CheckpointError
from kubeletplugin.state.journal import CheckpointJournal


def claim(uid: str) -> PreparedClaim:
    return PreparedClaim(uid=uid, namespace="ns", name=uid, state=PrepareState.PREPARE_STARTED)


class SlowStore(CheckpointStore):
    """A real store whose saves are held until released, and counted."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.saves = 0
        self.gate = threading.Event()
        self.fail = False

    def save(self, checkpoint: Checkpoint) -> None:
        self.gate.wait(10)
        if self.fail:
            raise CheckpointError("disk full")
        self.saves += 1
        super().save(checkpoint)


def test_concurrent_updates_share_saves_and_each_is_durable_on_return(tmp_path: Path) -> None:
    store = SlowStore(tmp_path / "checkpoint.json")
    journal = CheckpointJournal(store)
    uids = [f"u{i}" for i in range(20)]

    def add(uid: str) -> None:
        journal.update(lambda cp: cp.with_claim(claim(uid)))
        assert uid in CheckpointStore(store.path).load().claims  # on disk before returning

    with ThreadPoolExecutor(max_workers=20) as pool:
        futures = [pool.submit(add, uid) for uid in uids]
        store.gate.set()
        for future in futures:
            future.result()
    assert set(CheckpointStore(store.path).load().claims) == set(uids)
    assert store.saves < len(uids)


def test_a_failing_change_writes_nothing(tmp_path: Path) -> None:
    store = SlowStore(tmp_path / "checkpoint.json")
    store.gate.set()
    journal = CheckpointJournal(store)

    def refuse(cp: Checkpoint) -> Checkpoint:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        journal.update(refuse)
    assert store.saves == 0
    assert not store.path.exists()


def test_a_failed_save_is_reported_to_the_caller(tmp_path: Path) -> None:
    store = SlowStore(tmp_path / "checkpoint.json")
    store.gate.set()
    store.fail = True
    journal = CheckpointJournal(store)
    change: Callable[[Checkpoint], Checkpoint] = lambda cp: cp.with_claim(claim("a"))  # noqa: E731
    with pytest.raises(CheckpointError, match="disk full"):
        journal.update(change)
    store.fail = False
    journal.update(lambda cp: cp.with_claim(claim("b")))
    assert set(CheckpointStore(store.path).load().claims) == {"a", "b"}
