"""The text of the slice map: the table, the memory bar, colour on demand only."""

from __future__ import annotations

import re

import pytest

from instaslice.status import ClusterView, Style, build_view, compact_starts, render_view
from tests.cli.objects import claim, pod, pool

ANSI = re.compile(r"\x1b\[[0-9;]*m")
MIG_UUID = "MIG-0f1e2d3c-1111-2222-3333-444455556666"


def _view() -> ClusterView:
    return build_view(
        resource_slices=pool("node-0", gpus=1),
        claims=[
            claim("dra-2g-mig-x1", "gpu-0-2g-10gb-0", reserved_for=[("dra-2g", "u1")]),
            claim("shadow-1g", "gpu-0-1g-5gb-2", shadow_for="u2"),
        ],
        pods=[
            pod("dra-2g", uid="u1"),
            pod("cuda-vectoradd", uid="u2", phase="Pending", gates=("instaslice.dev/placement",)),
        ],
        mig_uuids={("uid-dra-2g-mig-x1", "gpu-0-2g-10gb-0"): MIG_UUID},
    )


def test_plain_text_has_the_gpu_header_bar_table_and_free_starts() -> None:
    text = render_view(_view(), style=Style())
    assert not ANSI.search(text)
    lines = text.splitlines()
    assert lines[0] == "node-0  GPU 0  NVIDIA A100-SXM4-40GB  GPU-node-0-0"
    assert lines[1] == "memory [AAB_ ____]  3/8 memory slices taken, 2 MIG slices"
    header = next(line for line in lines if line.startswith("| ID"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "ID", "START", "SIZE", "PROFILE", "VIA", "CLAIM", "POD", "POD STATE", "MIG UUID",
    ]  # fmt: skip
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in lines
        if line[:4] in ("| A ", "| B ")
    ]
    assert rows == [
        ["A", "0", "2", "2g.10gb", "dra", "demo/dra-2g-mig-x1", "demo/dra-2g", "Running", MIG_UUID],
        ["B", "2", "1", "1g.5gb", "classic", "demo/shadow-1g", "demo/cuda-vectoradd", "Pending (gated)", "-"],
    ]  # fmt: skip
    assert lines[-1] == (
        "free placement starts: 1g.5gb 3-6 · 1g.5gb+me 3-6 · 1g.10gb 4,6 · 2g.10gb 4 · 3g.20gb 4"
    )
    widths = {len(line) for line in lines if line.startswith(("|", "+"))}
    assert len(widths) == 1


def test_colour_only_when_asked_and_short_uuids_keep_the_table_narrow() -> None:
    coloured = render_view(_view(), style=Style(color=True, short_uuids=True))
    assert ANSI.search(coloured)
    plain = ANSI.sub("", coloured)
    assert MIG_UUID not in plain
    assert MIG_UUID[:12] + "…" in plain
    assert "memory [AAB_ ____]" in plain


def test_a_full_gpu_and_an_empty_cluster_say_so() -> None:
    full = build_view(
        resource_slices=pool("node-0", gpus=1), claims=[claim("c", "gpu-0-7g-40gb-0")], pods=[]
    )
    assert "free placement starts: none (nothing more fits on this GPU)" in render_view(full)
    assert "[AAAA AAAA]" in render_view(full)
    assert render_view(ClusterView(gpus=())).startswith("No MIG-capable GPU published")


def test_overlaps_and_strays_are_called_out() -> None:
    view = build_view(
        resource_slices=pool("node-0", gpus=1),
        claims=[
            claim("a", "gpu-0-2g-10gb-0"),
            claim("b", "gpu-0-1g-5gb-1"),
            claim("c", "x", node="gone"),
        ],
        pods=[],
    )
    text = render_view(view)
    assert "[A!__ ____]" in text
    assert text.count("OVERLAPS") == 2
    assert "demo/c -> pool gone, device x" in text


@pytest.mark.parametrize(
    ("starts", "text"),
    [((), ""), ((4,), "4"), ((0, 1), "0,1"), ((0, 1, 2, 3, 5), "0-3,5"), ((6, 0, 2, 4), "0,2,4,6")],
    ids=["none", "one", "pair", "run-and-single", "unsorted"],
)
def test_compact_starts(starts: tuple[int, ...], text: str) -> None:
    assert compact_starts(starts) == text
