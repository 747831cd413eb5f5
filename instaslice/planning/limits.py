"""The largest inputs capacity planning accepts, so that every input is answered in bounded time
and memory.

A fleet, a trace and a synthetic trace are all built in memory and replayed once per policy, so
each of their sizes is capped here; the parsers refuse anything larger with a message that names
the limit, and ``instaslice simulate --help`` states them. The caps sit well above the largest
clusters and traces the tool is meant for: a fleet at its caps takes about 250 MB and a trace at
its cap about 200 MB of memory.
"""

from __future__ import annotations

from typing import Final

from driver.mig.catalog import CATALOG

MAX_FLEET_NODES: Final = 10_000
"""Nodes of a hypothetical fleet (``--gpus``), all groups together."""

MAX_GPUS_PER_NODE: Final = 16
"""GPUs per node of a fleet group."""

MAX_FLEET_GPUS: Final = 100_000
"""GPUs of a fleet, all groups together."""

MAX_TRACE_REQUESTS: Final = 1_000_000
"""Requests of a trace, read from a file or synthesized (``--events``)."""

MAX_REPLAY_WORK: Final = 1_000_000_000
"""Requests x GPUs of one replay. A rejected request reads every GPU of the fleet (to count it as
stranded or not), so a replay's time grows with both: at this product a replay that rejects half
its requests takes a few minutes per policy."""

MAX_DEFRAG_REPLAY_REQUESTS: Final = 50_000
"""Requests of a replay with defragmentation on rejection: each rejection may search up to
``plan_defrag``'s budget of plans (a tenth of a second or more), so the trace is kept shorter."""

MAX_DEFRAG_SEARCH_STEPS_PER_REPLAY: Final = 50_000_000
"""Search steps (``plan_defrag``'s unit: a target set walked, a plan checked or a GPU read, the
latter two weighted to take about as long as a step) that the plan searches of one replay with
defragmentation on rejection spend together. Each search gets what the earlier ones left; once it
is spent, later rejections stand without a search and the output says how many. A search stopped
by its own budget takes up to about 230,000 steps, so this pays for a few hundred of them, and a
replay that spends it takes well under a minute per policy (docs/benchmarks.md). ``python -m bench
simulate`` replays its kept traces with a far larger budget of its own, so that its figures measure
the search, not this cap (its costliest trace comes close to this cap)."""

MAX_TRACE_LINE_BYTES: Final = 4_096
"""One line of a trace file (a request takes well under 200 bytes, its name included)."""

MAX_TRACE_BYTES: Final = 256 * 1024 * 1024
"""A trace file's text, decompressed: a small ``.gz`` cannot unpack into an endless stream."""

MAX_TRACE_SECONDS: Final = 1e12
"""Arrival times and durations, in seconds (Unix timestamps fit; overflowing sums do not)."""

MAX_MEAN_DURATION: Final = 1e9
"""Mean seconds a synthetic request is held (``--mean-duration``)."""

MAX_MIX_WEIGHT: Final = 1e9
"""A weight of a synthetic mix (weights are relative; their sum must stay finite)."""

MAX_COUNT_PER_GPU: Final = max(p.max_count for m in CATALOG.values() for p in m.profiles)
"""The most MIG instances of one profile any GPU of the catalog holds: the slices of one request
share a GPU, so no request may ask for more."""
