"""Text rendering of the slice map, in the spirit of ``nvidia-smi``'s MIG tables.

Pure: a :class:`~controller.statusview.ClusterView` in, a string out. Per GPU a header line (node,
index, product, UUID), a memory-slice bar (``[AAB_ CC__]``: one letter per taken slice, ``_`` free),
one table row per taken slice and the placements still free per profile. Colour is ANSI and
optional, so the same text goes to a terminal, a pipe, a test or the README.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from controller.statusview import (
    FREE_MARK,
    LABELS,
    OVERLAP_MARK,
    ClusterView,
    GpuView,
    TakenSlice,
)

_RESET = "\x1b[0m"
_BOLD = "\x1b[1m"
_DIM = "\x1b[2m"
_RED = "\x1b[31m"
_LABEL_COLORS = ("\x1b[36m", "\x1b[33m", "\x1b[35m", "\x1b[32m", "\x1b[34m", "\x1b[96m")
_HEADERS = ("ID", "START", "SIZE", "PROFILE", "VIA", "CLAIM", "POD", "POD STATE", "MIG UUID")
SHORT_UUID_CHARS = 12


@dataclass(frozen=True, slots=True)
class Style:
    """How to draw: ``color`` adds ANSI escapes; ``short_uuids`` keeps lines narrow."""

    color: bool = False
    short_uuids: bool = False

    def paint(self, text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if self.color and code and text else text


def label_color(label: str) -> str:
    position = LABELS.find(label)
    return _LABEL_COLORS[max(position, 0) % len(_LABEL_COLORS)]


def render_view(view: ClusterView, *, style: Style | None = None) -> str:
    """The whole map; ends with a newline."""
    style = style or Style()
    if not view.gpus and not view.strays:
        return "No MIG-capable GPU published by mig.instaslice.dev (no ResourceSlices yet).\n"
    blocks = [render_gpu(gpu, style=style) for gpu in view.gpus]
    if view.strays:
        lines = [style.paint("Allocations naming devices no ResourceSlice publishes:", _RED)]
        lines += [
            f"  {s.claim_namespace}/{s.claim_name} -> pool {s.pool}, device {s.device}"
            for s in view.strays
        ]
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def memory_bar(gpu: GpuView, *, style: Style) -> str:
    cells = []
    for char in gpu.memory_map():
        if char == FREE_MARK:
            cells.append(style.paint(char, _DIM))
        elif char == OVERLAP_MARK:
            cells.append(style.paint(char, _RED + _BOLD))
        elif char == " ":
            cells.append(char)
        else:
            cells.append(style.paint(char, label_color(char) + _BOLD))
    return "[" + "".join(cells) + "]"


def render_gpu(gpu: GpuView, *, style: Style) -> str:
    title = style.paint(f"{gpu.node}  GPU {gpu.index}", _BOLD)
    header = f"{title}  {gpu.product_name}  {_uuid(gpu.uuid, style)}"
    taken = gpu.memory_slices_taken
    summary = (
        f"memory {memory_bar(gpu, style=style)}  {taken}/{gpu.memory_slices} memory slices taken, "
        f"{len(gpu.taken)} MIG slice{'' if len(gpu.taken) == 1 else 's'}"
    )
    lines = [header, summary]
    if gpu.taken:
        lines += _table([_row(item, style) for item in gpu.taken], style=style)
    lines.append(_free_line(gpu))
    return "\n".join(lines) + "\n"


def _uuid(uuid: str | None, style: Style) -> str:
    if not uuid:
        return "-"
    if style.short_uuids and len(uuid) > SHORT_UUID_CHARS + 1:
        return uuid[:SHORT_UUID_CHARS] + "…"
    return uuid


@dataclass(frozen=True, slots=True)
class _Cell:
    text: str
    code: str = ""


def _row(item: TakenSlice, style: Style) -> list[_Cell]:
    pods = ", ".join(p.key for p in item.pods) or "-"
    states = ", ".join(p.phase + (" (gated)" if p.gated else "") for p in item.pods) or "-"
    if item.overlaps:
        states = f"{states} OVERLAPS"
    return [
        _Cell(item.label, label_color(item.label) + _BOLD),
        _Cell(str(item.placement.start)),
        _Cell(str(item.placement.size)),
        _Cell(item.profile),
        _Cell("classic" if item.shadow else "dra"),
        _Cell(item.claim_key),
        _Cell(pods),
        _Cell(states, _RED if item.overlaps else _phase_color(item)),
        _Cell(_uuid(item.mig_uuid, style)),
    ]


def _phase_color(item: TakenSlice) -> str:
    phases = {p.phase for p in item.pods}
    if phases == {"Running"}:
        return "\x1b[32m"
    if "Gone" in phases or "Failed" in phases:
        return _RED
    return "\x1b[33m"


def _table(rows: Sequence[list[_Cell]], *, style: Style) -> list[str]:
    widths = [len(h) for h in _HEADERS]
    for row in rows:
        widths = [max(w, len(cell.text)) for w, cell in zip(widths, row, strict=True)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells: Sequence[_Cell]) -> str:
        parts = [
            " " + style.paint(cell.text, cell.code) + " " * (w - len(cell.text) + 1)
            for cell, w in zip(cells, widths, strict=True)
        ]
        return "|" + "|".join(parts) + "|"

    header = line([_Cell(h, _BOLD) for h in _HEADERS])
    return [rule, header, rule, *(line(row) for row in rows), rule]


def _free_line(gpu: GpuView) -> str:
    parts = [f"{free.profile} {compact_starts(free.starts)}" for free in gpu.free if free.starts]
    if not parts:
        return "free placement starts: none (nothing more fits on this GPU)"
    return "free placement starts: " + " · ".join(parts)


def compact_starts(starts: Sequence[int]) -> str:
    """``0,1,2,3,5`` → ``0-3,5``; runs of three or more consecutive starts are folded."""
    runs: list[list[int]] = []
    for start in sorted(starts):
        if runs and start == runs[-1][-1] + 1:
            runs[-1].append(start)
        else:
            runs.append([start])
    return ",".join(
        f"{run[0]}-{run[-1]}" if len(run) >= 3 else ",".join(map(str, run)) for run in runs
    )
