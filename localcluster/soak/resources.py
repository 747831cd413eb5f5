"""What every daemon holds over time: resident memory, open file descriptors, threads, every
``SAMPLE_INTERVAL_S`` seconds from ``/proc``, and their growth.

Each process is judged over its life; a daemon a fault restarted is a new process (same role, new
pid), judged on its own. A process is judged when it lived at least ``JUDGE_SHARE`` of the soak, or
``JUDGE_ENOUGH_S``, after its warm-up (``WARMUP_S`` after it started, and not before the soak's own
warm-up ended).

A controller also changes *phase*: a leader holds the allocator's state and writes, a standby only
watches, so their figures differ by design. Its samples are cut into runs of one phase, each settled
``PHASE_SETTLE_S`` after the change (``WARMUP_S`` for its first run). RSS is judged over the life
with the step at each change taken out (each run continues from the level where the previous one
ended): the memory a leader's state took is not handed back to the operating system when it stops
leading, so a standby that led once sits higher for good, yet a creep inside any run still adds up.
Descriptors and threads are judged per phase, over every run of that phase: a standby must end with
no more than it had as a standby at first, so one leaked per lead change still shows.

RSS: the median of the first ``WINDOW`` samples against the median of the last ``WINDOW``, at most
``MAX_GROWTH`` (5 %) more. Descriptors and threads are counts of a few dozen that thread pools and
connection pools raise to their working size in steps, the first time a burst or a reconnect needs
them: the median of the last ``WINDOW`` against the highest count of the first half, at most 5 %
or ``MIN_COUNT_SLACK`` more, whichever is more — a leak of one per fault or reconnect still shows
within a few faults. The slope per hour (least squares, as a share of the start) is reported with
each.
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
JUDGE_ENOUGH_S: Final = 900.0
"""A settled life this long is judged however long the soak: in a long soak the faults restart
most daemons several times, and 15 minutes show a creep as well as half of an hour does."""
PHASE_SETTLE_S: Final = 60.0
"""After a lead change, the time a controller takes to build (or drop) the leader's state."""
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
    """The phase the figure was judged in; for RSS, the phases of the life joined by ``>``."""
    figure: str
    judged: bool
    """False: the incarnation lived too short after its warm-up to judge (reported only)."""
    start: float
    """RSS: the median of the first settled samples; counts: the first half's highest."""
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


Points = list[tuple[float, float]]


def _runs(samples: Sequence[Sample]) -> list[tuple[tuple[str, int], list[list[Sample]]]]:
    """Per role and pid, the samples cut into runs of one phase, in time order."""
    by_process: dict[tuple[str, int], list[Sample]] = {}
    for sample in samples:
        by_process.setdefault((sample.role, sample.pid), []).append(sample)
    cut = []
    for key, process_samples in sorted(by_process.items()):
        process_samples.sort(key=lambda s: s.at_s)
        runs: list[list[Sample]] = [[]]
        for sample in process_samples:
            if runs[-1] and sample.phase != runs[-1][-1].phase:
                runs.append([])
            runs[-1].append(sample)
        cut.append((key, runs))
    return cut


def _settled(runs: Sequence[Sequence[Sample]], soak_warmup_s: float) -> list[list[Sample]]:
    """Each run without its settling time; runs too short to tell a level are left out."""
    kept = []
    for index, run in enumerate(runs):
        settled_from = max(
            run[0].at_s + (WARMUP_S if index == 0 else PHASE_SETTLE_S), soak_warmup_s
        )
        settled = [s for s in run if s.at_s >= settled_from]
        if len(settled) >= WINDOW:
            kept.append(settled)
    return kept


def _stitched(runs: Sequence[Sequence[Sample]], figure: str) -> Points:
    """The runs' values of ``figure`` joined, each run moved to start at the level where the
    previous one ended (the medians of ``WINDOW`` samples on either side of the change)."""
    points: Points = []
    for run in runs:
        values = [float(getattr(s, figure)) for s in run]
        offset = 0.0
        if points:
            ended = statistics.median(v for _, v in points[-WINDOW:])
            offset = ended - statistics.median(values[:WINDOW])
        points += [(s.at_s, v + offset) for s, v in zip(run, values, strict=True)]
    return points


def _judge(
    key: tuple[str, int], phase: str, figure: str, points: Points, *, judged: bool
) -> Growth | None:
    if len(points) < 2 * WINDOW:
        return None
    values = [v for _, v in points]
    if figure == "rss_kib":
        start = statistics.median(values[:WINDOW])
    else:
        start = max(values[: len(values) // 2])
    end = statistics.median(values[-WINDOW:])
    slope = _slope(points)
    return Growth(
        role=key[0],
        pid=key[1],
        phase=phase,
        figure=figure,
        judged=judged,
        start=start,
        end=end,
        growth=(end - start) / start if start else 0.0,
        slope_per_hour=slope * 3600 / start if start else 0.0,
        within=end <= limit(figure, start),
    )


def growth(samples: Sequence[Sample], *, soak_s: float, soak_warmup_s: float) -> list[Growth]:
    """Every process's growth of each figure (module docstring)."""
    results = []
    for key, runs in _runs(samples):
        kept = _settled(runs, soak_warmup_s)
        if not kept:
            continue
        life = kept[-1][-1].at_s - kept[0][0].at_s
        judged = life >= min(JUDGE_SHARE * (soak_s - soak_warmup_s), JUDGE_ENOUGH_S)
        path = ">".join(run[0].phase for run in kept)
        judgements = [_judge(key, path, "rss_kib", _stitched(kept, "rss_kib"), judged=judged)]
        for phase in dict.fromkeys(run[0].phase for run in kept):
            of_phase = [s for run in kept if run[0].phase == phase for s in run]
            for figure in FIGURES[1:]:
                points = [(s.at_s, float(getattr(s, figure))) for s in of_phase]
                judgements.append(_judge(key, phase, figure, points, judged=judged))
        results += [g for g in judgements if g is not None]
    return results
