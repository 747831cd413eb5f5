"""What the tiers that need built components share: their tests skip in one line where those
components are not built."""

from __future__ import annotations

from pathlib import Path

import pytest


def skip_unless_built(items: list[pytest.Item], folder: Path, reason: str | None) -> None:
    """Mark every collected test under ``folder`` skipped for ``reason`` (None: all is built)."""
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if folder in item.path.parents:
            item.add_marker(skip)
