"""Every citation of the design resolves inside this repository.

Comments, docstrings, manifests and documents cite ``docs/design.md`` by decision (``D3``), fact
(``F9``), section title (``docs/design.md "Classic pod"``) or Markdown anchor
(``design.md#f20--the-kubelets-grpc-services``). This test fails when one names something
``docs/design.md`` does not have, or points at design notes outside the repository (a ``DESIGN``
document or ``reference/`` files that never shipped with it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DESIGN = REPO_ROOT / "docs" / "design.md"
SKIPPED_DIRS = {".git", ".venv", "build", "node_modules", "__pycache__"}
SUFFIXES = {".py", ".pyi", ".md", ".yaml", ".yml", ".toml", ".sh", ".proto", ".txt"}
NAMES = {"Makefile", "Dockerfile"}

# The real-stack tier's build scripts are the one thing outside the repository the project names
# (docs/design.md "Outside this repository: the real-stack tier").
ALLOWED_OUTSIDE = ("shared/realstack",)

OUTSIDE = re.compile(
    r"\bDESIGN\b"  # the design notes this file replaced
    r"|\breference/[\w.-]+\.md"  # their reference files
    r"|(?:\.\./|/work/|\b)shared/[\w./-]*"
)
CITATION = re.compile(
    r"design\.md"
    r"(?:#(?P<anchor>[\w-]+))?"
    r"(?P<ids>(?:\s*(?:,|and)?\s*\b[DF]\d+\b)*)"
    r"(?:\s*,?\s*\"(?P<title>[^\"]+)\")?"
)
ID = re.compile(r"\b[DF]\d+\b")
HEADING = re.compile(r"^#{2,4} (?P<title>.+?)\s*$", re.MULTILINE)
NUMBERED = re.compile(r"^(?P<id>[DF]\d+) — (?P<name>.+)$")


@dataclass(frozen=True)
class Design:
    ids: frozenset[str]
    titles: frozenset[str]
    anchors: frozenset[str]


def github_anchor(title: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to
    hyphens (so ``F20 — The kubelet's gRPC services`` becomes ``f20--the-kubelets-grpc-services``)."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def read_design() -> Design:
    ids: set[str] = set()
    titles: set[str] = set()
    anchors: set[str] = set()
    for match in HEADING.finditer(DESIGN.read_text(encoding="utf-8")):
        title = match.group("title")
        titles.add(title)
        anchors.add(github_anchor(title))
        if numbered := NUMBERED.match(title):
            assert numbered.group("id") not in ids, f"{numbered.group('id')} is numbered twice"
            ids.add(numbered.group("id"))
            titles.add(numbered.group("name"))
    return Design(frozenset(ids), frozenset(titles), frozenset(anchors))


def tracked_files() -> list[Path]:
    found = []
    for path in REPO_ROOT.rglob("*"):
        relative = path.relative_to(REPO_ROOT)
        if any(part in SKIPPED_DIRS or part.endswith(".egg-info") for part in relative.parts):
            continue
        if path.is_file() and (path.suffix in SUFFIXES or path.name in NAMES):
            found.append(path)
    return sorted(found)


def _flat(text: str) -> str:
    """One line: a citation may wrap across comment or docstring lines."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)


def problems_in(text: str, design: Design) -> list[str]:
    problems = []
    for match in OUTSIDE.finditer(text):
        if not match.group().lstrip("./").removeprefix("work/").startswith(ALLOWED_OUTSIDE):
            problems.append(f"points outside the repository: {match.group()!r}")
    for match in CITATION.finditer(_flat(text)):
        anchor, title = match.group("anchor"), match.group("title")
        if anchor is not None and anchor not in design.anchors:
            problems.append(f"docs/design.md has no heading with the anchor #{anchor}")
        for cited in ID.findall(match.group("ids")):
            if cited not in design.ids:
                problems.append(f"docs/design.md has no {cited}")
        if title is not None and title not in design.titles:
            problems.append(f'docs/design.md has no section "{title}"')
    return problems


def test_the_design_numbers_its_decisions_and_facts() -> None:
    design = read_design()
    assert {f"D{n}" for n in range(1, 8)} <= design.ids
    assert {f"F{n}" for n in range(1, 25)} <= design.ids


def test_every_design_citation_in_the_repository_resolves() -> None:
    design = read_design()
    this_file = Path(__file__).resolve()
    found: list[str] = []
    cited = 0
    for path in tracked_files():
        if path == this_file:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        cited += len(CITATION.findall(_flat(text)))
        found += [f"{path.relative_to(REPO_ROOT)}: {p}" for p in problems_in(text, design)]
    assert found == []
    assert cited > 50  # the scan sees the citations (there are many more)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("see docs/design.md F99", "docs/design.md has no F99"),
        ("(docs/design.md F3 and\n    # F42)", "docs/design.md has no F42"),
        ('docs/design.md "No such section"', 'docs/design.md has no section "No such section"'),
        ("[x](docs/design.md#f1--nothing)", "docs/design.md has no heading with the anchor"),
        ("(DESIGN fact 6)", "points outside the repository: 'DESIGN'"),
        ("``reference/peers-and-mig-facts.md`` §4", "points outside the repository"),
        ("/work/shared/reference/x.md", "points outside the repository"),
    ],
    ids=[
        "unknown-fact",
        "wrapped-list",
        "unknown-section",
        "unknown-anchor",
        "old-design",
        "reference-file",
        "absolute-path",
    ],
)
def test_a_citation_that_does_not_resolve_is_reported(text: str, problem: str) -> None:
    problems = problems_in(text, read_design())
    assert any(p.startswith(problem) for p in problems), problems


@pytest.mark.parametrize(
    "text",
    [
        "docs/design.md F1, F3, F6",
        'docs/design.md "Classic pod"',
        "docs/design.md D1: no second bookkeeping object",
        "[F20](../docs/design.md#f20--the-kubelets-grpc-services)",
        "built by ../shared/realstack",
    ],
    ids=["fact-list", "section", "decision", "anchor", "real-stack"],
)
def test_a_citation_that_resolves_is_accepted(text: str) -> None:
    assert problems_in(text, read_design()) == []
