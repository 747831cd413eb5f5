"""Whatever a user types, ``instaslice`` answers: property tests over argument vectors, trace lines
and kubeconfig files.

Each example runs the command in a forked child with a memory ceiling and a guard against hangs
(``tests.cli.bounded``) and checks what a user would see: an exit status of 0, 1 or 2, never a
traceback, and a refusal in exactly one line. No cluster is reachable: every URL drawn is refused
at once or malformed, and ``$KUBECONFIG`` names a missing file. ``instaslice demo`` always gets a
missing ``--samples`` last, so no daemon ever starts; a valid demo is the end-to-end tests' job.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli.bounded import Outcome, run_bounded

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
REFUSED_URL = "http://127.0.0.1:1"
VALID_LINE = {"t": 0, "profile": "1g.5gb", "duration": 5}


def _assert_answered(outcome: Outcome, *, statuses: frozenset[int] = frozenset({0, 1, 2})) -> None:
    assert not outcome.hung, outcome
    assert "Traceback" not in outcome.stderr, outcome.stderr
    assert outcome.status in statuses, outcome
    if outcome.status != 0:
        assert len(outcome.stderr_lines) == 1, outcome.stderr
        assert outcome.stderr.startswith("instaslice"), outcome.stderr


# --------------------------------------------------------------------------- argument vectors


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Files an argument may name: good and bad traces, a kubeconfig, a FIFO, a folder…"""
    folder = tmp_path_factory.mktemp("cli-inputs")
    lines = [{**VALID_LINE, "t": i, "profile": p} for i, p in enumerate(["1g.5gb", "3g.20gb"] * 20)]
    texts = {
        "trace.jsonl": "".join(json.dumps(line) + "\n" for line in lines),
        "bad.jsonl": '{"t": 0, "profile": "1g.5gb", "count": 1000000000000, "duration": 1}\n',
        "kubeconfig.yaml": yaml.safe_dump(_kubeconfig(server=REFUSED_URL)),
        "junk.txt": "not: [valid\n",
    }
    made = {}
    for name, text in texts.items():
        (folder / name).write_text(text)
        made[name] = str(folder / name)
    (folder / "trace.jsonl.gz").write_bytes(gzip.compress(texts["trace.jsonl"].encode()))
    made["trace.jsonl.gz"] = str(folder / "trace.jsonl.gz")
    os.mkfifo(folder / "fifo")
    made["fifo"] = str(folder / "fifo")
    made["folder"] = str(folder)
    made["missing"] = str(folder / "missing")
    made["out.jsonl"] = str(folder / "out.jsonl")
    made["plot.png"] = str(folder / "plot.png")
    return made


def _kubeconfig(*, server: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
        "users": [{"name": "u", "user": {"token": "t"}}],
    }


def _pool(*values: str) -> st.SearchStrategy[str]:
    """Mostly the values a flag is meant for (valid and not), sometimes anything at all."""
    return st.one_of(st.sampled_from(values), st.sampled_from(values), ANYTHING)


ANYTHING = st.one_of(
    st.sampled_from(["0", "-1", "nan", "inf", "-inf", "1e309", "", "-", "x", "9" * 40]),
    st.integers(min_value=-5, max_value=5000).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(
        alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
        max_size=12,
    ),
)
FILES: tuple[str, ...] = ("{trace.jsonl}", "{trace.jsonl.gz}", "{bad.jsonl}", "{junk.txt}")
FILES += ("{fifo}", "{folder}", "{missing}")
FLEETS = ("1x2xA100-40GB", "2x8xA100-40GB", "1x1xH100-80GB,1x1xA30-24GB", "0x1xA100-40GB",
          "10001x1xA100-40GB", "1x17xA100-40GB", "7000x16xA100-40GB", "1x2xFOO", "2xA100-40GB",
          "99999999999x8xA100-40GB", "9" * 30 + "x1xA100-40GB")  # fmt: skip
POLICIES = ("firstfit", "bestfit,scarcity", "scarcity", "nope", "")
URLS = (REFUSED_URL, "notaurl", "http://[::1", "ftp://x", "https://127.0.0.1:1/prefix",
        "http://:80", "http://127.0.0.1:99999")  # fmt: skip
CONNECTION: dict[str, st.SearchStrategy[str] | None] = {
    "--kubeconfig": _pool("{kubeconfig.yaml}", "{junk.txt}", "{fifo}", "{folder}", "{missing}"),
    "--context": _pool("x", "nope"),
    "--kube-api-url": _pool(*URLS),
}
SIMULATE: dict[str, st.SearchStrategy[str] | None] = {
    "--trace": _pool(*FILES, "{out.jsonl}", "-"),
    "--gpus": _pool(*FLEETS),
    "--policy": _pool(*POLICIES),
    "--json": None,
    "--queue": None,
    "--preemption": None,
    "--starvation-after": _pool("60", "0", "-1", "nan", "1e13"),
    "--priorities": _pool("1000=1,0=4", "-5=1", "x", "=", "3000000000=1"),
    "--plot": _pool("{plot.png}", "{folder}", "{missing}/plot.png"),
    "--defrag-on-reject": _pool("1", "2", "0", "-1", "99999"),
    "--defrag-whole-gpu-below": _pool("50", "0", "101", "nan"),
    "--defrag-whole-gpu-reserve": _pool("0.04", "0", "2", "nan"),
    "--synthesize": None,
    "--mix": _pool("1g.5gb=1", "2*1g.5gb=3,7g.40gb=1", "8*1g.5gb=1", "1g.5gb=nan", "=", "x=1"),
    "--load": _pool("0.9", "2", "0", "11", "1e-300"),
    "--events": _pool("10", "100", "0", "1000001"),
    "--seed": _pool("1", "-5", "9" * 40),
    "--mean-duration": _pool("60", "0", "inf", "1e10", "1e-300"),
    "--from-cluster": None,
    "--add": _pool("1g.5gb=1", "7g.40gb=99999999999999", "3g.20gb", "=3", "x"),
    **CONNECTION,
}
STATUS: dict[str, st.SearchStrategy[str] | None] = {
    "--node": _pool("node-0", "nosuch"),
    "--checkpoint": _pool("{missing}", "{junk.txt}", "{folder}", "{fifo}", "/dev/zero"),
    "--watch": _pool("0.5", "0", "-1", "nan", "2", "1e9"),
    "--short-uuids": None,
    "--no-color": None,
    **CONNECTION,
}
DEFRAG: dict[str, st.SearchStrategy[str] | None] = {
    "--profile": _pool("7g.40gb", "1g.5gb", "nope", ""),
    "--count": _pool("1", "0", "99999", "x"),
    "--policy": _pool(*POLICIES),
    "--apply": None,
    "--yes": None,
    **CONNECTION,
}
DEMO: dict[str, st.SearchStrategy[str] | None] = {
    "--nodes": _pool("1", "0", "9", "x"),
    "--gpus": _pool("2xA100-40GB", "2xFOO", "9xA100-40GB", "99999999999xA100-40GB", ""),
    "--samples": _pool("{missing}", "{folder}", "{trace.jsonl}"),
    "--pause": _pool("0", "-1", "nan", "601"),
    "--timeout": _pool("1", "0", "inf"),
    "--fast": None,
    "--no-color": None,
    "--keep-logs": None,
}
COMMANDS = {"simulate": SIMULATE, "status": STATUS, "defrag": DEFRAG, "demo": DEMO}
STARTS: dict[str, list[list[str]]] = {
    # how each command usually begins: a run that gets past argparse
    "simulate": [
        ["--trace", "{trace.jsonl}", "--gpus", "1x2xA100-40GB"],
        ["--synthesize", "--trace", "{out.jsonl}", "--gpus", "1x2xA100-40GB", "--events", "50"],
        ["--from-cluster", "--kube-api-url", REFUSED_URL],
    ],
    "status": [["--kube-api-url", REFUSED_URL], []],
    "defrag": [["--profile", "7g.40gb", "--kube-api-url", REFUSED_URL]],
    "demo": [[]],
}


@st.composite
def argument_vectors(draw: st.DrawFn) -> list[str]:
    """A sub-command, a usual beginning, then up to four of its flags (a value where one is due)
    and sometimes a stray word; ``--version`` or ``--help`` now and then."""
    command = draw(st.sampled_from(sorted(COMMANDS)))
    argv = [command, *draw(st.sampled_from(STARTS[command]))]
    flags = COMMANDS[command]
    for flag in draw(st.lists(st.sampled_from(sorted(flags)), max_size=4)):
        values = flags[flag]
        argv += [flag] if values is None else [flag, draw(values)]
    if draw(st.integers(min_value=0, max_value=9)) == 0:
        argv.insert(draw(st.integers(min_value=0, max_value=len(argv))), draw(ANYTHING))
    if draw(st.integers(min_value=0, max_value=19)) == 0:
        argv.insert(0, draw(st.sampled_from(["--version", "--help", "-v"])))
    if command == "demo":
        argv += ["--samples", "{missing}"]  # never a demo that starts daemons
    return argv


def _filled(argv: list[str], inputs: dict[str, str]) -> list[str]:
    """``{name}`` in an argument replaced by that input's path."""
    filled = []
    for arg in argv:
        text = arg
        for name, path in inputs.items():
            text = text.replace("{" + name + "}", path)
        filled.append(text)
    return filled


@settings(SETTINGS, max_examples=60)
@given(argv=argument_vectors())
def test_any_argument_vector_is_answered_in_bounded_time_and_memory(
    inputs: dict[str, str], argv: list[str]
) -> None:
    _assert_answered(run_bounded(_filled(argv, inputs)))


# ------------------------------------------------------------------------------- trace lines

JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["1g.5gb", "7g.40gb", "3g.20gb", "1g.5gb+me", "9g.99gb", ""]),
    st.text(max_size=20),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
FIELDS = st.sampled_from(["t", "profile", "count", "duration", "name", "gpu"])


@st.composite
def trace_lines(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["valid", "changed", "value", "text"]))
    if kind == "text":
        return draw(st.text(alphabet=st.characters(blacklist_characters="\n\r\x00"), max_size=60))
    if kind == "value":
        return json.dumps(draw(JSON_VALUES), allow_nan=True)
    line: dict[str, Any] = dict(VALID_LINE)
    if kind == "changed":
        for field in draw(st.lists(FIELDS, min_size=1, max_size=3)):
            if draw(st.booleans()):
                line[field] = draw(JSON_VALUES)
            else:
                line.pop(field, None)
    return json.dumps(line, allow_nan=True)


@st.composite
def trace_files(draw: st.DrawFn) -> tuple[bytes, bool]:
    text = "".join(line + "\n" for line in draw(st.lists(trace_lines(), min_size=1, max_size=6)))
    data = text.encode("utf-8", errors="surrogatepass")
    if not draw(st.booleans()):
        return data, False
    packed = gzip.compress(data, mtime=0)
    cut = draw(st.sampled_from([len(packed), len(packed) // 2, len(packed) - 4]))
    return packed[:cut], True


@pytest.fixture(scope="module")
def trace_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("traces")


@SETTINGS
@given(trace=trace_files())
def test_any_trace_file_is_answered_in_bounded_time_and_memory(
    trace_folder: Path, trace: tuple[bytes, bool]
) -> None:
    data, packed = trace
    path = trace_folder / ("t.jsonl.gz" if packed else "t.jsonl")
    path.write_bytes(data)
    argv = ["simulate", "--trace", str(path), "--gpus", "1x2xA100-40GB", "--policy", "firstfit"]
    _assert_answered(run_bounded(argv), statuses=frozenset({0, 1}))


# ---------------------------------------------------------------------------- kubeconfig files

KUBECONFIG_KEYS = st.sampled_from(
    ["apiVersion", "kind", "clusters", "contexts", "users", "current-context", "name", "cluster",
     "context", "user", "server", "token", "namespace", "insecure-skip-tls-verify",
     "certificate-authority-data", "client-certificate-data", "client-key-data", "username",
     "password", "preferences"]
)  # fmt: skip
KUBECONFIG_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from(["c", "x", "u", "v1", "Config", REFUSED_URL, "notaurl", "!!!", "", "ZZZZ"]),
)
KUBECONFIG_VALUES = st.recursive(
    KUBECONFIG_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KUBECONFIG_KEYS, inner, max_size=4),
    max_leaves=12,
)


@st.composite
def kubeconfigs(draw: st.DrawFn) -> str:
    """A kubeconfig: a valid one with a few parts replaced, or any YAML of its vocabulary."""
    if draw(st.booleans()):
        document: Any = draw(KUBECONFIG_VALUES)
    else:
        document = _kubeconfig(server=draw(st.sampled_from([REFUSED_URL, "notaurl", "x://y"])))
        for key in draw(st.lists(st.sampled_from(sorted(document)), max_size=2)):
            document[key] = draw(KUBECONFIG_VALUES)
    return yaml.safe_dump(document)


@SETTINGS
@given(text=kubeconfigs())
def test_any_kubeconfig_is_answered_in_one_line(trace_folder: Path, text: str) -> None:
    path = trace_folder / "kubeconfig.yaml"
    path.write_text(text)
    outcome = run_bounded(["status", "--kubeconfig", str(path)])
    _assert_answered(outcome, statuses=frozenset({1}))
