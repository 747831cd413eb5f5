"""Request traces for capacity planning: read, check, write and synthesize them.

A trace is JSON Lines, one request per line, arrivals in order::

    {"t": 12.5, "profile": "1g.5gb", "count": 1, "duration": 300.0, "name": "job-17",
     "priority": 1000, "preemptionPolicy": "Never"}

``t`` is the arrival in seconds (never decreasing), ``count`` (default 1) slices of ``profile``
that must share one GPU, ``duration`` how long they are held once placed, ``name`` optional.
``priority`` (default 0) and ``preemptionPolicy`` (``PreemptLowerPriority``, the default, or
``Never``) are the pod's ``spec.priority`` and ``spec.preemptionPolicy``: a queued replay serves
waiting requests by priority and may preempt lower priorities with them. Files
ending in ``.gz`` are read and written compressed. A bad line is a ``ConfigError`` naming its line
number and what is wrong, so a user can fix their export. Only regular files are read, within the
limits of ``instaslice.planning.limits`` (lines, bytes decompressed, line length, seconds, slices
per request), so that no file can take unbounded time or memory.

``synthesize`` writes a trace users can start from without data: Poisson arrivals, exponential
durations, profiles drawn from a weighted mix (and optionally priorities from a second one), the
arrival rate chosen so that the *offered* load —
arrival rate x mean duration x mean memory slices per request — is the given fraction of the fleet's
memory slices.
"""

from __future__ import annotations

import errno
import gzip
import io
import json
import random
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, Literal

from driver.errors import ConfigError
from instaslice.files import open_for_writing, open_regular_file
from instaslice.planning.fleet import Fleet
from instaslice.planning.limits import (
    MAX_COUNT_PER_GPU,
    MAX_MEAN_DURATION,
    MAX_MIX_WEIGHT,
    MAX_TRACE_BYTES,
    MAX_TRACE_LINE_BYTES,
    MAX_TRACE_REQUESTS,
    MAX_TRACE_SECONDS,
)

Need = tuple[tuple[str, int], ...]
"""Per GPU model offering the request's profile: (model name, memory slices it needs there)."""

_FIELDS = frozenset({"t", "profile", "count", "duration", "name", "priority", "preemptionPolicy"})

MIN_PRIORITY: Final = -(2**31)
MAX_PRIORITY: Final = 2**31 - 1
"""A pod's ``spec.priority`` is an int32."""

PreemptionPolicy = Literal["PreemptLowerPriority", "Never"]
PREEMPTION_POLICIES: Final[tuple[PreemptionPolicy, ...]] = ("PreemptLowerPriority", "Never")


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
    priority: int = 0
    """The pod's ``spec.priority``: waiting requests are served highest first."""
    preemption_policy: PreemptionPolicy = "PreemptLowerPriority"
    """The pod's ``spec.preemptionPolicy``: ``Never`` waits instead of preempting."""

    def to_json(self) -> str:
        obj: dict[str, Any] = {"t": round(self.t, 3), "profile": self.profile}
        if self.count != 1:
            obj["count"] = self.count
        obj["duration"] = round(self.duration, 3)
        if self.name is not None:
            obj["name"] = self.name
        if self.priority:
            obj["priority"] = self.priority
        if self.preemption_policy != "PreemptLowerPriority":
            obj["preemptionPolicy"] = self.preemption_policy
        return json.dumps(obj, separators=(",", ":"))


def _number(obj: dict[str, Any], key: str, *, where: str) -> float:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: {key!r} must be a number, got {value!r}")
    # An integer is compared before conversion: float() of a 400-digit one overflows.
    if not 0 <= value <= MAX_TRACE_SECONDS:  # also refuses nan
        raise ConfigError(
            f"{where}: {key!r} must be a finite number of seconds from 0 to "
            f"{MAX_TRACE_SECONDS:g}, got {_shown(value)}"
        )
    return float(value)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}… ({len(text)} characters)"


def _count(obj: dict[str, Any], *, where: str) -> int:
    count = obj.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"{where}: 'count' must be an integer >= 1, got {_shown(count)}")
    if count > MAX_COUNT_PER_GPU:
        raise ConfigError(
            f"{where}: 'count' is {_shown(count)}, but the slices of one request share a GPU and "
            f"no GPU holds more than {MAX_COUNT_PER_GPU} MIG instances"
        )
    return count


def _priority(obj: dict[str, Any], *, where: str) -> int:
    priority = obj.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ConfigError(f"{where}: 'priority' must be an integer, got {_shown(priority)}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ConfigError(
            f"{where}: 'priority' must be from {MIN_PRIORITY} to {MAX_PRIORITY} (a pod's "
            f"spec.priority is an int32), got {_shown(priority)}"
        )
    return priority


def _preemption_policy(obj: dict[str, Any], *, where: str) -> PreemptionPolicy:
    policy = obj.get("preemptionPolicy", "PreemptLowerPriority")
    if policy == "Never":
        return "Never"
    if policy == "PreemptLowerPriority":
        return "PreemptLowerPriority"
    raise ConfigError(
        f"{where}: 'preemptionPolicy' must be {' or '.join(PREEMPTION_POLICIES)}, "
        f"got {_shown(policy)}"
    )


def parse_line(text: str, *, line: int, source: str = "trace") -> TraceRequest:
    """One trace line; ``ConfigError`` naming ``source:line`` and what is wrong."""
    where = f"{source} line {line}"
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: arrays nested too deep
        raise ConfigError(f"{where}: not valid JSON ({_shown(str(exc))})") from None
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
        raise ConfigError(f"{where}: 'profile' must be a non-empty string, got {_shown(profile)}")
    name = obj.get("name")
    if name is not None and not isinstance(name, str):
        raise ConfigError(f"{where}: 'name' must be a string, got {_shown(name)}")
    return TraceRequest(
        t=_number(obj, "t", where=where),
        profile=profile,
        count=_count(obj, where=where),
        duration=_number(obj, "duration", where=where),
        name=name,
        line=line,
        priority=_priority(obj, where=where),
        preemption_policy=_preemption_policy(obj, where=where),
    )


def parse_lines(lines: Iterable[str], *, source: str = "trace") -> tuple[TraceRequest, ...]:
    """Every request of a trace, in order; blank lines are skipped, ``t`` must not decrease, at
    most ``MAX_TRACE_REQUESTS`` requests."""
    requests: list[TraceRequest] = []
    last = 0.0
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        if len(requests) == MAX_TRACE_REQUESTS:
            raise ConfigError(
                f"{source} line {number}: more than {MAX_TRACE_REQUESTS:,} requests; "
                "split the trace"
            )
        request = parse_line(text, line=number, source=source)
        if request.t < last:
            raise ConfigError(
                f"{source} line {number}: 't' is {request.t}, before the previous request's "
                f"{last}; arrivals must not decrease"
            )
        last = request.t
        requests.append(request)
    return tuple(requests)


def read_trace(path: Path) -> tuple[TraceRequest, ...]:
    """A trace file (``.gz`` read compressed); ``ConfigError`` if it is not a regular file, is
    unreadable, bad, or over a limit."""
    try:
        with open_regular_file(path) as raw:
            if path.suffix == ".gz":
                with gzip.GzipFile(fileobj=raw, mode="rb") as unpacked:
                    return parse_lines(_lines(unpacked, source=str(path)), source=str(path))
            return parse_lines(_lines(raw, source=str(path)), source=str(path))
    except (OSError, EOFError, zlib.error) as exc:  # gzip: BadGzipFile is an OSError
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"cannot read trace {path}: {reason or type(exc).__name__}") from exc


def _lines(stream: IO[bytes] | gzip.GzipFile, *, source: str) -> Iterator[str]:
    """The lines of ``stream`` as text, each at most ``MAX_TRACE_LINE_BYTES`` long, at most
    ``MAX_TRACE_BYTES`` in all and ``MAX_TRACE_REQUESTS`` lines: a line is never read whole before
    its length is known, and a small ``.gz`` cannot unpack into an endless stream."""
    total = 0
    for number in range(1, MAX_TRACE_REQUESTS + 2):
        line = stream.readline(MAX_TRACE_LINE_BYTES + 1)
        if not line:
            return
        total += len(line)
        if len(line) > MAX_TRACE_LINE_BYTES and not line.endswith(b"\n"):
            raise ConfigError(f"{source} line {number}: longer than {MAX_TRACE_LINE_BYTES:,} bytes")
        if total > MAX_TRACE_BYTES:
            raise ConfigError(
                f"{source} line {number}: the trace is longer than "
                f"{MAX_TRACE_BYTES // 2**20} MiB (decompressed); split it"
            )
        if number > MAX_TRACE_REQUESTS:
            raise ConfigError(
                f"{source} line {number}: more than {MAX_TRACE_REQUESTS:,} lines; split the trace"
            )
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{source} line {number}: not UTF-8 text ({exc.reason})") from None
        yield text


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
        with open_for_writing(path) as raw:
            if path.suffix == ".gz":
                with (
                    gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as packed,
                    io.TextIOWrapper(packed, encoding="utf-8") as stream,
                ):
                    return write_trace(requests, stream)
            with io.TextIOWrapper(raw, encoding="utf-8") as stream:
                return write_trace(requests, stream)
    except OSError as exc:
        reason = "nothing reads that FIFO" if exc.errno == errno.ENXIO else str(exc)
        raise ConfigError(f"cannot write trace {path}: {reason}") from exc


def needs_for(fleet: Fleet, request: TraceRequest, *, source: str = "trace") -> Need:
    """Where the request could go at all; ``ConfigError`` naming its line if nowhere is offered."""
    needs = []
    for model in fleet.models:
        for profile in model.profiles:
            if profile.name == request.profile:
                needs.append((model.name, profile.memory_slices * request.count))
    if not needs:
        where = f"{source} line {request.line}: " if request.line else ""
        raise ConfigError(
            f"{where}profile {request.profile!r} is not offered by any GPU of the fleet "
            f"{fleet.text} (offered: {', '.join(fleet.profile_names())})"
        )
    return tuple(needs)


def check_trace(
    trace: Sequence[TraceRequest], fleet: Fleet, *, source: str = "trace"
) -> dict[tuple[str, int], Need]:
    """The needs of every distinct (profile, count) of the trace; ``ConfigError`` on the first
    request whose profile the fleet does not offer."""
    needs: dict[tuple[str, int], Need] = {}
    for request in trace:
        key = (request.profile, request.count)
        if key not in needs:
            needs[key] = needs_for(fleet, request, source=source)
    return needs


def check_counts(trace: Sequence[TraceRequest], fleet: Fleet, *, source: str = "trace") -> None:
    """``ConfigError`` naming the first request that asks for more slices of its profile than one
    GPU of the fleet holds: the slices of a request share a GPU, so it could never be placed."""
    checked: set[tuple[str, int]] = set()
    for request in trace:
        key = (request.profile, request.count)
        if key in checked:
            continue
        checked.add(key)
        most = fleet.most_on_one_gpu(request.profile)
        if most and request.count > most:  # 0: not offered, which ``check_trace`` names
            where = f"{source} line {request.line}: " if request.line else ""
            raise ConfigError(
                f"{where}{request.count} x {request.profile} cannot share one GPU: a GPU of the "
                f"fleet {fleet.text} holds at most {most}"
            )


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
            if not 1 <= count <= MAX_COUNT_PER_GPU or not name:
                raise ConfigError(
                    f"mix entry {part!r}: write N*PROFILE with N from 1 to {MAX_COUNT_PER_GPU} "
                    "(2*1g.5gb=5; the N slices share a GPU)"
                )
        try:
            weight = float(weight_text)
        except ValueError:
            weight = -1.0
        if not 0 < weight <= MAX_MIX_WEIGHT:  # also refuses nan and inf
            raise ConfigError(
                f"mix entry {part!r}: the weight must be a number > 0 and at most "
                f"{MAX_MIX_WEIGHT:g}"
            )
        entries.append(MixEntry(profile=name, weight=weight, count=count))
    if not entries:
        raise ConfigError("the mix is empty; give PROFILE=WEIGHT pairs (e.g. 1g.5gb=45,7g.40gb=5)")
    return tuple(entries)


@dataclass(frozen=True, slots=True)
class PriorityShare:
    """One priority of a synthetic trace, by weight."""

    priority: int
    weight: float


def parse_priorities(text: str) -> tuple[PriorityShare, ...]:
    """``1000=0.2,0=0.8``: priority (an int32) = weight."""
    shares: dict[int, PriorityShare] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        priority_text, sep, weight_text = part.partition("=")
        try:
            priority = int(priority_text) if len(priority_text) <= 12 else MAX_PRIORITY + 1
            weight = float(weight_text)
        except ValueError:
            priority, weight = MAX_PRIORITY + 1, 0.0
        if not sep or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
            raise ConfigError(
                f"priority entry {part!r} is not PRIORITY=WEIGHT with an integer PRIORITY from "
                f"{MIN_PRIORITY} to {MAX_PRIORITY} (e.g. 1000=0.2)"
            )
        if not 0 < weight <= MAX_MIX_WEIGHT:  # also refuses nan and inf
            raise ConfigError(
                f"priority entry {part!r}: the weight must be a number > 0 and at most "
                f"{MAX_MIX_WEIGHT:g}"
            )
        if priority in shares:
            raise ConfigError(f"priority {priority} is given twice")
        shares[priority] = PriorityShare(priority=priority, weight=weight)
    if not shares:
        raise ConfigError("the priorities are empty; give PRIORITY=WEIGHT pairs (e.g. 1000=1,0=4)")
    return tuple(shares.values())


def synthesize(
    *,
    fleet: Fleet,
    mix: Sequence[MixEntry],
    load: float,
    events: int,
    seed: int,
    mean_duration: float = 300.0,
    priorities: Sequence[PriorityShare] = (),
) -> tuple[TraceRequest, ...]:
    """``events`` requests with Poisson arrivals and exponential durations at offered ``load``.

    With ``priorities``, each request draws its priority from them, from a random stream of its
    own: the same seed gives the same arrivals, profiles and durations with or without them."""
    if not 0 < load <= 10:
        raise ConfigError(f"load must be in (0, 10], got {load}")
    if not 1 <= events <= MAX_TRACE_REQUESTS:
        raise ConfigError(f"events must be from 1 to {MAX_TRACE_REQUESTS:,}, got {events}")
    if not 0 < mean_duration <= MAX_MEAN_DURATION:  # also refuses nan
        raise ConfigError(
            f"the mean duration must be more than 0 and at most {MAX_MEAN_DURATION:g} seconds, "
            f"got {mean_duration}"
        )
    slices = _mix_slices(fleet, mix)
    total_weight = sum(e.weight for e in mix)
    mean_slices = sum(s * e.weight for s, e in zip(slices, mix, strict=True)) / total_weight
    rate = load * fleet.memory_slices / (mean_slices * mean_duration)
    if not events <= rate * MAX_TRACE_SECONDS:  # the expected span of the arrivals
        raise ConfigError(
            f"{events} requests at load {load:g} with a mean duration of {mean_duration:g} s "
            f"would arrive over more than {MAX_TRACE_SECONDS:g} s; raise the load or shorten the "
            "mean duration"
        )
    rng = random.Random(seed)  # noqa: S311 - a reproducible simulation, not a secret
    weights = [e.weight for e in mix]
    ranks = random.Random(f"priorities-{seed}")  # noqa: S311 - as above
    levels = [p.priority for p in priorities]
    level_weights = [p.weight for p in priorities]
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
                priority=ranks.choices(levels, weights=level_weights)[0] if levels else 0,
            )
        )
    return tuple(requests)


def _mix_slices(fleet: Fleet, mix: Sequence[MixEntry]) -> list[int]:
    """Memory slices of each mix entry on the fleet; ``ConfigError`` for an entry it cannot hold."""
    slices = []
    for entry in mix:
        size = fleet.slices_of(entry.profile)
        if size is None:
            raise ConfigError(
                f"mix profile {entry.profile!r} is not offered by any GPU of the fleet "
                f"(offered: {', '.join(fleet.profile_names())})"
            )
        most = fleet.most_on_one_gpu(entry.profile)
        if entry.count > most:
            raise ConfigError(
                f"mix entry {entry.count}*{entry.profile}: a GPU of the fleet holds at most {most}"
            )
        slices.append(size * entry.count)
    return slices
