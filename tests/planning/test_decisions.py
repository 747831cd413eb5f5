"""The placement decisions of every policy on a few thousand replayed requests, pinned.

Speed work on the engine must not change a single decision: each policy's placements (node, GPU,
profile, start of every device) or rejection, request by request, are compared with the recorded
ones in ``data/decisions-<policy>.txt.gz``. A policy change that is *meant* to move decisions
rewrites them with ``python -m tests.planning.test_decisions`` (and says so in its commit).
"""

from __future__ import annotations

import gzip
import heapq
from pathlib import Path

import pytest

from driver.placement import Engine, Placed, PodRequest
from instaslice.planning.fleet import Fleet, parse_fleet
from instaslice.planning.trace import TraceRequest, parse_mix, synthesize

DATA = Path(__file__).resolve().parent / "data"
POLICIES = ("firstfit", "bestfit", "scarcity")
FLEET = "6x8xA100-40GB,3x4xH100-80GB"
"""Two GPU models (two tables, mixed node shapes), so cross-model choices are covered too."""
MIX = (
    "1g.5gb=40,1g.10gb=10,2g.10gb=15,3g.20gb=12,4g.20gb=5,7g.40gb=5,1g.5gb+me=5,2*1g.5gb=4,"
    "1g.10gb+me=3,2g.20gb=5,3g.40gb=5,7g.80gb=2,2*2g.20gb=2"
)
EVENTS = 3_000


def _trace(fleet: Fleet) -> tuple[TraceRequest, ...]:
    return synthesize(fleet=fleet, mix=parse_mix(MIX), load=0.95, events=EVENTS, seed=17)


def decisions(policy: str) -> list[str]:
    """One line per request: ``-`` if rejected, else the node and each device's GPU:profile@start."""
    fleet = parse_fleet(FLEET)
    engine = Engine(policy=policy)
    for node in fleet.nodes:
        engine.set_node(node)
    pods: dict[tuple[str, int], PodRequest] = {}
    departures: list[tuple[float, int, Placed]] = []
    lines = []
    for sequence, request in enumerate(_trace(fleet)):
        while departures and departures[0][0] <= request.t:
            engine.release_placed(heapq.heappop(departures)[2])
        key = (request.profile, request.count)
        pod = pods.get(key)
        if pod is None:
            pod = pods[key] = PodRequest.single(key[0], count=key[1], one_gpu=key[1] > 1)
        result = engine.place(pod)
        if isinstance(result, Placed):
            engine.commit(result)
            heapq.heappush(departures, (request.t + request.duration, sequence, result))
            lines.append(
                result.node
                + "".join(f" {a.gpu_index}:{a.profile}@{a.start}" for a in result.assignments)
            )
        else:
            lines.append("-")
    return lines


def _path(policy: str) -> Path:
    return DATA / f"decisions-{policy}.txt.gz"


@pytest.mark.parametrize("policy", POLICIES)
def test_every_decision_is_the_recorded_one(policy: str) -> None:
    expected = gzip.decompress(_path(policy).read_bytes()).decode().splitlines()
    got = decisions(policy)
    assert len(got) == len(expected) == EVENTS
    for number, (was, now) in enumerate(zip(expected, got, strict=True), start=1):
        assert now == was, f"{policy}: request {number} placed differently"
    rejected = sum(line == "-" for line in got)
    assert 0 < rejected < EVENTS // 4  # a loaded fleet: both outcomes are exercised


if __name__ == "__main__":
    DATA.mkdir(exist_ok=True)
    for name in POLICIES:
        text = "\n".join(decisions(name)) + "\n"
        _path(name).write_bytes(gzip.compress(text.encode(), mtime=0))
        print(
            f"wrote {_path(name)}: {text.count(chr(10))} decisions, {text.count('-' + chr(10))} -"
        )
