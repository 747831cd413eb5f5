"""Prepared slices in a new prepare's way: which clash, and which are released (pure, fake judge)."""

from __future__ import annotations

import pytest

from api.checkpoint import Checkpoint, PreparedClaim, PreparedDevice, PrepareState, ShimBinding
from driver.errors import ClusterError
from kubeletplugin.state.overlaps import (
    StaleSliceUnknownError,
    Verdict,
    clashes,
    overlap,
    release_stale,
)


def device(gpu: int, start: int, size: int, *, done: bool = True) -> PreparedDevice:
    name = f"gpu-{gpu}-s{start}-{size}"
    return PreparedDevice(
        request_names=("r",),
        pool="node",
        device=name,
        gpu_index=gpu,
        gpu_uuid=f"GPU-{gpu}",
        profile="1g.5gb",
        placement_start=start,
        placement_size=size,
        gi_id=1 if done else None,
        ci_id=0 if done else None,
        mig_uuid=f"MIG-{name}" if done else None,
        cdi_device_ids=(f"x/y={name}",) if done else (),
    )


def claim(uid: str, *devices: PreparedDevice, started: bool = False) -> PreparedClaim:
    return PreparedClaim(
        uid=uid,
        namespace="ns",
        name=f"claim-{uid}",
        state=PrepareState.PREPARE_STARTED if started else PrepareState.PREPARE_COMPLETED,
        devices=devices,
        shim=ShimBinding(resource_name="nvidia.com/mig-1g.5gb"),
    )


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ((0, 0, 2), (0, 1, 1), True),
        ((0, 0, 2), (0, 2, 2), False),
        ((0, 0, 8), (1, 0, 8), False),
        ((0, 4, 4), (0, 0, 8), True),
    ],
    ids=["inside", "adjacent", "other-gpu", "covered"],
)
def test_overlap(a: tuple[int, int, int], b: tuple[int, int, int], expected: bool) -> None:
    assert overlap(device(*a), device(*b)) is expected
    assert overlap(device(*b), device(*a)) is expected


class FakeJudge:
    def __init__(self, verdicts: dict[str, Verdict | Exception | None]) -> None:
        self.verdicts = verdicts
        self.asked: list[str] = []

    def judge(self, entry: PreparedClaim) -> Verdict | None:
        self.asked.append(entry.uid)
        verdict = self.verdicts[entry.uid]
        if isinstance(verdict, Exception):
            raise verdict
        return verdict


def test_only_completed_clashing_claims_are_judged_and_only_stale_ones_released() -> None:
    checkpoint = Checkpoint(
        claims={
            c.uid: c
            for c in (
                claim("stale", device(0, 0, 1)),
                claim("dra", device(0, 1, 1)),
                claim("starting", device(0, 2, 1, done=False), started=True),
                claim("kept", device(0, 3, 1), device(0, 4, 1)),
                claim("elsewhere", device(1, 0, 1)),
                claim("mine", device(0, 0, 1)),
            )
        }
    )
    wanted = [device(0, 0, 4), device(0, 4, 2)]
    judge = FakeJudge(
        {
            "stale": Verdict(release=True, reason="gone"),
            "dra": None,
            "kept": Verdict(release=False, reason="its claim still holds it"),
        }
    )
    released: list[str] = []

    found = list(clashes(checkpoint, wanted, uid="mine"))
    kept = release_stale(
        found, judge=judge, preparing="ns/mine", release=lambda e: released.append(e.uid)
    )

    assert sorted({c.other.uid for c in found}) == ["dra", "kept", "stale", "starting"]
    assert released == ["stale"]
    assert kept == {"kept": "its claim still holds it"}
    assert sorted(judge.asked) == ["dra", "kept", "stale"]  # "kept" clashes twice, asked once


def test_a_judge_that_cannot_tell_fails_the_prepare_as_retryable_and_releases_nothing() -> None:
    checkpoint = Checkpoint(claims={"old": claim("old", device(0, 0, 1))})
    judge = FakeJudge({"old": ClusterError("connection refused")})
    released: list[str] = []
    with pytest.raises(StaleSliceUnknownError) as unknown:
        release_stale(
            clashes(checkpoint, [device(0, 0, 1)], uid="new"),
            judge=judge,
            preparing="ns/new",
            release=lambda e: released.append(e.uid),
        )
    assert unknown.value.retryable
    assert "claim ns/new: device gpu-0-s0-1 overlaps gpu-0-s0-1 of claim ns/claim-old" in str(
        unknown.value
    )
    assert "connection refused" in str(unknown.value)
    assert released == []
