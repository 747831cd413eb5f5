"""Device-health flags of the kubelet plugin: which XIDs make a GPU unhealthy, and the taint effect.

**XIDs.** Every XID critical-error event makes its GPU unhealthy except the ones NVIDIA's device
plugin ignores as application errors, after which the GPU is still fine
(``internal/rm/health.go``): 13 (graphics engine exception), 31 (GPU memory page fault),
43 (GPU stopped processing), 45 (preemptive cleanup), 68 (video processor exception) and
109 (context switch timeout). ``--ignore-xids`` adds XIDs to that list (``all`` ignores every XID:
no XID health checks); ``--critical-xids`` makes XIDs count even if ignored otherwise (it wins over
both). Same meaning as the device plugin's ``DP_DISABLE_HEALTHCHECKS``/``DP_ENABLE_HEALTHCHECKS``.

**Taint effect.** The devices of an unhealthy GPU get ``mig.instaslice.dev/unhealthy=<reason>``
with effect ``NoSchedule`` (no new allocations); ``--unhealthy-taint-effect NoExecute`` also has
kube-controller-manager evict the pods already using them (DRA device-taint eviction).
"""

import argparse
from dataclasses import dataclass, field
from typing import Final

from driver.daemon.flags import add_flag, shown
from driver.taints import EFFECT_NO_EXECUTE, EFFECT_NO_SCHEDULE

APPLICATION_ERROR_XIDS: Final = frozenset({13, 31, 43, 45, 68, 109})
"""XIDs that follow an application's fault; the GPU stays usable (NVIDIA's device plugin list)."""
UNHEALTHY_TAINT_EFFECTS: Final = (EFFECT_NO_SCHEDULE, EFFECT_NO_EXECUTE)
ALL_XIDS: Final = "all"
MAX_XID: Final = 65535
"""The largest XID a flag may name (NVIDIA's documented XIDs are below 200)."""


@dataclass(frozen=True, slots=True)
class XidPolicy:
    """Which XIDs make a GPU unhealthy."""

    ignored: frozenset[int] = APPLICATION_ERROR_XIDS
    ignore_all: bool = False
    critical: frozenset[int] = frozenset()
    """Always critical, whatever ``ignored`` and ``ignore_all`` say."""

    def is_critical(self, xid: int) -> bool:
        if xid in self.critical:
            return True
        return not self.ignore_all and xid not in self.ignored

    def describe(self) -> str:
        if self.ignore_all:
            kept = ", ".join(map(str, sorted(self.critical))) or "none"
            return f"every XID ignored except {kept}"
        ignored = sorted(self.ignored - self.critical)
        return f"every XID critical except {', '.join(map(str, ignored)) or 'none'}"


@dataclass(frozen=True, slots=True)
class HealthSettings:
    taint_effect: str = EFFECT_NO_SCHEDULE
    xids: XidPolicy = field(default_factory=XidPolicy)


def parse_xids(text: str, *, flag: str, allow_all: bool) -> tuple[frozenset[int], bool]:
    """``"48,79"`` → ({48, 79}, False); ``"all"`` → (∅, True) where allowed. ``ValueError`` names
    the bad part; an XID is from 1 to ``MAX_XID``."""
    numbers: set[int] = set()
    everything = False
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part.lower() == ALL_XIDS and allow_all:
            everything = True
            continue
        if not part.isascii() or not part.isdigit():
            raise ValueError(f"{flag}: {shown(part)} is not an XID number (e.g. {flag} 48,79)")
        if len(part) > len(str(MAX_XID)) or not 1 <= int(part) <= MAX_XID:
            raise ValueError(f"{flag}: XID {shown(part)} is not between 1 and {MAX_XID}")
        numbers.add(int(part))
    return frozenset(numbers), everything


def add_health_flags(parser: argparse.ArgumentParser) -> None:
    add_flag(
        parser,
        "--unhealthy-taint-effect",
        help_text="effect of the taint on an unhealthy GPU's devices: NoSchedule (no new "
        "allocations) or NoExecute (also evict the pods using them)",
        choices=UNHEALTHY_TAINT_EFFECTS,
        default=EFFECT_NO_SCHEDULE,
    )
    add_flag(
        parser,
        "--ignore-xids",
        help_text=f"XIDs (1 to {MAX_XID}) that do not make a GPU unhealthy, besides the application "
        "errors 13,31,43,45,68,109; 'all' turns XID health checks off",
        default="",
    )
    add_flag(
        parser,
        "--critical-xids",
        help_text=f"XIDs (1 to {MAX_XID}) that make a GPU unhealthy even if ignored otherwise",
        default="",
    )


def health_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> HealthSettings:
    """The validated health settings; ``parser.error`` (exit 2) on a bad value."""
    effect = str(args.unhealthy_taint_effect)
    if effect not in UNHEALTHY_TAINT_EFFECTS:
        parser.error(
            f"--unhealthy-taint-effect {effect!r} is not one of {', '.join(UNHEALTHY_TAINT_EFFECTS)}"
        )
    try:
        ignored, ignore_all = parse_xids(
            str(args.ignore_xids), flag="--ignore-xids", allow_all=True
        )
        critical, _ = parse_xids(str(args.critical_xids), flag="--critical-xids", allow_all=False)
    except ValueError as exc:
        parser.error(str(exc))
    return HealthSettings(
        taint_effect=effect,
        xids=XidPolicy(
            ignored=APPLICATION_ERROR_XIDS | ignored, ignore_all=ignore_all, critical=critical
        ),
    )
