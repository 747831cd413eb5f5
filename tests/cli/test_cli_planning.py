"""``instaslice simulate`` and ``instaslice defrag`` end to end: trace files, and a real (local) API
server over HTTP for ``--from-cluster`` and ``defrag``."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from driver.cluster.kube import KubeClusterApi, connect
from driver.cluster.port import PODS
from driver.errors import ApiNotFoundError, TooManyRequestsError
from instaslice import cli, plancli
from instaslice.planning.trace import read_trace
from localcluster.apiserver import LocalApiServer
from tests.cli.planningcluster import populate as _populate


@pytest.fixture
def api(apiserver: LocalApiServer) -> Iterator[KubeClusterApi]:
    with connect(url=apiserver.url) as client:
        yield client


# ------------------------------------------------------------------------- simulate on files


def test_synthesize_then_replay_prints_every_policy_beside_the_floor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl.gz"
    argv = ["simulate", "--gpus", "2x8xA100-40GB", "--trace", str(trace)]
    assert cli.main([*argv, "--synthesize", "--events", "400", "--seed", "7"]) == 0
    assert len(read_trace(trace)) == 400
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line[:1].isalpha()}
    assert {"floor", "firstfit", "bestfit", "scarcity"} <= set(rows)
    for policy in ("firstfit", "bestfit", "scarcity"):
        requests, accepted, rejected = (int(x) for x in rows[policy][1:4])
        assert requests == 400
        assert accepted + rejected == 400
        assert rejected >= int(rows["floor"][3])


def test_json_output_has_the_documented_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "\n".join(
            json.dumps(line)
            for line in (
                {"t": 0, "profile": "7g.40gb", "duration": 10},
                {"t": 1, "profile": "1g.5gb", "count": 2, "duration": 10, "name": "two"},
                {"t": 11, "profile": "1g.5gb", "duration": 10},
            )
        )
        + "\n"
    )
    argv = ["simulate", "--gpus", "1x1xA100-40GB", "--trace", str(trace), "--json"]
    assert cli.main([*argv, "--policy", "firstfit"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["floor"] == {"rejected": 1}
    first = result["policies"]["firstfit"]
    assert {k: first[k] for k in ("requests", "accepted", "rejected", "stranded")} == {
        "requests": 3,
        "accepted": 2,
        "rejected": 1,
        "stranded": 0,
    }
    assert first["peak_utilization"] == 1.0
    assert 0 < first["mean_utilization"] <= 1.0


def test_queue_mode_reports_waits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"t": 0, "profile": "7g.40gb", "duration": 10}\n'
        '{"t": 2, "profile": "4g.20gb", "duration": 5}\n'
    )
    argv = ["simulate", "--gpus", "1x1xA100-40GB", "--trace", str(trace), "--json", "--queue"]
    assert cli.main([*argv, "--policy", "bestfit"]) == 0
    best = json.loads(capsys.readouterr().out)["policies"]["bestfit"]
    assert (best["accepted"], best["rejected"], best["queued"]) == (2, 0, 1)
    assert best["wait_p99_s"] == 8.0
    assert best["wait_p50_s"] == 0.0


PRIORITY_TRACE = (
    '{"t": 0, "profile": "7g.40gb", "duration": 100}\n'
    '{"t": 10, "profile": "7g.40gb", "duration": 5, "priority": 10}\n'
    '{"t": 11, "profile": "3g.20gb", "duration": 5, "priority": 10, "preemptionPolicy": "Never"}\n'
)


def test_queue_mode_reports_priorities_preemptions_and_reservations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(PRIORITY_TRACE)
    argv = ["simulate", "--gpus", "1x1xA100-40GB", "--trace", str(trace), "--queue", "--json"]
    argv += ["--policy", "firstfit", "--preemption", "--starvation-after", "1000"]
    assert cli.main(argv) == 0
    first = json.loads(capsys.readouterr().out)["policies"]["firstfit"]
    # The 7g.40gb of priority 10 evicts the one of 0 at 10; the 3g.20gb (Never) waits for it to
    # leave at 15, the evicted one for both (to 20) and runs 100 s again.
    assert (first["accepted"], first["preempted"], first["reservations"]) == (3, 1, 0)
    assert first["starvation_after_s"] == 1000.0
    assert first["largest_profile"] == "7g.40gb"
    assert (first["largest_wait_p50_s"], first["largest_wait_p99_s"]) == (0.0, 10.0)
    assert first["by_priority"] == {
        "10": {"requests": 2, "admitted": 2, "rejected": 0, "preempted": 0,
               "wait_p50_s": 0.0, "wait_p99_s": 4.0},
        "0": {"requests": 1, "admitted": 1, "rejected": 0, "preempted": 1,
              "wait_p50_s": 10.0, "wait_p99_s": 10.0},
    }  # fmt: skip


def test_the_table_gains_the_largest_profile_and_a_row_per_priority(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(PRIORITY_TRACE)
    argv = ["simulate", "--gpus", "1x1xA100-40GB", "--trace", str(trace), "--queue"]
    assert cli.main([*argv, "--policy", "bestfit", "--preemption"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("policy  "))
    assert header.split("  ")[-3:] == ["7g.40gb wait p50 s", "7g.40gb wait p99 s", "preempted"]
    by_priority = [line.split() for line in lines if line.startswith("bestfit ")][1:]
    assert by_priority == [
        ["bestfit", "10", "2", "2", "0", "0", "0.0", "4.0"],
        ["bestfit", "0", "1", "1", "0", "1", "10.0", "10.0"],
    ]
    assert any(line.startswith("preempted: running requests evicted") for line in lines)


def test_synthesized_priorities_are_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--synthesize", "--gpus", "1x8xA100-40GB", "--trace", "-"]
    assert cli.main([*argv, "--events", "200", "--priorities", "1000=1,0=3"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {line.get("priority", 0) for line in lines} == {0, 1000}


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ('{"t": 1, "profile": "1g.5gb"}', "line 2: missing 'duration'"),
        ('{"t": 0.5, "profile": "1g.5gb", "duration": 1}', "line 2: 't' is 0.5"),
        ('{"t": 2, "profile": "9g.99gb", "duration": 1}', "line 2: profile '9g.99gb' is not"),
        ("not json", "line 2: not valid JSON"),
    ],
    ids=["missing-field", "time-goes-back", "unknown-profile", "not-json"],
)
def test_a_bad_trace_line_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, error: str
) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"t": 1, "profile": "1g.5gb", "duration": 1}\n' + line + "\n")
    assert cli.main(["simulate", "--gpus", "1x8xA100-40GB", "--trace", str(trace)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("instaslice simulate: ")
    assert f"{trace} {error}" in err


def test_synthesize_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--synthesize", "--trace", "-", "--gpus", "1x8xA100-40GB"]
    assert cli.main([*argv, "--events", "5", "--mix", "3g.20gb=1", "--mean-duration", "60"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 5
    assert {line["profile"] for line in lines} == {"3g.20gb"}


def test_bad_flags_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", "--gpus", "1x8xA100-40GB"]) == 2
    assert "give --gpus and --trace (or --from-cluster)" in capsys.readouterr().err
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"t": 1, "profile": "1g.5gb", "duration": 1}\n')
    assert cli.main(["simulate", "--gpus", "8xA100", "--trace", str(trace)]) == 2
    assert "GPU group '8xA100' is not NODESxGPUSxMODEL" in capsys.readouterr().err
    argv = ["simulate", "--gpus", "1x8xA100-40GB", "--trace", str(trace), "--policy", "nope"]
    assert cli.main(argv) == 2
    assert "unknown placement policy nope" in capsys.readouterr().err


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    trace = tmp_path / "t.jsonl"
    argv = ["simulate", "--gpus", "1x8xA100-40GB", "--trace", str(trace)]
    assert cli.main([*argv, "--synthesize", "--events", "200"]) == 0
    png = tmp_path / "plot.png"
    assert cli.main([*argv, "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------- the cluster now


def test_from_cluster_counts_what_fits_now_and_checks_a_batch(
    api: KubeClusterApi, apiserver: LocalApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    _populate(api)
    argv = ["simulate", "--from-cluster", "--kube-api-url", apiserver.url, "--json"]
    assert cli.main([*argv, "--add", "3g.20gb=1,1g.5gb=3"]) == 0
    result = json.loads(capsys.readouterr().out)
    free = result["free"]
    # node-0: 1g at 0 and 6 leave 1..5 (5 x 1g, one 3g? no: 3g needs 0-3 or 4-7), node-1: 4-7 free.
    assert free["7g.40gb"] == 0
    assert free["3g.20gb"] == 1
    assert free["1g.5gb"] == 5 + 3
    assert result["add"]["fits"] is True
    # A batch that does not fit: the answer all the same, and exit status 1 saying what is left.
    assert cli.main([*argv, "--add", "3g.20gb=2"]) == 1
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["add"]["fits"] is False
    assert result["add"]["placed"] == {"3g.20gb": 1}
    assert captured.err == (
        "instaslice simulate: --add does not fit now: no room for 1 of 2 x 3g.20gb\n"
    )
    assert cli.main([*argv[:-1], "--add", "1g.10gb=2"]) == 0
    assert "2 x 1g.10gb: fits now" in capsys.readouterr().out
    # 4g.20gb starts only at 0, taken on both GPUs.
    assert cli.main([*argv[:-1], "--add", "4g.20gb=1"]) == 1
    assert "1 x 4g.20gb: does not fit now; firstfit, largest first, placed 0 of 1" in (
        capsys.readouterr().out
    )


def test_from_cluster_names_an_unpublished_profile(
    api: KubeClusterApi, apiserver: LocalApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    _populate(api)
    argv = ["simulate", "--from-cluster", "--kube-api-url", apiserver.url, "--add", "9g.1gb=1"]
    assert cli.main(argv) == 1
    assert "no node publishes MIG profile(s) 9g.1gb" in capsys.readouterr().err


# ------------------------------------------------------------------------- defrag


def test_defrag_prints_the_plan_and_changes_nothing(
    api: KubeClusterApi, apiserver: LocalApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    _populate(api)
    argv = ["defrag", "--profile", "7g.40gb", "--kube-api-url", apiserver.url]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "To fit 1 x 7g.40gb (node-0 GPU 0 start 0), move 2 pods:" in out
    assert "default/a  1g.5gb  node-0 GPU 0 start 0  ->  node-1 GPU 0 start" in out
    assert "default/b  1g.5gb  node-0 GPU 0 start 6  ->  node-1 GPU 0 start" in out
    assert "Nothing was changed" in out
    assert len(api.list_objects(PODS, namespace="default").items) == 3


def test_defrag_apply_evicts_after_confirmation(
    api: KubeClusterApi, apiserver: LocalApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    _populate(api)
    args = cli.build_parser().parse_args(
        ["defrag", "--profile", "4g.20gb", "--kube-api-url", apiserver.url, "--apply"]
    )
    out = io.StringIO()
    assert plancli.run_defrag(args, out=out, confirm=lambda _: "n") == 1
    assert len(api.list_objects(PODS, namespace="default").items) == 3
    asked: list[str] = []

    def confirm_yes(question: str) -> str:
        asked.append(question)
        return "y"

    assert plancli.run_defrag(args, out=out, confirm=confirm_yes) == 0
    assert asked == ["Evict 1 pod(s)? [y/N] "]
    assert "default/a: evicted" in out.getvalue()
    remaining = {p["metadata"]["name"] for p in api.list_objects(PODS, namespace="default").items}
    assert remaining == {"b", "c"}


class _BudgetedApi:
    """The real client, except that a PodDisruptionBudget refuses evicting ``protected``."""

    def __init__(self, inner: KubeClusterApi, protected: str) -> None:
        self._inner = inner
        self._protected = protected

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def evict(self, *, name: str, namespace: str, uid: str | None = None) -> None:
        if name == self._protected:
            raise TooManyRequestsError(
                "POST …/eviction: 429 TooManyRequests: Cannot evict pod as it would violate "
                "the pod's disruption budget."
            )
        self._inner.evict(name=name, namespace=namespace, uid=uid)

    def __enter__(self) -> _BudgetedApi:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        pass


def test_a_disruption_budget_refusal_is_reported_per_pod(
    api: KubeClusterApi, apiserver: LocalApiServer
) -> None:
    _populate(api)
    args = cli.build_parser().parse_args(
        ["defrag", "--profile", "7g.40gb", "--kube-api-url", apiserver.url, "--apply", "--yes"]
    )
    out = io.StringIO()
    budgeted = _BudgetedApi(api, protected="a")
    assert plancli.run_defrag(args, out=out, connect=lambda _: budgeted) == 1
    assert "default/a: not evicted, a PodDisruptionBudget refuses now" in out.getvalue()
    assert "default/b: evicted" in out.getvalue()
    remaining = {p["metadata"]["name"] for p in api.list_objects(PODS, namespace="default").items}
    assert remaining == {"a", "c"}


def test_evicting_a_missing_pod_is_not_found(api: KubeClusterApi) -> None:
    with pytest.raises(ApiNotFoundError):
        api.evict(name="ghost", namespace="default")


def test_defrag_when_it_fits_already_and_when_nothing_can_help(
    api: KubeClusterApi, apiserver: LocalApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    _populate(api)
    base = ["defrag", "--kube-api-url", apiserver.url, "--profile"]
    assert cli.main([*base, "1g.5gb"]) == 0
    assert "nothing has to move, it fits now" in capsys.readouterr().out
    assert cli.main([*base, "7g.40gb", "--count", "2"]) == 1
    assert "no set of pods can be moved so that 2 x 7g.40gb fit" in capsys.readouterr().err
    assert cli.main([*base, "2g.20gb"]) == 1
    assert "no node publishes MIG profile 2g.20gb" in capsys.readouterr().err
