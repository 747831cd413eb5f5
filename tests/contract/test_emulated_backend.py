"""What only the emulated backend has: its GPU spec, deterministic ids, state file and fault hook."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from driver.errors import BackendError, ConfigError
from driver.gpu import caps
from driver.gpu.emulated import (
    FAULT_STEPS,
    EmulatedGpuBackend,
    emulated_gpu_uuid,
    emulated_mig_uuid,
    parse_gpu_spec,
)
from driver.mig.catalog import CATALOG
from tests.contract.conftest import InjectedFaultError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("2xA100-40GB,1xH100-80GB", ["A100-40GB", "A100-40GB", "H100-80GB"]),
        ("a30-24gb", ["A30-24GB"]),
        (" 2 x H200-141GB , B200-180GB ", ["H200-141GB", "H200-141GB", "B200-180GB"]),
        ("1XA100-80GB", ["A100-80GB"]),
    ],
    ids=["counts", "no-count-lower-case", "spaces", "capital-x"],
)
def test_gpu_spec_is_parsed_in_index_order(spec: str, expected: list[str]) -> None:
    assert [m.name for m in parse_gpu_spec(spec)] == expected


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("2xA100-40GB,", "''"),
        ("0xA100-40GB", "'0xA100-40GB'"),
        ("2xV100-16GB", "'2xV100-16GB'"),
        ("2*A100-40GB", "'2\\*A100-40GB'"),
        ("A100-40GB;H100-80GB", "'A100-40GB;H100-80GB'"),
        ("65xA100-40GB", "65 GPUs"),
    ],
    ids=["empty", "blank", "trailing-comma", "zero", "unknown-model", "bad-separator",
         "semicolon", "too-many"],
)  # fmt: skip
def test_malformed_gpu_spec_is_a_config_error_naming_the_part(spec: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        parse_gpu_spec(spec)


def test_backend_needs_a_node_name_and_gpus() -> None:
    with pytest.raises(ConfigError, match="node name"):
        EmulatedGpuBackend(node_name="", spec="A100-40GB")
    with pytest.raises(ConfigError, match="at least one GPU"):
        EmulatedGpuBackend(node_name="n", spec=())


def test_uuids_are_deterministic_per_node_gpu_and_slice() -> None:
    one = EmulatedGpuBackend(node_name="node-a", spec="2xA100-40GB")
    same = EmulatedGpuBackend(node_name="node-a", spec=(CATALOG["A100-40GB"],) * 2)
    other = EmulatedGpuBackend(node_name="node-b", spec="2xA100-40GB")
    assert [g.uuid for g in one.gpus()] == [g.uuid for g in same.gpus()]
    assert len({g.uuid for g in (*one.gpus(), *other.gpus())}) == 4
    made = one.create_slice(gpu_index=1, profile="2g.10gb", start=2)
    again = same.create_slice(gpu_index=1, profile="2g.10gb", start=2)
    elsewhere = other.create_slice(gpu_index=1, profile="2g.10gb", start=2)
    assert made.mig_uuid == again.mig_uuid
    assert made.mig_uuid != elsewhere.mig_uuid
    assert made.mig_uuid == emulated_mig_uuid(
        node_name="node-a", gpu_index=1, profile="2g.10gb", start=2, gi_id=made.gi_id
    )
    assert made.gpu_uuid == emulated_gpu_uuid(node_name="node-a", gpu_index=1)


def test_emulated_usage_is_a_fixed_fraction_of_the_slices_memory_per_mig_uuid(
    tmp_path: Path,
) -> None:
    state = tmp_path / "gpus.json"
    backend = EmulatedGpuBackend(node_name="n", spec="A100-40GB", state_file=state)
    made = [backend.create_slice(gpu_index=0, profile="1g.5gb", start=s) for s in range(7)]
    total = CATALOG["A100-40GB"].profile("1g.5gb").memory_bytes
    used = []
    for instance in made:
        assert instance.mig_uuid is not None
        usage = backend.slice_usage(mig_uuid=instance.mig_uuid)
        assert usage.memory_total_bytes == total
        assert total // 8 <= usage.memory_used_bytes <= total * 6 // 8
        used.append(usage.memory_used_bytes)
    assert len(set(used)) > 1
    again = EmulatedGpuBackend(node_name="n", spec="A100-40GB", state_file=state)
    assert [
        again.slice_usage(mig_uuid=i.mig_uuid).memory_used_bytes for i in made if i.mig_uuid
    ] == used


def test_instances_carry_the_driver_layouts_capability_minors() -> None:
    backend = EmulatedGpuBackend(node_name="n", spec="2xA100-40GB")
    made = backend.create_slice(gpu_index=1, profile="1g.5gb", start=0)
    table = caps.parse_mig_minors(caps.layout_text(gpu_count=2))
    assert made.gi_cap_minor == table[f"gpu1/gi{made.gi_id}/access"]
    assert made.ci_cap_minor == table[f"gpu1/gi{made.gi_id}/ci0/access"]


# -- the state file -----------------------------------------------------------------------------


def test_state_file_is_json_naming_node_gpus_and_instances(tmp_path: Path) -> None:
    state = tmp_path / "gpus.json"
    backend = EmulatedGpuBackend(node_name="n", spec="A100-40GB", state_file=state)
    made = backend.create_slice(gpu_index=0, profile="3g.20gb", start=4)
    document = json.loads(state.read_text())
    assert document == {
        "version": 1,
        "node": "n",
        "gpus": ["A100-40GB"],
        "instances": [{"gpu": 0, "profile": "3g.20gb", "start": 4, "gi": made.gi_id, "ci": 0}],
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpus.json", "gpus.json.lock"]


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("{not json", "corrupt"),
        ('{"version": 2, "node": "n", "gpus": ["A100-40GB"], "instances": []}', "version 1"),
        ('{"version": 1, "node": "n", "gpus": ["A100-40GB"]}', "corrupt"),
        ('{"version": 1, "node": "n", "gpus": ["A100-40GB"], "instances": [{"gpu": 0}]}',
         "corrupt"),
        ('{"version": 1, "node": "n", "gpus": ["A100-40GB"], "instances": '
         '[{"gpu": 0, "profile": "1g.5gb", "start": -1, "gi": 1, "ci": 0}]}', "non-negative"),
        ('{"version": 1, "node": "other", "gpus": ["A100-40GB"], "instances": []}',
         "node 'other'"),
        ('{"version": 1, "node": "n", "gpus": ["H100-80GB"], "instances": []}', "H100-80GB"),
        ('{"version": 1, "node": "n", "gpus": ["A100-40GB"], "instances": '
         '[{"gpu": 0, "profile": "1g.5gb", "start": 7, "gi": 1, "ci": 0}]}', "start 7"),
        ('{"version": 1, "node": "n", "gpus": ["A100-40GB"], "instances": '
         '[{"gpu": 0, "profile": "1g.5gb", "start": 1, "gi": 1, "ci": 0}, '
         '{"gpu": 0, "profile": "1g.5gb", "start": 2, "gi": 1, "ci": 0}]}', "twice"),
    ],
    ids=["not-json", "wrong-version", "no-instances", "instance-fields-missing",
         "negative-start", "other-node", "other-gpus", "impossible-start", "duplicate-gi"],
)  # fmt: skip
def test_a_bad_state_file_is_a_config_error_naming_it(
    tmp_path: Path, content: str, named: str
) -> None:
    state = tmp_path / "gpus.json"
    state.write_text(content)
    with pytest.raises(ConfigError, match=named) as caught:
        EmulatedGpuBackend(node_name="n", spec="A100-40GB", state_file=state)
    assert str(state) in str(caught.value)


def test_a_binary_state_file_is_a_config_error_naming_it(tmp_path: Path) -> None:
    state = tmp_path / "gpus.json"
    state.write_bytes(b"\x93\xff\x00 not text")
    with pytest.raises(ConfigError, match=f"corrupt state file {state}: not UTF-8 JSON"):
        EmulatedGpuBackend(node_name="n", spec="A100-40GB", state_file=state)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_state_file_that_cannot_be_written_is_a_backend_error(tmp_path: Path) -> None:
    state = tmp_path / "gpus.json"
    backend = EmulatedGpuBackend(node_name="n", spec="A100-40GB", state_file=state)
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(BackendError, match=str(state)):
            backend.create_slice(gpu_index=0, profile="1g.5gb", start=0)
    finally:
        tmp_path.chmod(0o700)
    assert backend.instances() == ()


def test_two_processes_on_one_state_file_never_double_create(tmp_path: Path) -> None:
    state = tmp_path / "gpus.json"
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from driver.errors import PlacementOccupiedError
        from driver.gpu.emulated import EmulatedGpuBackend
        backend = EmulatedGpuBackend(node_name="n", spec="A100-40GB", state_file=Path({str(state)!r}))
        made = 0
        for start in range(7):
            try:
                backend.create_slice(gpu_index=0, profile="1g.5gb", start=start)
                made += 1
            except PlacementOccupiedError:
                pass
        print(made)
        """
    )
    processes = [
        subprocess.Popen(  # the two processes race for the same seven placements
            [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=60)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0]
    assert sum(int(out) for out in outputs) == 7
    backend = EmulatedGpuBackend(node_name="n", spec="A100-40GB", state_file=state)
    assert sorted(i.placement.start for i in backend.instances()) == list(range(7))


# -- the fault hook ----------------------------------------------------------------------------


def test_fault_hook_sees_every_step_in_order() -> None:
    seen: list[str] = []
    backend = EmulatedGpuBackend(node_name="n", spec="A100-40GB", fault_hook=seen.append)
    backend.create_slice(gpu_index=0, profile="1g.5gb", start=0)
    assert tuple(seen) == FAULT_STEPS


@pytest.mark.parametrize(
    ("step", "left_behind"),
    [("before-gi", None), ("after-gi", "gi-only"), ("after-ci", "complete")],
    ids=["before-gi", "after-gi", "after-ci"],
)
def test_a_crash_leaves_the_state_as_saved_so_far(
    tmp_path: Path, step: str, left_behind: str | None
) -> None:
    state = tmp_path / "gpus.json"

    def crash(at: str) -> None:
        if at == step:
            raise InjectedFaultError(at)

    crashing = EmulatedGpuBackend(
        node_name="n", spec="A100-40GB", state_file=state, fault_hook=crash
    )
    with pytest.raises(InjectedFaultError):
        crashing.create_slice(gpu_index=0, profile="2g.10gb", start=4)
    restarted = EmulatedGpuBackend(node_name="n", spec="A100-40GB", state_file=state)
    found = restarted.instances()
    if left_behind is None:
        assert found == ()
        return
    (instance,) = found
    assert (instance.profile, instance.placement.start) == ("2g.10gb", 4)
    assert instance.complete == (left_behind == "complete")
    if left_behind == "gi-only":
        assert (instance.ci_id, instance.mig_uuid, instance.ci_cap_minor) == (None, None, None)
    with pytest.raises(BackendError):  # the half-created GI still holds its memory slices
        restarted.create_slice(gpu_index=0, profile="2g.10gb", start=4)
    restarted.destroy_slice(gpu_index=0, gi_id=instance.gi_id)
    assert restarted.instances() == ()


def test_a_state_file_that_cannot_be_read_is_a_backend_error(tmp_path: Path) -> None:
    state = tmp_path / "gpus.json"
    state.mkdir()
    with pytest.raises(BackendError, match=f"cannot read state file {state}"):
        EmulatedGpuBackend(node_name="n", spec="A100-40GB", state_file=state)
