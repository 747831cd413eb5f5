"""``instaslice simulate --plot``: utilization and rejections over time per policy, as a PNG.

matplotlib is the optional extra ``plots``: ``make install`` installs it (it is in the dev lock), the
images do not. It is imported only here and only when a plot is asked for; without it the command
says how to get it. ``check_plot_target`` checks
the image's path before the replay starts, so that a path the plot cannot be written to is refused
before any work.

The fluid floor is drawn as what it is: one total over the whole trace (a dashed line the policies'
curves end against), labelled as a lower bound that holds while the fleet keeps up — under
overload, or with ``--queue``, a policy can reject fewer.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path

from driver.errors import ConfigError
from instaslice.planning.figures import ReplayResult
from instaslice.planning.replay import FloorResult


def check_plot_target(path: Path) -> None:
    """``ConfigError`` if an image could not be written to ``path``: its folder is missing or not
    writable, it is a folder, or (with matplotlib installed) matplotlib cannot write its format."""
    folder = path.parent
    if path.is_dir():
        raise ConfigError(f"--plot {path} is a directory; name an image file such as plot.png")
    if not folder.is_dir():
        raise ConfigError(f"--plot {path}: the directory {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"--plot {path}: the directory {folder} is not writable")
    if importlib.util.find_spec("matplotlib") is None:
        return  # the plot cannot be drawn; the command says so after the table
    from matplotlib.backend_bases import FigureCanvasBase  # noqa: PLC0415 - optional dependency

    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix.lower().lstrip(".") not in formats:
        raise ConfigError(
            f"--plot {path}: matplotlib writes images named .{', .'.join(sorted(formats))}"
        )


def plot_results(
    results: Sequence[ReplayResult], floor: FloorResult, *, path: Path, title: str
) -> None:
    try:
        import matplotlib  # noqa: PLC0415 - optional dependency

        matplotlib.use("Agg")
        from matplotlib import pyplot  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigError(
            "--plot needs matplotlib: run `make install` in the checkout (it installs the locked "
            "matplotlib), or pip install matplotlib where instaslice is installed"
        ) from exc
    figure, (top, bottom) = pyplot.subplots(2, 1, sharex=True, figsize=(10, 7))
    for result in results:
        timeline = result.timeline
        if timeline is None:
            raise ConfigError(f"policy {result.policy} was replayed without a timeline")
        start = timeline.t[0] if timeline.t else 0.0
        hours = [(t - start) / 3600 for t in timeline.t]
        used = [u / timeline.capacity for u in timeline.used_slices]
        top.plot(hours, used, linewidth=0.6, label=result.policy)
        bottom.plot(hours, timeline.rejected, linewidth=1.2, label=result.policy)
    bottom.axhline(
        floor.rejected,
        color="black",
        linestyle="--",
        linewidth=0.8,
        label=f"fluid floor: {floor.rejected} rejected over the trace (a lower bound while the "
        "fleet keeps up; overload or --queue can beat it)",
    )
    top.set_ylabel("memory slices in use")
    top.set_ylim(0, 1.02)
    top.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    bottom.set_ylabel("rejected so far")
    bottom.set_xlabel("hours since the first request")
    top.set_title(title)
    top.legend(loc="lower right")
    bottom.legend(loc="upper left")
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=120)
    except OSError as exc:
        raise ConfigError(f"cannot write plot {path}: {exc}") from exc
    finally:
        pyplot.close(figure)
