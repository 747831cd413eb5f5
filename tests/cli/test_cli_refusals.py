"""Every input ``instaslice`` cannot use is refused before any work, in one line naming the problem,
with a non-zero exit status: 2 when the command line itself is wrong, 1 when a file or the cluster
it names cannot be used.

Each table row is one input a user tried (or one close to it); ``{name}`` in an argument stands for
a file the ``files`` fixture made. The cases that need a cluster talk to a local API server."""

from __future__ import annotations

import gzip
import io
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from pathlib import Path

import pytest
from _pytest.capture import CaptureResult

from driver.cluster.kube import KubeClusterApi, connect
from driver.cluster.port import NODES
from instaslice import cli, plancli
from instaslice.planning.defrag import DefragPlan, plan_defrag
from instaslice.planning.fleet import parse_fleet
from localcluster import demo
from localcluster.apiserver import LocalApiServer
from tests.cli.planningcluster import populate
from tests.planning.test_defrag import _engine, _hold

OK_LINE = '{"t": 0, "profile": "1g.5gb", "duration": 1}\n'
GPUS = ["--gpus", "1x8xA100-40GB"]

# -------------------------------------------------------------------------------------- files

TEXT_FILES = {
    "ok.jsonl": OK_LINE,
    "count-1e12.jsonl": '{"t": 0, "profile": "1g.5gb", "count": 1000000000000, "duration": 1}\n',
    "count-1e8.jsonl": '{"t": 0, "profile": "1g.5gb", "count": 1e8, "duration": 1}\n',
    "count-8.jsonl": '{"t": 0, "profile": "1g.5gb", "count": 8, "duration": 1}\n',
    "count-4x2g.jsonl": '{"t": 0, "profile": "2g.10gb", "count": 4, "duration": 1}\n',
    "not-object.jsonl": OK_LINE + "[1, 2]\n",
    "string.jsonl": OK_LINE + '"just a string"\n',
    "wrong-type.jsonl": '{"t": "soon", "profile": "1g.5gb", "duration": 1}\n',
    "profile-number.jsonl": '{"t": 0, "profile": 7, "duration": 1}\n',
    "nan.jsonl": '{"t": NaN, "profile": "1g.5gb", "duration": 1}\n',
    "inf.jsonl": '{"t": 0, "profile": "1g.5gb", "duration": Infinity}\n',
    "huge-int.jsonl": '{"t": 1' + "0" * 400 + ', "profile": "1g.5gb", "duration": 1}\n',
    "too-late.jsonl": '{"t": 2e12, "profile": "1g.5gb", "duration": 1}\n',
    "negative.jsonl": '{"t": -1, "profile": "1g.5gb", "duration": 1}\n',
    "unknown-profile.jsonl": '{"t": 0, "profile": "9g.99gb", "duration": 1}\n',
    "long-line.jsonl": '{"t": 0, "profile": "1g.5gb", "duration": 1, "name": "'
    + "x" * 5000
    + '"}\n',
    "deep.jsonl": "[" * 2000 + "]" * 2000 + "\n",
    "empty.jsonl": "",
    "kubeconfig-list.yaml": "- a\n- b\n",
    "kubeconfig-broken.yaml": "apiVersion: v1\nclusters: [\n",
    "kubeconfig-int.yaml": "clusters: 5\n",
    "kubeconfig-context-int.yaml": "contexts: [{name: c, context: 7}]\ncurrent-context: c\n",
    "kubeconfig-no-url.yaml": (
        "clusters: [{name: x, cluster: {server: notaurl}}]\n"
        "contexts: [{name: c, context: {cluster: x, user: u}}]\n"
        "current-context: c\nusers: [{name: u, user: {}}]\n"
    ),
    "checkpoint-bad.json": '{"claims": [1, 2',
}


def _gzip(data: bytes, *, level: int = 6) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=level, mtime=0) as packed:
        packed.write(data)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every file of the tables, made once per module (the tests only read them)."""
    tmp_path = tmp_path_factory.mktemp("inputs")
    made = {}
    for name, text in TEXT_FILES.items():
        (tmp_path / name).write_text(text)
        made[name] = str(tmp_path / name)
    whole = _gzip(OK_LINE.encode() * 200)
    binary = {
        "not-utf8.jsonl": b'{"t": 0, "profile": "\xff\xfe", "duration": 1}\n',
        "corrupt.jsonl.gz": os.urandom(64),
        "truncated.jsonl.gz": whole[: len(whole) // 2],
        "bad-crc.jsonl.gz": whole[:-8] + bytes(8),
        # gzip bombs: a small file that unpacks into more lines, or more bytes, than a trace holds
        "lines-bomb.jsonl.gz": _gzip(b"\n" * 1_000_100, level=1),
        "bytes-bomb.jsonl.gz": _gzip((b" " * 4095 + b"\n") * 66 * 1024, level=1),
        "big-kubeconfig.yaml": b"#" * (5 * 1024 * 1024),
    }
    for name, data in binary.items():
        (tmp_path / name).write_bytes(data)
        made[name] = str(tmp_path / name)
    long_trace = "".join(
        f'{{"t": {i}, "profile": "1g.5gb", "duration": 1}}\n' for i in range(50_001)
    )
    (tmp_path / "50001-requests.jsonl").write_text(long_trace)
    made["50001-requests.jsonl"] = str(tmp_path / "50001-requests.jsonl")
    (tmp_path / "folder").mkdir()
    made["folder"] = str(tmp_path / "folder")
    os.mkfifo(tmp_path / "fifo")
    made["fifo"] = str(tmp_path / "fifo")
    made["missing"] = str(tmp_path / "missing.json")
    made["missing-dir/plot.png"] = str(tmp_path / "missing-dir" / "plot.png")
    return made


def _run(argv: Sequence[str], *, main: Callable[[list[str]], int] = cli.main) -> int:
    try:
        return main(list(argv))
    except SystemExit as exc:  # argparse's refusals
        return exc.code if isinstance(exc.code, int) else 1


def _assert_refused(
    captured: CaptureResult[str], code: int, status: int, words: str, *, work: bool = False
) -> None:
    lines = captured.err.splitlines()
    assert code == status, captured.err
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    assert words in lines[0]
    if not work:
        assert captured.out == ""


# ----------------------------------------------------------------------------- simulate: traces

TRACE_CASES = [
    ("count-1e12", "count-1e12.jsonl", "'count' is 1000000000000, but the slices of one request"),
    ("count-1e8", "count-1e8.jsonl", "'count' must be an integer >= 1, got 100000000.0"),
    ("count-over-any-gpu", "count-8.jsonl", "no GPU holds more than 7 MIG instances"),
    ("count-over-this-fleet", "count-4x2g.jsonl", "4 x 2g.10gb cannot share one GPU"),
    ("not-an-object", "not-object.jsonl", "line 2: expected a JSON object, got list"),
    ("a-string", "string.jsonl", "line 2: expected a JSON object, got str"),
    ("wrong-type", "wrong-type.jsonl", "line 1: 't' must be a number, got 'soon'"),
    ("profile-not-a-string", "profile-number.jsonl", "'profile' must be a non-empty string"),
    ("nan", "nan.jsonl", "'t' must be a finite number of seconds from 0 to 1e+12, got nan"),
    ("inf", "inf.jsonl", "'duration' must be a finite number of seconds"),
    ("400-digit-time", "huge-int.jsonl", "'t' must be a finite number of seconds"),
    ("past-1e12-s", "too-late.jsonl", "got 2000000000000.0"),
    ("negative-time", "negative.jsonl", "'t' must be a finite number of seconds from 0"),
    ("unknown-profile", "unknown-profile.jsonl", "profile '9g.99gb' is not offered"),
    ("line-too-long", "long-line.jsonl", "line 1: longer than 4,096 bytes"),
    ("nested-deep", "deep.jsonl", "deep.jsonl line 1: "),  # JSON error or not an object
    ("not-utf8", "not-utf8.jsonl", "line 1: not UTF-8 text"),
    ("no-requests", "empty.jsonl", "has no requests"),
    ("corrupt-gzip", "corrupt.jsonl.gz", "cannot read trace"),
    ("truncated-gzip", "truncated.jsonl.gz", "cannot read trace"),
    ("bad-crc-gzip", "bad-crc.jsonl.gz", "cannot read trace"),
    ("gzip-bomb-of-lines", "lines-bomb.jsonl.gz", "more than 1,000,000 lines"),
    ("gzip-bomb-of-bytes", "bytes-bomb.jsonl.gz", "longer than 256 MiB (decompressed)"),
    ("a-directory", "folder", "it is a directory"),
    ("a-fifo", "fifo", "it is not a regular file"),
    ("missing", "missing", "No such file or directory"),
]


@pytest.mark.parametrize(
    ("trace", "words"), [c[1:] for c in TRACE_CASES], ids=[c[0] for c in TRACE_CASES]
)
def test_a_trace_that_cannot_be_replayed_is_refused_in_one_line(
    files: dict[str, str], capsys: pytest.CaptureFixture[str], trace: str, words: str
) -> None:
    code = _run(["simulate", "--trace", files[trace], *GPUS])
    _assert_refused(capsys.readouterr(), code, 1, words)


@pytest.mark.parametrize(
    "path", ["/dev/zero", "/proc/self/mem"], ids=["endless-device", "unreadable-file"]
)
def test_a_device_or_unreadable_file_is_refused(
    capsys: pytest.CaptureFixture[str], path: str
) -> None:
    code = _run(["simulate", "--trace", path, *GPUS])
    _assert_refused(capsys.readouterr(), code, 1, f"cannot read trace {path}")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_a_file_without_read_permission_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "locked.jsonl"
    trace.write_text(OK_LINE)
    trace.chmod(0)
    code = _run(["simulate", "--trace", str(trace), *GPUS])
    _assert_refused(capsys.readouterr(), code, 1, "Permission denied")


# ------------------------------------------------------------------------------ simulate: flags

SIMULATE_FLAG_CASES = [
    ("nodes-past-limit", ["--gpus", "99999999999x8xA100-40GB"], 2, "nodes must be from 1 to 10,000"),
    ("nodes-5000-digits", ["--gpus", "9" * 5000 + "x8xA100-40GB"], 2, "(5000 digits)"),
    ("gpus-per-node", ["--gpus", "1x99xA100-40GB"], 2, "GPUs per node must be from 1 to 16"),
    ("gpus-in-all", ["--gpus", "9000x16xA100-40GB"], 2, "the fleet has 144,000 GPUs"),
    ("add-without-from-cluster", ["--add", "1g.5gb=1"], 2,
     "--add applies with --from-cluster, not when replaying a trace"),
    ("mix-without-synthesize", ["--mix", "1g.5gb=1"], 2,
     "--mix applies with --synthesize, not when replaying a trace"),
    ("events-without-synthesize", ["--events", "10"], 2, "--events applies with --synthesize"),
    ("url-without-from-cluster", ["--kube-api-url", "http://127.0.0.1:1"], 2,
     "--kube-api-url applies with --from-cluster"),
    ("two-modes", ["--synthesize", "--from-cluster"], 2, "two modes; give one"),
    ("defrag-moves-past-limit", ["--defrag-on-reject", "99999"], 2, "at most 10,000"),
    ("plot-in-a-missing-folder", ["--plot", "{missing-dir/plot.png}"], 1, "does not exist"),
    ("plot-onto-a-folder", ["--plot", "{folder}"], 1, "is a directory"),
    ("preemption-without-queue", ["--preemption"], 2, "--preemption needs --queue"),
    ("starvation-without-queue", ["--starvation-after", "60"], 2,
     "--starvation-after needs --queue"),
    ("starvation-after-zero", ["--queue", "--starvation-after", "0"], 2,
     "--starvation-after: must be more than 0 and at most 1e+12"),
    ("starvation-after-nan", ["--queue", "--starvation-after", "nan"], 2, "must be more than 0"),
    ("priorities-without-synthesize", ["--priorities", "1=1"], 2,
     "--priorities applies with --synthesize, not when replaying a trace"),
]  # fmt: skip


def _filled(argv: Sequence[str], files: dict[str, str]) -> list[str]:
    return [files[a[1:-1]] if a.startswith("{") and a.endswith("}") else a for a in argv]


@pytest.mark.parametrize(
    ("argv", "status", "words"),
    [c[1:] for c in SIMULATE_FLAG_CASES],
    ids=[c[0] for c in SIMULATE_FLAG_CASES],
)
def test_a_simulate_flag_that_cannot_be_used_is_refused(
    files: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    status: int,
    words: str,
) -> None:
    code = _run(["simulate", "--trace", files["ok.jsonl"], *GPUS, *_filled(argv, files)])
    _assert_refused(capsys.readouterr(), code, status, words)


SYNTHESIS_CASES = [
    ("events-past-limit", ["--events", "100000000"], 2, "--events: must be from 1 to 1,000,000"),
    ("no-events", ["--events", "0"], 2, "--events: must be from 1 to 1,000,000, got 0"),
    ("events-not-a-number", ["--events", "many"], 2, "--events: an integer expected"),
    ("load-zero", ["--load", "0"], 2, "--load: must be more than 0 and at most 10"),
    ("load-nan", ["--load", "nan"], 2, "--load: must be more than 0 and at most 10"),
    ("duration-inf", ["--mean-duration", "inf"], 2, "--mean-duration: must be more than 0"),
    ("mix-count-past-any-gpu", ["--mix", "8*1g.5gb=1"], 2, "N from 1 to 7"),
    ("mix-count-past-the-fleet", ["--mix", "4*2g.10gb=1"], 2, "a GPU of the fleet holds at most 3"),
    ("mix-weight-inf", ["--mix", "1g.5gb=inf"], 2, "the weight must be a number > 0"),
    ("queue-with-synthesize", ["--queue"], 2, "--queue applies when replaying a trace, not with --synthesize"),
    ("preemption-with-synthesize", ["--preemption"], 2, "--preemption applies when replaying a trace"),
    ("priority-past-int32", ["--priorities", "2147483648=1"], 2, "an integer PRIORITY from -2147483648"),
    ("priority-weight-zero", ["--priorities", "0=0"], 2, "the weight must be a number > 0"),
    ("to-a-fifo-nobody-reads", ["--trace", "{fifo}"], 1, "nothing reads that FIFO"),
    ("load-too-low-for-the-limits", ["--load", "1e-300"], 2, "would arrive over more than 1e+12 s"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "status", "words"),
    [c[1:] for c in SYNTHESIS_CASES],
    ids=[c[0] for c in SYNTHESIS_CASES],
)
def test_a_synthesis_that_cannot_be_made_is_refused(
    files: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    argv: list[str],
    status: int,
    words: str,
) -> None:
    target = ["--trace", str(tmp_path / "out.jsonl")]
    code = _run(["simulate", "--synthesize", *target, *GPUS, *_filled(argv, files)])
    _assert_refused(capsys.readouterr(), code, status, words)
    assert not (tmp_path / "out.jsonl").exists()


REPLAY_SIZE_CASES = [
    ("request-gpus", ["--gpus", "6250x16xA100-40GB"], "5,000,100,000 request-GPUs to replay"),
    ("defrag-requests", [*GPUS, "--defrag-on-reject", "1"],
     "with --defrag-on-reject a trace holds at most 50,000 requests"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "words"), [c[1:] for c in REPLAY_SIZE_CASES], ids=[c[0] for c in REPLAY_SIZE_CASES]
)
def test_a_replay_that_would_run_for_hours_is_refused(
    files: dict[str, str], capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    code = _run(["simulate", "--trace", files["50001-requests.jsonl"], *argv])
    _assert_refused(capsys.readouterr(), code, 1, words)


# ---------------------------------------------------------------------------- simulate: output


def test_plot_without_matplotlib_keeps_the_table_and_says_so_in_one_line(
    files: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # make install installs matplotlib; None in sys.modules is how Python spells "not installed"
    # for find_spec and import alike.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code = _run(
        ["simulate", "--trace", files["ok.jsonl"], *GPUS, "--plot", str(tmp_path / "p.png")]
    )
    captured = capsys.readouterr()
    _assert_refused(captured, code, 1, "--plot needs matplotlib: run `make install`", work=True)
    assert captured.out.splitlines()[1].startswith("policy ")


def test_plot_says_where_it_wrote_after_the_table(
    files: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    assert _run(["simulate", "--trace", files["ok.jsonl"], *GPUS, "--plot", str(png)]) == 0
    captured = capsys.readouterr()
    assert captured.err == f"instaslice simulate: wrote the plot to {png}\n"
    assert captured.out.splitlines()[1].startswith("policy ")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_plot_in_a_format_matplotlib_cannot_write_is_refused_before_the_replay(
    files: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    code = _run(
        ["simulate", "--trace", files["ok.jsonl"], *GPUS, "--plot", str(tmp_path / "x.txt")]
    )
    _assert_refused(capsys.readouterr(), code, 1, "matplotlib writes images named")


BEATS_THE_FLOOR = [
    # 4g.20gb fits only at start 0: once the 3g.20gb at 4 leaves, the fluid floor admits the second
    # 4g (4 slices free in all) and then has no room for the two 1g.10gb; a policy cannot place
    # that 4g and places both 1g.10gb instead.
    {"t": 0, "profile": "4g.20gb", "duration": 100},
    {"t": 1, "profile": "3g.20gb", "duration": 10},
    {"t": 12, "profile": "4g.20gb", "duration": 100},
    {"t": 13, "profile": "1g.10gb", "duration": 100},
    {"t": 14, "profile": "1g.10gb", "duration": 100},
]


def test_a_policy_below_the_floor_is_explained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "beat.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in BEATS_THE_FLOOR))
    argv = ["simulate", "--trace", str(trace), "--gpus", "1x1xA100-40GB", "--policy", "firstfit"]
    assert _run(argv) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("firstfit"))
    assert row[3:5] == ["1", "-1"]
    assert "It is a lower bound only while the fleet keeps up" in out
    assert "below the floor: firstfit ('above floor' negative)" in out


def test_version_comes_from_the_installed_package(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--version"]) == 0
    assert capsys.readouterr().out == f"instaslice {metadata.version('instaslice')}\n"


# ---------------------------------------------------------------------------------- status

STATUS_CASES = [
    ("watch-negative", ["--watch=-1"], 2, "--watch: must be from 0.5 to 3600, got -1"),
    ("watch-zero-busy-loop", ["--watch", "0"], 2, "--watch: must be from 0.5 to 3600, got 0"),
    ("watch-nan", ["--watch", "nan"], 2, "--watch: must be from 0.5"),
    ("watch-inf", ["--watch", "inf"], 2, "--watch: must be from 0.5"),
    ("url-not-a-url", ["--kube-api-url", "notaurl"], 2, "API server URL 'notaurl' is not http(s)"),
    ("url-other-scheme", ["--kube-api-url", "ftp://x"], 2, "is not http(s)://HOST[:PORT]"),
    ("url-bad-port", ["--kube-api-url", "http://127.0.0.1:99999"], 2, "is not valid"),
    ("url-no-host", ["--kube-api-url", "http://"], 2, "is not http(s)://HOST[:PORT]"),
    ("url-and-kubeconfig", ["--kube-api-url", "http://x", "--kubeconfig", "{ok.jsonl}"], 2,
     "do not combine"),
    ("kubeconfig-a-list", ["--kubeconfig", "{kubeconfig-list.yaml}"], 1, "malformed kubeconfig"),
    ("kubeconfig-broken-yaml", ["--kubeconfig", "{kubeconfig-broken.yaml}"], 1,
     "cannot load Kubernetes client configuration"),
    ("kubeconfig-number", ["--kubeconfig", "{kubeconfig-int.yaml}"], 1, "malformed kubeconfig"),
    ("kubeconfig-context-number", ["--kubeconfig", "{kubeconfig-context-int.yaml}"], 1,
     "malformed kubeconfig"),
    ("kubeconfig-server-not-a-url", ["--kubeconfig", "{kubeconfig-no-url.yaml}"], 1,
     "API server URL 'notaurl'"),
    ("kubeconfig-missing", ["--kubeconfig", "{missing}"], 1, "No such file or directory"),
    ("kubeconfig-fifo", ["--kubeconfig", "{fifo}"], 1, "it is not a regular file"),
    ("kubeconfig-device", ["--kubeconfig", "/dev/zero"], 1, "it is not a regular file"),
    ("kubeconfig-huge", ["--kubeconfig", "{big-kubeconfig.yaml}"], 1, "at most 4,194,304"),
    ("checkpoint-missing", ["--checkpoint", "/nonexistent.json"], 1,
     "cannot read checkpoint /nonexistent.json: No such file or directory"),
    ("checkpoint-folder", ["--checkpoint", "{folder}"], 1, "it is a directory"),
    ("checkpoint-fifo", ["--checkpoint", "{fifo}"], 1, "it is not a regular file"),
    ("checkpoint-not-json", ["--checkpoint", "{checkpoint-bad.json}"], 1, "is unusable"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "status", "words"),
    [c[1:] for c in STATUS_CASES],
    ids=[c[0] for c in STATUS_CASES],
)
def test_status_refuses_what_it_cannot_use_before_reading_the_cluster(
    files: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    status: int,
    words: str,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    url = [] if any(a.startswith("--kube") for a in argv) else ["--kube-api-url", "http://x:1"]
    code = _run(["status", *url, *_filled(argv, files)])
    _assert_refused(capsys.readouterr(), code, status, words)


@pytest.fixture
def api(apiserver: LocalApiServer) -> Iterator[KubeClusterApi]:
    with connect(url=apiserver.url) as client:
        yield client


def test_status_says_a_node_does_not_exist_or_publishes_nothing(
    api: KubeClusterApi, apiserver: LocalApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    populate(api)
    api.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-only"}})
    argv = ["status", "--kube-api-url", apiserver.url, "--no-color", "--node"]
    code = _run([*argv, "nosuchnode"])
    _assert_refused(capsys.readouterr(), code, 1, "node nosuchnode does not exist")
    code = _run([*argv, "cpu-only"])
    _assert_refused(capsys.readouterr(), code, 1, "node cpu-only publishes no MIG devices")
    assert _run([*argv, "node-0"]) == 0
    assert "node-0  GPU 0" in capsys.readouterr().out


# ---------------------------------------------------------------------- simulate --from-cluster


def test_a_batch_that_does_not_fit_exits_1_naming_what_is_left(
    api: KubeClusterApi, apiserver: LocalApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    populate(api)
    argv = ["simulate", "--from-cluster", "--kube-api-url", apiserver.url, "--add", "7g.40gb=9"]
    code = _run(argv)
    captured = capsys.readouterr()
    _assert_refused(
        captured, code, 1, "--add does not fit now: no room for 9 of 9 x 7g.40gb", work=True
    )
    assert "9 x 7g.40gb: does not fit now" in captured.out


# ------------------------------------------------------------------------------------ defrag

DEFRAG_CASES = [
    ("yes-without-apply", ["--profile", "7g.40gb", "--yes"], 2, "--yes applies with --apply only"),
    ("count-zero", ["--profile", "7g.40gb", "--count", "0"], 2, "--count: must be from 1"),
    ("count-past-limit", ["--profile", "7g.40gb", "--count", "10" * 30], 2, "(60 characters)"),
    ("no-profile", [], 2, "the following arguments are required: --profile"),
    ("url-not-a-url", ["--profile", "7g.40gb", "--kube-api-url", "x"], 2, "API server URL 'x'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "status", "words"),
    [c[1:] for c in DEFRAG_CASES],
    ids=[c[0] for c in DEFRAG_CASES],
)
def test_defrag_refuses_what_it_cannot_use(
    capsys: pytest.CaptureFixture[str], argv: list[str], status: int, words: str
) -> None:
    url = [] if "--kube-api-url" in argv else ["--kube-api-url", "http://x:1"]
    code = _run(["defrag", *url, *argv])
    _assert_refused(capsys.readouterr(), code, status, words)


def test_defrag_says_no_plan_exists(
    api: KubeClusterApi, apiserver: LocalApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    populate(api)
    code = _run(["defrag", "--kube-api-url", apiserver.url, "--profile", "7g.40gb", "--count", "2"])
    _assert_refused(capsys.readouterr(), code, 1, "instaslice defrag: no plan exists: no set of")


def test_defrag_tells_a_stopped_search_from_no_plan() -> None:
    fleet = parse_fleet("2x1xA100-40GB")
    engine = _engine(fleet.nodes)
    units = [
        _hold(engine, f"ns/p{n}{start}", node.name, 0, "1g.5gb", start)
        for n, node in enumerate(fleet.nodes)
        for start in range(7)
    ]
    stopped = plan_defrag(engine, units, profile="7g.40gb", budget=5)
    impossible = plan_defrag(engine, units, profile="7g.40gb")
    assert not isinstance(stopped, DefragPlan)
    assert not isinstance(impossible, DefragPlan)
    assert plancli.no_plan_words(stopped).startswith("the search stopped at its budget")
    assert "a plan may exist" in plancli.no_plan_words(stopped)
    assert plancli.no_plan_words(impossible).startswith("no plan exists: no set of pods")


def test_defrag_apply_with_no_answer_changes_nothing(
    api: KubeClusterApi, apiserver: LocalApiServer
) -> None:
    populate(api)
    args = cli.build_parser().parse_args(
        ["defrag", "--profile", "7g.40gb", "--kube-api-url", apiserver.url, "--apply"]
    )

    def closed_stdin(question: str) -> str:
        raise EOFError

    out = io.StringIO()
    assert plancli.run_defrag(args, out=out, confirm=closed_stdin) == 1
    assert out.getvalue().endswith("Nothing was changed.\n")


# -------------------------------------------------------------------------------------- demo

DEMO_CASES = [
    ("no-nodes", ["--nodes", "0"], 2, "--nodes: must be from 1 to 8, got 0"),
    ("too-many-nodes", ["--nodes", "9"], 2, "--nodes: must be from 1 to 8, got 9"),
    ("nodes-not-a-number", ["--nodes", "two"], 2, "--nodes: an integer expected"),
    ("unknown-gpu", ["--gpus", "2xFOO"], 2, "unknown GPU model 'FOO'"),
    ("billions-of-gpus", ["--gpus", "99999999999xA100-40GB"], 2, "at most 64 per node"),
    ("more-gpus-than-drawn", ["--gpus", "9xA100-40GB"], 2, "at most 8"),
    ("samples-missing", ["--samples", "/nonexistent"], 1, "--samples /nonexistent is not a directory"),
    ("samples-without-kustomization", ["--samples", "{folder}"], 1, "cannot read kustomization"),
    ("pause-negative", ["--pause", "-1"], 2, "--pause: must be from 0 to 600"),
    ("timeout-zero", ["--timeout", "0"], 2, "--timeout: must be more than 0 and at most 3600"),
    ("timeout-inf", ["--timeout", "inf"], 2, "--timeout: must be more than 0 and at most 3600"),
    ("unknown-flag", ["--bogus"], 2, "unrecognized arguments: --bogus"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "status", "words"),
    [c[1:] for c in DEMO_CASES],
    ids=[c[0] for c in DEMO_CASES],
)
def test_demo_checks_every_argument_before_any_daemon_starts(
    files: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    status: int,
    words: str,
) -> None:
    # The demo's own command: ``instaslice demo`` becomes it (exec), so it is called here.
    code = _run(["--fast", *_filled(argv, files)], main=demo.main)
    # Nothing on stdout: the demo's first heading, printed before the stack starts, never came.
    _assert_refused(capsys.readouterr(), code, status, words)
