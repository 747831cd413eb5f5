"""The README's first screen is a newcomer's: what InstaSlice is, then the two commands (the demo and
the tests), then the picture; every acronym it leans on is spelled out where it first appears, and
its links inside the page lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
FIRST_SCREEN_LINES = 40
SPELLED_OUT = {
    "MIG": "Multi-Instance GPU",
    "DRA": "Dynamic Resource Allocation",
    "NVML": "NVIDIA Management Library",
    "CDI": "Container Device Interface",
}
SPELLED_WITHIN = 40
"""Characters after the term's first use in which its words must appear: "MIG (Multi-Instance…"."""


def _github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_first_screen_says_what_it_is_then_the_two_commands_then_the_picture() -> None:
    first_screen = "\n".join(README.splitlines()[:FIRST_SCREEN_LINES])
    quick_start = first_screen.index("## Quick start")
    assert "MIG" in first_screen[:quick_start], "what it is comes first"
    for command in ("make demo ", "make install test "):
        assert command in first_screen[quick_start:], f"{command.strip()} is on the first screen"
    assert (
        README.index("## Quick start") < README.index("## How it works") < README.index("```text")
    )


@pytest.mark.parametrize(("term", "words"), SPELLED_OUT.items(), ids=SPELLED_OUT)
def test_an_acronym_is_spelled_out_at_its_first_use(term: str, words: str) -> None:
    text = " ".join(README.split())  # the words may wrap
    first = re.search(rf"\b{term}\b", text)
    assert first is not None, term
    context = text[first.start() : first.end() + SPELLED_WITHIN]
    assert words in context, f"{term} is first used without its words ({words}): {context!r}"


def test_links_inside_the_page_name_a_heading() -> None:
    anchors = {_github_anchor(h) for h in re.findall(r"^#{1,4} (.+)$", README, re.MULTILINE)}
    for anchor in re.findall(r"\]\(#([\w-]+)\)", README):
        assert anchor in anchors, f"#{anchor} names no heading of the README"
