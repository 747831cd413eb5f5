"""``waitreport`` on hand-made inputs: the reasons no local-cluster scenario reaches cheaply (held
room, quota), the profile label, and stranded room counted per GPU model."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

from api.names import SCHEDULING_GATE
from controller.allocation.conditions import Reason
from controller.allocation.holds import HoldKind
from controller.allocation.waitreport import MIXED, WaitingPod, profile_label, wait_report
from driver.cluster.views import PodView
from driver.mig.catalog import CATALOG
from driver.placement.state import StateKey
from driver.placement.tables import table_for

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
A100 = CATALOG["A100-40GB"]


def _pod(name: str, *, gates: tuple[str, ...] = (SCHEDULING_GATE,), age: float = 60) -> PodView:
    created = (NOW - timedelta(seconds=age)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return PodView.of(
        {
            "metadata": {
                "name": name,
                "namespace": "ns",
                "uid": f"uid-{name}",
                "creationTimestamp": created,
            },
            "spec": {"schedulingGates": [{"name": g} for g in gates], "containers": []},
            "status": {"phase": "Pending"},
        }
    )


def _state(mask: int) -> StateKey:
    table = table_for(A100, None)
    counts = [0] * len(table.profiles)
    return (table, mask, False, tuple(counts))


def test_held_room_and_quota_name_the_wait() -> None:
    pods = [_pod("reserved"), _pod("preempting"), _pod("quota"), _pod("next")]
    waiting = {
        "ns/reserved": WaitingPod("ns/reserved", frozenset({"3g.20gb"}), HoldKind.RESERVATION),
        "ns/preempting": WaitingPod("ns/preempting", frozenset({"3g.20gb"}), HoldKind.PREEMPTION),
        "ns/next": WaitingPod("ns/next", frozenset({"7g.40gb"}), None),
    }
    report = wait_report(
        pods,
        gate=SCHEDULING_GATE,
        waiting=waiting,
        reported={"uid-quota": Reason.QUOTA_EXCEEDED},
        states=Counter({_state(0b1111_1111): 2}),  # two full GPUs
        now=NOW,
    )
    assert report.pods == Counter(
        {
            ("reserved", "3g.20gb"): 1,
            ("preempting", "3g.20gb"): 1,
            ("quota", ""): 1,
            ("no-capacity", "7g.40gb"): 1,
        }
    )
    assert report.oldest == {"3g.20gb": 60.0, "": 60.0, "7g.40gb": 60.0}
    product = _state(0)[0].model.name
    assert report.free_slices == {product: 0}
    assert report.stranded_slices == {product: 0}


def test_stranded_slices_are_those_no_waiting_profile_can_use() -> None:
    waiting = {"ns/big": WaitingPod("ns/big", frozenset({"3g.20gb"}), None)}
    # GPU A: slices 0-3 taken, 4-7 free (a 3g.20gb fits at 4); GPU B: 0, 2, 4, 6 taken (4 free,
    # scattered: no 3g.20gb placement), twice
    states = Counter({_state(0b0000_1111): 1, _state(0b0101_0101): 2})
    report = wait_report(
        [_pod("big")], gate=SCHEDULING_GATE, waiting=waiting, reported={}, states=states, now=NOW
    )
    product = _state(0)[0].model.name
    assert report.free_slices == {product: 12}
    assert report.stranded_slices == {product: 8}
    assert report.pods == Counter({("node-filter", "3g.20gb"): 1})  # GPU A could take it


def test_the_profile_label() -> None:
    assert profile_label(frozenset()) == ""
    assert profile_label(frozenset({"1g.5gb"})) == "1g.5gb"
    assert profile_label(frozenset({"1g.5gb", "2g.10gb"})) == MIXED
