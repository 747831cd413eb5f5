"""What every ``instaslice`` command promises whoever types it: its ``--help`` is plain text, and a
command line that is wrong in itself is refused in one line with exit status 2 (argparse's own),
before any file is read or any cluster is asked (README, "Capacity planning").

The commands are walked from the parser itself, so a sub-command added later without an entry in
``MALFORMED`` fails here."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from instaslice import cli
from localcluster import demo

RST_MARKUP = {
    "double backticks": re.compile(r"``"),
    "a role such as :class:": re.compile(r":[a-z]+:`"),
    "a literal-block marker ::": re.compile(r"::(\s|$)"),
    "a directive such as .. note::": re.compile(r"^\s*\.\. ", re.MULTILINE),
}
NO_CLUSTER = "http://127.0.0.1:1"
"""Refused at once if anything connected to it; nothing here should get that far."""
TRACE = "/nonexistent/trace.jsonl"
"""A trace never read: the command line is refused before it would be."""
FLEET = ["--gpus", "1x8xA100-40GB"]

MALFORMED: dict[str, list[tuple[str, list[str], str]]] = {
    "": [
        ("no-command", [], "the following arguments are required: COMMAND"),
        ("unknown-command", ["bogus"], "invalid choice: 'bogus'"),
    ],
    "status": [
        ("unknown-flag", ["--bogus"], "unrecognized arguments: --bogus"),
        ("watch-zero", ["--watch", "0"], "--watch: must be from 0.5 to 3600, got 0"),
        ("url-not-a-url", ["--kube-api-url", "notaurl"], "API server URL 'notaurl' is not"),
        ("url-and-kubeconfig", ["--kube-api-url", NO_CLUSTER, "--kubeconfig", "/nonexistent"],
         "--kube-api-url and --kubeconfig/--context do not combine"),
    ],
    "simulate": [
        ("unknown-flag", ["--bogus"], "unrecognized arguments: --bogus"),
        ("no-trace", FLEET, "give --gpus and --trace (or --from-cluster)"),
        ("fleet-not-a-fleet", ["--trace", TRACE, "--gpus", "8xA100"],
         "GPU group '8xA100' is not NODESxGPUSxMODEL"),
        ("fleet-too-large", ["--trace", TRACE, "--gpus", "9000x16xA100-40GB"],
         "the fleet has 144,000 GPUs"),
        ("unknown-policy", ["--trace", TRACE, *FLEET, "--policy", "nope"],
         "unknown placement policy nope"),
        ("two-modes", ["--synthesize", "--from-cluster"], "two modes; give one"),
        ("flag-of-another-mode", ["--trace", TRACE, *FLEET, "--mix", "1g.5gb=1"],
         "--mix applies with --synthesize"),
        ("preemption-without-queue", ["--trace", TRACE, *FLEET, "--preemption"],
         "--preemption needs --queue"),
        ("defrag-with-queue", ["--trace", TRACE, *FLEET, "--queue", "--defrag-on-reject", "1"],
         "--defrag-on-reject and --queue do not combine"),
        ("defrag-moves-past-limit", ["--trace", TRACE, *FLEET, "--defrag-on-reject", "99999"],
         "at most 10,000"),
        ("whole-gpu-rule-without-defrag", ["--trace", TRACE, *FLEET, "--defrag-whole-gpu-below",
         "50"], "--defrag-whole-gpu-below needs --defrag-on-reject K"),
        ("whole-gpu-reserve-past-1", ["--trace", TRACE, *FLEET, "--defrag-on-reject", "1",
         "--defrag-whole-gpu-reserve", "2"], "more than 0 and at most 1, got 2"),
        ("mix-not-offered", ["--synthesize", "--trace", "-", *FLEET, "--mix", "9g.99gb=1"],
         "mix profile '9g.99gb' is not offered"),
        ("priorities-weight-zero", ["--synthesize", "--trace", "-", *FLEET, "--priorities",
         "0=0"], "the weight must be a number > 0"),
        ("load-zero", ["--synthesize", "--trace", "-", *FLEET, "--load", "0"],
         "--load: must be more than 0"),
        ("batch-not-a-batch", ["--from-cluster", "--kube-api-url", NO_CLUSTER, "--add", "3g=x"],
         "batch entry '3g=x' is not PROFILE=COUNT"),
        ("from-cluster-unknown-policy", ["--from-cluster", "--kube-api-url", NO_CLUSTER,
         "--policy", "nope"], "unknown placement policy nope"),
    ],
    "defrag": [
        ("unknown-flag", ["--profile", "7g.40gb", "--bogus"], "unrecognized arguments: --bogus"),
        ("no-profile", ["--kube-api-url", NO_CLUSTER], "required: --profile"),
        ("count-zero", ["--profile", "7g.40gb", "--count", "0"], "--count: must be from 1"),
        ("yes-without-apply", ["--kube-api-url", NO_CLUSTER, "--profile", "7g.40gb", "--yes"],
         "--yes applies with --apply only"),
        ("policy-unknown", ["--profile", "7g.40gb", "--policy", "nope"], "invalid choice"),
        ("url-not-a-url", ["--profile", "7g.40gb", "--kube-api-url", "ftp://x"],
         "is not http(s)://HOST[:PORT]"),
    ],
    "uninstall": [
        ("unknown-flag", ["-f", "-", "--bogus"], "unrecognized arguments: --bogus"),
        ("no-manifests", ["--kube-api-url", NO_CLUSTER], "required: -f/--filename"),
        ("timeout-zero", ["-f", "-", "--timeout", "0"], "--timeout: must be more than 0"),
        ("timeout-nan", ["-f", "-", "--timeout", "nan"], "--timeout: must be more than 0"),
        ("url-and-context", ["-f", "-", "--kube-api-url", NO_CLUSTER, "--context", "x"],
         "do not combine"),
    ],
    "demo": [
        ("unknown-flag", ["--bogus"], "unrecognized arguments: --bogus"),
        ("no-nodes", ["--nodes", "0"], "--nodes: must be from 1 to 8, got 0"),
        ("unknown-gpu", ["--gpus", "2xFOO"], "unknown GPU model 'FOO'"),
        ("timeout-inf", ["--timeout", "inf"], "--timeout: must be more than 0"),
    ],
}  # fmt: skip
CASES = [
    pytest.param(command, argv, words, id=f"{command or 'instaslice'}-{name}")
    for command, cases in MALFORMED.items()
    for name, argv, words in cases
]


def _commands() -> list[str]:
    """Every sub-command the parser knows."""
    (sub,) = (
        action
        for action in cli.build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    return sorted(sub.choices)


def _run(argv: Sequence[str]) -> int:
    try:
        if argv[:1] == ["demo"]:  # `instaslice demo` becomes the lab's demo (exec): call that
            return demo.main(list(argv[1:]))
        return cli.main(list(argv))
    except SystemExit as exc:  # argparse's refusals, and --help
        return exc.code if isinstance(exc.code, int) else 1


def test_every_command_has_malformed_command_lines_to_refuse() -> None:
    assert sorted(c for c in MALFORMED if c) == _commands()


@pytest.mark.parametrize("command", ["", *_commands()], ids=lambda c: c or "instaslice")
def test_help_is_plain_text(capsys: pytest.CaptureFixture[str], command: str) -> None:
    assert _run([command, "--help"] if command else ["--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: instaslice {command}".rstrip()), text
    found = {what: m.group(0) for what, r in RST_MARKUP.items() if (m := r.search(text))}
    assert not found, f"reStructuredText markup in the help of instaslice {command}: {found}"


@pytest.mark.parametrize(("command", "argv", "words"), CASES)
def test_a_malformed_command_line_exits_2_in_one_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    argv: list[str],
    words: str,
) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    # stdin under pytest refuses reads: an ``uninstall -f -`` that read it would exit 1.
    code = _run([command, *argv] if command else argv)
    captured = capsys.readouterr()
    prog = f"instaslice {command}".rstrip()
    assert code == 2, captured.err
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"{prog}: "), line
    assert line.endswith(f"(see {prog} --help)"), line
    assert words in line


def test_a_trace_that_cannot_be_read_is_not_a_malformed_argument(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The other side of the line: what the command line names, when it cannot be used, exits 1."""
    assert _run(["simulate", "--trace", str(tmp_path / "missing.jsonl"), *FLEET]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("instaslice simulate: cannot read trace")
    assert "--help" not in line
