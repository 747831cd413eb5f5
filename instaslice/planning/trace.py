"""Request traces for capacity planning: read, check, write and synthesize them.

A trace is JSON Lines, one request per line, arrivals in order::

    {"t": 12.5, "profile": "1g.5gb", "count": 1, "duration": 300.0, "name": "job-17"}

``t`` is the arrival in seconds (never decreasing), ``count`` (default 1) slices of ``profile``
that must share one GPU, ``duration`` how long they are held once placed, ``name`` optional. Files
ending in ``.gz`` are read and written compressed. A bad line is a ``ConfigError`` naming its line
number and what is wrong, so a user can fix their export.

``synthesize`` writes a trace users can start from without data: Poisson arrivals, exponential
durations, profiles drawn from a weighted mix, the arrival rate chosen so that the *offered* load —
arrival rate x mean duration x mean memory slices per request — is the given fraction of the fleet's
memory slices.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from driver.errors import ConfigError
from instaslice.planning.fleet import Fleet

_FIELDS = frozenset({"t", "profile", "count", "duration", "name"})


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace: ``count`` slices of ``profile`` on one GPU, held ``duration`` s."""

    t: float
    profile: str
    count: int = 1
    duration: float = 0.0
    name: str | None = None
    line: int = 0
    """Line number in the file it came from (0 when built in code)."""

    def to_json(self) -> str:
        obj: dict[str, Any] = {"t": round(self.t, 3), "profile": self.profile}
        if self.count != 1:
            obj["count"] = self.count
        obj["duration"] = round(self.duration, 3)
        if self.name is not None:
            obj["name"] = self.name
        return json.dumps(obj, separators=(",", ":"))


def _number(obj: dict[str, Any], key: str, *, where: str) -> float:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: {key!r} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ConfigError(f"{where}: {key!r} must be a finite number >= 0, got {value!r}")
    return number


def parse_line(text: str, *, line: int, source: str = "trace") -> TraceRequest:
    """One trace line; ``ConfigError`` naming ``source:line`` and what is wrong."""
    where = f"{source} line {line}"
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - _FIELDS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(_FIELDS))})"
        )
    for key in ("t", "profile", "duration"):
        if key not in obj:
            raise ConfigError(f"{where}: missing {key!r}")
    profile = obj["profile"]
    if not isinstance(profile, str) or not profile:
        raise ConfigError(f"{where}: 'profile' must be a non-empty string, got {profile!r}")
    count = obj.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"{where}: 'count' must be an integer >= 1, got {count!r}")
    name = obj.get("name")
    if name is not None and not isinstance(name, str):
        raise ConfigError(f"{where}: 'name' must be a string, got {name!r}")
    return TraceRequest(
        t=_number(obj, "t", where=where),
        profile=profile,
        count=count,
        duration=_number(obj, "duration", where=where),
        name=name,
        line=line,
    )


def parse_lines(lines: Iterable[str], *, source: str = "trace") -> tuple[TraceRequest, ...]:
    """Every request of a trace, in order; blank lines are skipped, ``t`` must not decrease."""
    requests: list[TraceRequest] = []
    last = 0.0
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        request = parse_line(text, line=number, source=source)
        if request.t < last:
            raise ConfigError(
                f"{source} line {number}: 't' is {request.t}, before the previous request's "
                f"{last}; arrivals must not decrease"
            )
        last = request.t
        requests.append(request)
    return tuple(requests)


def _open_text(path: Path, mode: str) -> IO[str]:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.GzipFile(path, mode + "b"), encoding="utf-8")
    return path.open(mode, encoding="utf-8")


def read_trace(path: Path) -> tuple[TraceRequest, ...]:
    """A trace file (``.gz`` read compressed); ``ConfigError`` if unreadable or bad."""
    try:
        with _open_text(path, "r") as stream:
            return parse_lines(stream, source=str(path))
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read trace {path}: {exc}") from exc


def write_trace(requests: Iterable[TraceRequest], stream: IO[str]) -> int:
    """Write ``requests`` as JSON Lines; returns how many were written."""
    written = 0
    for request in requests:
        stream.write(request.to_json() + "\n")
        written += 1
    return written


def save_trace(requests: Iterable[TraceRequest], path: Path) -> int:
    """Write a trace file (compressed when ``path`` ends in ``.gz``, reproducibly: no timestamp)."""
    try:
        if path.suffix == ".gz":
            with (
                path.open("wb") as raw,
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as packed,
                io.TextIOWrapper(packed, encoding="utf-8") as stream,
            ):
                return write_trace(requests, stream)
        with path.open("w", encoding="utf-8") as stream:
            return write_trace(requests, stream)
    except OSError as exc:
        raise ConfigError(f"cannot write trace {path}: {exc}") from exc


# --------------------------------------------------------------------------------- synthesis


@dataclass(frozen=True, slots=True)
class MixEntry:
    """One kind of request in a synthetic mix: ``count`` x ``profile`` on one GPU, by weight."""

    profile: str
    weight: float
    count: int = 1


def parse_mix(text: str) -> tuple[MixEntry, ...]:
    """``1g.5gb=45,2g.10gb=15,2*1g.5gb=5``: profile (optionally ``N*`` slices on one GPU) = weight."""
    entries: list[MixEntry] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, weight_text = part.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ConfigError(f"mix entry {part!r} is not PROFILE=WEIGHT (e.g. 1g.5gb=45)")
        count = 1
        if "*" in name:
            count_text, _, name = name.partition("*")
            try:
                count = int(count_text)
            except ValueError:
                count = 0
            if count < 1 or not name:
                raise ConfigError(f"mix entry {part!r}: write N*PROFILE with N >= 1 (2*1g.5gb=5)")
        try:
            weight = float(weight_text)
        except ValueError:
            weight = -1.0
        if not math.isfinite(weight) or weight <= 0:
            raise ConfigError(f"mix entry {part!r}: the weight must be a number > 0")
        entries.append(MixEntry(profile=name, weight=weight, count=count))
    if not entries:
        raise ConfigError("the mix is empty; give PROFILE=WEIGHT pairs (e.g. 1g.5gb=45,7g.40gb=5)")
    return tuple(entries)


def synthesize(
    *,
    fleet: Fleet,
    mix: Sequence[MixEntry],
    load: float,
    events: int,
    seed: int,
    mean_duration: float = 300.0,
) -> tuple[TraceRequest, ...]:
    """``events`` requests with Poisson arrivals and exponential durations at offered ``load``."""
    if not 0 < load <= 10:
        raise ConfigError(f"load must be in (0, 10], got {load}")
    if events < 1:
        raise ConfigError(f"events must be at least 1, got {events}")
    if not math.isfinite(mean_duration) or mean_duration <= 0:
        raise ConfigError(f"the mean duration must be > 0 seconds, got {mean_duration}")
    slices = []
    for entry in mix:
        size = fleet.slices_of(entry.profile)
        if size is None:
            raise ConfigError(
                f"mix profile {entry.profile!r} is not offered by any GPU of the fleet "
                f"(offered: {', '.join(fleet.profile_names())})"
            )
        slices.append(size * entry.count)
    total_weight = sum(e.weight for e in mix)
    mean_slices = sum(s * e.weight for s, e in zip(slices, mix, strict=True)) / total_weight
    rate = load * fleet.memory_slices / (mean_slices * mean_duration)
    rng = random.Random(seed)  # noqa: S311 - a reproducible simulation, not a secret
    weights = [e.weight for e in mix]
    now = 0.0
    requests: list[TraceRequest] = []
    for _ in range(events):
        now += rng.expovariate(rate)
        entry = rng.choices(mix, weights=weights)[0]
        duration = rng.expovariate(1.0 / mean_duration)
        # Rounded as written, so a synthesized trace replays the same from memory or from its file.
        requests.append(
            TraceRequest(
                t=round(now, 3),
                profile=entry.profile,
                count=entry.count,
                duration=round(duration, 3),
            )
        )
    return tuple(requests)
