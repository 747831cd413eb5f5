"""What every daemon holds over time: resident memory, open file descriptors, threads, every
``SAMPLE_INTERVAL_S`` seconds from ``/proc``, and their growth.

A daemon a fault restarted starts a new series (an *incarnation*: same role, new pid), and so does a
controller that takes or loses the lead: a leader holds the allocator's state and writes, a standby
only watches, so their figures differ by design and the step between them is no growth. Growth is
judged on each series that lived at least ``JUDGE_SHARE`` of the soak after its warm-up
(``WARMUP_S`` after it started, and not before the soak's own warm-up ended). RSS: the median of
its first ``WINDOW`` samples after the warm-up against the median of its last ``WINDOW``, at most
``MAX_GROWTH`` (5 %) more. Descriptors and threads are counts of a few dozen that thread pools and
connection pools raise to their working size in steps, the first time a burst or a reconnect needs
them: the median of the last ``WINDOW`` against the highest count of the first half, at most 5 %
or ``MIN_COUNT_SLACK`` more, whichever is more — a leak of one per fault or reconnect still shows
within a few faults. The slope per hour (least squares over the samples after the warm-up, as a
share of the start) is reported with each.
"""

from __future__ import annotations

import os
import statistics
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from localcluster.soak.stack import Daemon

SAMPLE_INTERVAL_S: Final = 10.0
WARMUP_S: Final = 120.0
WINDOW: Final = 6
JUDGE_SHARE: Final = 0.5
MAX_GROWTH: Final = 0.05
MIN_COUNT_SLACK: Final = 2
FIGURES: Final = ("rss_kib", "fds", "threads")


@dataclass(frozen=True, slots=True)
class Sample:
    at_s: float
    role: str
    pid: int
    rss_kib: int
    fds: int
    threads: int
    phase: str = ""
    """``leader`` or ``standby`` for a controller; empty for the others."""


def read_process(pid: int) -> tuple[int, int, int] | None:
    """(RSS KiB, open descriptors, threads) of ``pid``; None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss = int(fields.get("VmRSS", "0 kB").split()[0])
    threads = int(fields.get("Threads", "0").strip())
    return rss, fds, threads


class ResourceSampler:
    def __init__(
        self,
        *,
        daemons: Callable[[], list[Daemon]],
        now: Callable[[], float],
        phase: Callable[[Daemon], str | None] = lambda daemon: "",
    ) -> None:
        self._daemons = daemons
        self._now = now
        self._phase = phase
        self._phases: dict[int, str] = {}
        """The last phase seen per pid: kept while a daemon does not answer."""
        self.samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="soak-resources", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        while True:
            self.sample_once()
            if self._stop.wait(SAMPLE_INTERVAL_S):
                return

    def sample_once(self) -> None:
        now = self._now()
        try:
            daemons = self._daemons()
        except (OSError, AttributeError):  # a process reaped while being looked at: next time
            return
        for daemon in daemons:
            figures = read_process(daemon.pid)
            if figures is None:
                continue
            phase = self._phase(daemon)
            if phase is None:
                phase = self._phases.get(daemon.pid, "")
            self._phases[daemon.pid] = phase
            with self._lock:
                self.samples.append(Sample(now, daemon.role, daemon.pid, *figures, phase=phase))

    def snapshot(self) -> list[Sample]:
        with self._lock:
            return list(self.samples)


@dataclass(frozen=True, slots=True)
class Growth:
    role: str
    pid: int
    phase: str
    figure: str
    judged: bool
    """False: the incarnation lived too short after its warm-up to judge (reported only)."""
    start: float
    """RSS: the median of the first samples after the warm-up; counts: the first half's highest."""
    end: float
    growth: float
    """(end - start) / start."""
    slope_per_hour: float
    """Least-squares slope over the samples after the warm-up, as a share of ``start`` per hour."""
    within: bool


def _slope(points: Sequence[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    mean_t = statistics.fmean(t for t, _ in points)
    mean_v = statistics.fmean(v for _, v in points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread


def limit(figure: str, start: float) -> float:
    """The most ``figure`` may end at, from ``start``."""
    if figure == "rss_kib":
        return start * (1 + MAX_GROWTH)
    return max(start * (1 + MAX_GROWTH), start + MIN_COUNT_SLACK)


def _series(samples: Sequence[Sample]) -> list[tuple[tuple[str, int, str], list[Sample]]]:
    """The samples cut into series: per role and pid, a new one at each change of phase."""
    by_process: dict[tuple[str, int], list[Sample]] = {}
    for sample in samples:
        by_process.setdefault((sample.role, sample.pid), []).append(sample)
    cut = []
    for (role, pid), process_samples in sorted(by_process.items()):
        process_samples.sort(key=lambda s: s.at_s)
        current: list[Sample] = []
        for sample in process_samples:
            if current and sample.phase != current[-1].phase:
                cut.append(((role, pid, current[-1].phase), current))
                current = []
            current.append(sample)
        cut.append(((role, pid, current[-1].phase), current))
    return cut


def growth(samples: Sequence[Sample], *, soak_s: float, soak_warmup_s: float) -> list[Growth]:
    """Every incarnation's growth of each figure (module docstring)."""
    results = []
    for (role, pid, phase), series in _series(samples):
        settled_from = max(series[0].at_s + WARMUP_S, soak_warmup_s)
        settled = [s for s in series if s.at_s >= settled_from]
        span = settled[-1].at_s - settled[0].at_s if settled else 0.0
        judged = len(settled) >= 2 * WINDOW and span >= JUDGE_SHARE * (soak_s - soak_warmup_s)
        for figure in FIGURES:
            if len(settled) < 2 * WINDOW:
                continue
            values = [float(getattr(s, figure)) for s in settled]
            if figure == "rss_kib":
                start = statistics.median(values[:WINDOW])
            else:
                start = max(values[: len(values) // 2])
            end = statistics.median(values[-WINDOW:])
            slope = _slope([(s.at_s, float(getattr(s, figure))) for s in settled])
            results.append(
                Growth(
                    role=role,
                    pid=pid,
                    phase=phase,
                    figure=figure,
                    judged=judged,
                    start=start,
                    end=end,
                    growth=(end - start) / start if start else 0.0,
                    slope_per_hour=slope * 3600 / start if start else 0.0,
                    within=end <= limit(figure, start),
                )
            )
    return results
