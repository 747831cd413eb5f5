"""Trace files: parsing with line-numbered errors, round trips, synthesis, fleet specs."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from driver.errors import ConfigError
from instaslice.planning.fleet import parse_fleet
from instaslice.planning.trace import (
    TraceRequest,
    parse_lines,
    parse_mix,
    parse_priorities,
    read_trace,
    save_trace,
    synthesize,
)


def test_a_line_with_every_field_and_the_defaults() -> None:
    requests = parse_lines(
        [
            '{"t": 12.5, "profile": "1g.5gb", "count": 2, "duration": 300.0, "name": "job"}',
            "",
            '{"t": 12.5, "profile": "7g.40gb", "duration": 1}',
        ]
    )
    assert requests == (
        TraceRequest(t=12.5, profile="1g.5gb", count=2, duration=300.0, name="job", line=1),
        TraceRequest(t=12.5, profile="7g.40gb", count=1, duration=1.0, name=None, line=3),
    )


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("[1, 2]", "line 2: expected a JSON object, got list"),
        ('{"t": 1, "profile": "1g.5gb"', "line 2: not valid JSON"),
        ('{"profile": "1g.5gb", "duration": 1}', "line 2: missing 't'"),
        ('{"t": 1, "duration": 1}', "line 2: missing 'profile'"),
        ('{"t": 1, "profile": "", "duration": 1}', "line 2: 'profile' must be a non-empty string"),
        ('{"t": "1", "profile": "1g.5gb", "duration": 1}', "line 2: 't' must be a number"),
        ('{"t": 1, "profile": "1g.5gb", "duration": -1}', "line 2: 'duration' must be a finite"),
        ('{"t": 1, "profile": "1g.5gb", "duration": 1, "count": 0}', "'count' must be an integer"),
        ('{"t": 1, "profile": "1g.5gb", "duration": 1, "count": true}', "'count' must be"),
        ('{"t": 1, "profile": "1g.5gb", "duration": 1, "name": 3}', "'name' must be a string"),
        ('{"t": 1, "profile": "1g.5gb", "duration": 1, "gpu": 3}', "unknown field(s) gpu"),
        ('{"t": 0.5, "profile": "1g.5gb", "duration": 1}', "'t' is 0.5, before the previous"),
    ],
    ids=[
        "not-an-object",
        "truncated",
        "no-t",
        "no-profile",
        "empty-profile",
        "string-t",
        "negative-duration",
        "zero-count",
        "bool-count",
        "numeric-name",
        "unknown-field",
        "time-goes-back",
    ],
)
def test_bad_lines_are_named_with_their_number(line: str, error: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_lines(['{"t": 1, "profile": "1g.5gb", "duration": 1}', line], source="my.jsonl")
    assert str(raised.value).startswith("my.jsonl line 2: ")
    assert error in str(raised.value)


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"], ids=["plain", "gzip"])
def test_save_and_read_round_trip(tmp_path: Path, name: str) -> None:
    requests = (
        TraceRequest(t=0.0, profile="1g.5gb", duration=3.25, line=1),
        TraceRequest(t=1.5, profile="2g.10gb", count=3, duration=10.0, name="x", line=2),
    )
    assert save_trace(requests, tmp_path / name) == 2
    assert read_trace(tmp_path / name) == requests


def test_reading_a_missing_or_broken_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read trace"):
        read_trace(tmp_path / "missing.jsonl")
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(ConfigError, match="cannot read trace"):
        read_trace(broken)


def test_synthesis_is_reproducible_and_offers_the_asked_load() -> None:
    fleet = parse_fleet("10x8xA100-40GB")
    mix = parse_mix("1g.5gb=3,3g.20gb=1")
    first = synthesize(fleet=fleet, mix=mix, load=0.8, events=20_000, seed=5, mean_duration=60)
    again = synthesize(fleet=fleet, mix=mix, load=0.8, events=20_000, seed=5, mean_duration=60)
    other = synthesize(fleet=fleet, mix=mix, load=0.8, events=20_000, seed=6, mean_duration=60)
    assert first == again
    assert first != other
    assert all(a.t <= b.t for a, b in itertools.pairwise(first))
    slices = {"1g.5gb": 1, "3g.20gb": 4}
    offered = sum(slices[r.profile] * r.duration for r in first) / (first[-1].t - first[0].t)
    assert offered / fleet.memory_slices == pytest.approx(0.8, rel=0.05)
    share = sum(r.profile == "3g.20gb" for r in first) / len(first)
    assert share == pytest.approx(0.25, abs=0.02)


def test_mix_entries_may_ask_several_slices_on_one_gpu() -> None:
    assert [(e.profile, e.weight, e.count) for e in parse_mix(" 1g.5gb=45, 2*1g.5gb=5 ,")] == [
        ("1g.5gb", 45.0, 1),
        ("1g.5gb", 5.0, 2),
    ]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "the mix is empty"),
        ("1g.5gb", "is not PROFILE=WEIGHT"),
        ("1g.5gb=0", "the weight must be a number > 0"),
        ("1g.5gb=many", "the weight must be a number > 0"),
        ("0*1g.5gb=1", "write N*PROFILE with N from 1 to 7"),
    ],
    ids=["empty", "no-weight", "zero-weight", "word-weight", "zero-count"],
)
def test_bad_mixes_are_named(text: str, error: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_mix(text)
    assert error in str(raised.value)


def test_synthesis_refuses_what_the_fleet_does_not_offer() -> None:
    fleet = parse_fleet("1x8xH100-80GB")
    with pytest.raises(ConfigError, match=r"mix profile .1g\.5gb. is not offered"):
        synthesize(fleet=fleet, mix=parse_mix("1g.5gb=1"), load=0.5, events=10, seed=1)
    for bad in ({"load": 0.0}, {"events": 0}, {"mean_duration": 0.0}):
        arguments = {"load": 0.5, "events": 10, "mean_duration": 1.0, **bad}
        with pytest.raises(ConfigError):
            synthesize(fleet=fleet, mix=parse_mix("1g.10gb=1"), seed=1, **arguments)  # type: ignore[arg-type]


def test_fleet_groups_name_nodes_in_order() -> None:
    fleet = parse_fleet("2x8xA100-40GB, 1x4xh100-80gb")
    assert [n.name for n in fleet.nodes] == ["node-0000", "node-0001", "node-0002"]
    assert [len(n.gpus) for n in fleet.nodes] == [8, 8, 4]
    assert fleet.nodes[2].gpus[0].model.name == "H100-80GB"
    assert (fleet.gpu_count, fleet.memory_slices) == (20, 160)
    assert fleet.text == "2x8xA100-40GB,1x4xH100-80GB"
    assert fleet.slices_of("1g.10gb") == 2  # the A100-40GB comes first
    assert fleet.slices_of("9g.1gb") is None


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "no GPUs given"),
        ("8xA100-40GB", "is not NODESxGPUSxMODEL"),
        ("0x8xA100-40GB", "nodes must be from 1 to 10,000, got 0"),
        ("1x8xA200", "unknown GPU model 'A200'"),
    ],
    ids=["empty", "two-parts", "zero-nodes", "unknown-model"],
)
def test_bad_fleets_are_named(text: str, error: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_fleet(text)
    assert error in str(raised.value)


# ------------------------------------------------------------------------------- priorities


@pytest.mark.parametrize(
    ("fields", "priority", "policy"),
    [
        ("", 0, "PreemptLowerPriority"),
        (', "priority": 1000', 1000, "PreemptLowerPriority"),
        (', "priority": -2147483648', -(2**31), "PreemptLowerPriority"),
        (', "priority": 2147483647, "preemptionPolicy": "Never"', 2**31 - 1, "Never"),
        (', "preemptionPolicy": "PreemptLowerPriority"', 0, "PreemptLowerPriority"),
    ],
    ids=["defaults", "positive", "int32-min", "int32-max-never", "explicit-policy"],
)
def test_priority_and_preemption_policy_are_read(fields: str, priority: int, policy: str) -> None:
    (request,) = parse_lines(['{"t": 1, "profile": "1g.5gb", "duration": 1' + fields + "}"])
    assert (request.priority, request.preemption_policy) == (priority, policy)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ('"priority": 2147483648', "'priority' must be from -2147483648 to 2147483647"),
        ('"priority": -2147483649', "'priority' must be from -2147483648 to 2147483647"),
        ('"priority": ' + "9" * 400, "got 99999999999999999999… (400 characters)"),
        ('"priority": 1.5', "'priority' must be an integer, got 1.5"),
        ('"priority": 1.0', "'priority' must be an integer, got 1.0"),
        ('"priority": "5"', "'priority' must be an integer, got '5'"),
        ('"priority": true', "'priority' must be an integer, got True"),
        ('"priority": null', "'priority' must be an integer, got None"),
        ('"preemptionPolicy": "never"', "'preemptionPolicy' must be PreemptLowerPriority or"),
        ('"preemptionPolicy": 0', "'preemptionPolicy' must be PreemptLowerPriority or"),
    ],
    ids=[
        "above-int32",
        "below-int32",
        "400-digits",
        "fraction",
        "float",
        "string",
        "bool",
        "null",
        "policy-case",
        "policy-number",
    ],
)
def test_bad_priorities_are_named_with_their_line(fields: str, error: str) -> None:
    lines = ['{"t": 1, "profile": "1g.5gb", "duration": 1}', "", "{"]
    lines[2] += '"t": 2, "profile": "1g.5gb", "duration": 1, ' + fields + "}"
    with pytest.raises(ConfigError) as raised:
        parse_lines(lines, source="jobs.jsonl")
    assert str(raised.value).startswith("jobs.jsonl line 3: ")
    assert error in str(raised.value)


def test_priorities_round_trip_and_defaults_stay_unwritten(tmp_path: Path) -> None:
    requests = (
        TraceRequest(t=0.0, profile="1g.5gb", duration=1.0, line=1),
        TraceRequest(t=1.0, profile="1g.5gb", duration=1.0, line=2, priority=-(2**31)),
        TraceRequest(
            t=2.0, profile="7g.40gb", duration=1.0, line=3, priority=7, preemption_policy="Never"
        ),
    )
    assert requests[0].to_json() == '{"t":0.0,"profile":"1g.5gb","duration":1.0}'
    save_trace(requests, tmp_path / "t.jsonl")
    assert read_trace(tmp_path / "t.jsonl") == requests


def test_synthetic_priorities_label_the_same_arrivals() -> None:
    fleet = parse_fleet("2x8xA100-40GB")
    mix = parse_mix("1g.5gb=3,3g.20gb=1")
    plain = synthesize(fleet=fleet, mix=mix, load=0.9, events=4000, seed=3)
    shares = parse_priorities("1000=0.2, 0=0.8,")
    ranked = synthesize(fleet=fleet, mix=mix, load=0.9, events=4000, seed=3, priorities=shares)
    assert [(r.t, r.profile, r.duration) for r in plain] == [
        (r.t, r.profile, r.duration) for r in ranked
    ]
    assert {r.priority for r in plain} == {0}
    assert {r.priority for r in ranked} == {0, 1000}
    assert sum(r.priority == 1000 for r in ranked) / len(ranked) == pytest.approx(0.2, abs=0.02)
    again = synthesize(fleet=fleet, mix=mix, load=0.9, events=4000, seed=3, priorities=shares)
    assert again == ranked


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "the priorities are empty"),
        ("1000", "is not PRIORITY=WEIGHT"),
        ("high=1", "is not PRIORITY=WEIGHT"),
        ("2147483648=1", "is not PRIORITY=WEIGHT with an integer PRIORITY from -2147483648"),
        ("5=0", "the weight must be a number > 0"),
        ("5=nan", "the weight must be a number > 0"),
        ("5=1,5=2", "priority 5 is given twice"),
    ],
    ids=["empty", "no-weight", "word", "above-int32", "zero-weight", "nan-weight", "twice"],
)
def test_bad_priority_mixes_are_named(text: str, error: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_priorities(text)
    assert error in str(raised.value)
