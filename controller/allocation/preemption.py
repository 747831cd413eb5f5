"""Which lower-priority pods to evict so that a waiting pod fits: kube-scheduler's rules, over MIG.

kube-scheduler preempts for CPU and memory, never for DRA devices; for our slices the controller
does, with kube-scheduler's rules (``DefaultPreemption``):

- candidates are the pods of *strictly* lower priority that hold our slices on a node, are not
  already terminating, and are the only users of the claims that hold them (a claim shared with
  another pod frees nothing when one of its users goes);
- on each node, the victims are a *minimal* set: with every candidate gone the pod must fit, and
  no victim may be spared without the pod no longer fitting. The set is found exactly where it is
  small — the candidates on one GPU, every subset tried in the order of the score below — and
  otherwise by kube-scheduler's reprieve (start with all gone, give each back, most important
  first, budget-violating ones before the others, and keep it if the pod still fits);
- the node is chosen by the score: fewest PodDisruptionBudget violations, then the lowest highest
  victim priority, the smallest sum of victim priorities, the fewest victims, then — our MIG
  extension — the fewest victims with no free placement of their profiles anywhere (a victim that
  fits elsewhere *moves*: its controller's new pod is placed at once, so it loses a restart, not
  its slice), and last the latest start of the most important victims (the least work lost);
- a set that would violate a budget is never chosen: victims are evicted through the Eviction API,
  which refuses such an eviction; the pod then waits, and its condition names the budgets.

The fit of a set is the placement engine's own answer with the set's slices released, so it
follows MIG placement rules (a 3g.20gb needs its aligned start free, not just three slices).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from controller.allocation.disruption import Budget, Budgets
from controller.allocation.occupancy import Slot
from driver.cluster.port import parse_time
from driver.cluster.views import PodView
from driver.placement import Placed

logger = logging.getLogger(__name__)

EXACT_CANDIDATES = 8
"""Up to this many candidates on one GPU, every subset of them is tried (255 at most)."""
MAX_FIT_CHECKS = 3000
"""Placement checks one preemption decision may spend across all nodes (each takes about a
hundred microseconds); past it the best plan found so far is taken."""
PLAN_NODES = 4
"""Nodes with a plan after which the search stops (kube-scheduler, too, compares the candidates
of a sample of nodes, not of every node): the fewest victims of the lowest priorities show on
the first nodes that have any, and the tie-breaks are not worth the allocator's lock for long
(a node of 8 A100s full of 1g.5gb pods costs about 90 placement checks)."""

_INT32_SPAN = 2**31


@dataclass(frozen=True, slots=True)
class Victim:
    pod: PodView
    slots: tuple[Slot, ...]
    """The slices that its eviction frees: those of the claims it alone uses."""
    budgets: tuple[Budget, ...]

    @property
    def key(self) -> str:
        return self.pod.key

    @property
    def priority(self) -> int:
        return self.pod.priority

    @property
    def started(self) -> float:
        text = self.pod.start_time or self.pod.meta.creation_timestamp
        try:
            return parse_time(text).timestamp() if text else 0.0
        except ValueError:
            return 0.0

    @property
    def gpus(self) -> frozenset[int]:
        return frozenset(s.gpu_index for s in self.slots)


Score = tuple[int, int, int, int, float]


def score(victims: Sequence[Victim]) -> Score:
    """Smaller is better (the order kube-scheduler picks nodes in)."""
    violations, _ = Budgets.violations([v.budgets for v in _by_importance(victims)])
    highest = max(v.priority for v in victims)
    latest = max((v.started for v in victims if v.priority == highest), default=0.0)
    return (
        violations,
        highest,
        sum(v.priority + _INT32_SPAN for v in victims),
        len(victims),
        -latest,
    )


def _by_importance(victims: Iterable[Victim]) -> list[Victim]:
    """Most important first: higher priority, then the one that started earlier."""
    return sorted(victims, key=lambda v: (-v.priority, v.started, v.key))


@dataclass(frozen=True, slots=True)
class Plan:
    node: str
    victims: tuple[Victim, ...]
    placed: Placed
    score: Score

    @property
    def violations(self) -> int:
        return self.score[0]

    @property
    def gpus(self) -> tuple[int, ...]:
        """The GPUs the pod would be placed on with the victims gone (what is held for it)."""
        return tuple(sorted({a.gpu_index for a in self.placed.assignments}))


Fits = Callable[[str, Sequence[Victim]], Placed | None]
"""Where the pod would go on the node with these victims' slices released; None if nowhere."""
FreeSlices = Callable[[str, int], int]
"""Free memory slices of a GPU (node, index) now."""
Stranded = Callable[[Sequence[Victim]], int]
"""How many of these victims could not be placed again anywhere now."""


def _no_stranding(victims: Sequence[Victim]) -> int:
    return 0


@dataclass(slots=True)
class Search:
    """One preemption decision: the best plan over the candidate nodes."""

    fits: Fits
    free_slices: FreeSlices
    min_slices: int
    """Fewest memory slices the pod can use on one GPU: a set of victims on a GPU whose slices
    and the free ones add up to less cannot let it in there (no placement check needed)."""
    stranded: Stranded = _no_stranding
    checks: int = 0
    refusing: tuple[str, ...] = ()
    """Budgets that stood in the way of the best plan that would have violated one."""

    def _fits(self, node: str, victims: Sequence[Victim]) -> Placed | None:
        self.checks += 1
        return self.fits(node, victims)

    def exhausted(self) -> bool:
        return self.checks >= MAX_FIT_CHECKS

    def best(self, candidates: dict[str, list[Victim]]) -> Plan | None:
        """The best plan that violates no budget; ``refusing`` names the budgets when only
        violating plans exist."""
        best: Plan | None = None
        violating: Plan | None = None
        planned = 0
        for node in sorted(candidates):
            if self.exhausted() or planned >= PLAN_NODES:
                break
            plan = self.on_node(node, candidates[node])
            if plan is None:
                continue
            planned += 1
            if plan.violations:
                if violating is None or plan.score < violating.score:
                    violating = plan
            elif best is None or self._rank(plan) < self._rank(best):
                best = plan
        if best is None and violating is not None:
            self.refusing = Budgets.violations(
                [v.budgets for v in _by_importance(violating.victims)]
            )[1]
        return best

    def _rank(self, plan: Plan) -> tuple[int, int, int, int, int, float]:
        """The score with the victims that could not move elsewhere before the last tie-break."""
        violations, highest, total, count, latest = plan.score
        return (violations, highest, total, count, self.stranded(plan.victims), latest)

    def on_node(self, node: str, victims: list[Victim]) -> Plan | None:
        if not victims or self.exhausted() or self._fits(node, victims) is None:
            return None
        plans = [p for p in (self._exact(node, victims), self._reprieve(node, victims)) if p]
        return min(plans, key=lambda p: p.score, default=None)

    def _exact(self, node: str, victims: list[Victim]) -> Plan | None:
        """Every subset of the candidates on one GPU, best score first."""
        best: Plan | None = None
        for gpu in sorted({g for v in victims for g in v.gpus}):
            on_gpu = [v for v in victims if gpu in v.gpus]
            if len(on_gpu) > EXACT_CANDIDATES or self.exhausted():
                continue
            if self._fits(node, on_gpu) is None:
                continue
            subsets = [
                combo
                for size in range(1, len(on_gpu) + 1)
                for combo in itertools.combinations(on_gpu, size)
            ]
            subsets.sort(key=score)
            free = self.free_slices(node, gpu)
            for combo in subsets:
                if best is not None and score(combo) >= best.score:
                    break
                if self.exhausted():
                    break
                freed = sum(s.size for v in combo for s in v.slots if s.gpu_index == gpu)
                if free + freed < self.min_slices:
                    continue
                placed = self._fits(node, combo)
                if placed is not None:
                    best = Plan(node=node, victims=combo, placed=placed, score=score(combo))
                    break
        return best

    def _reprieve(self, node: str, victims: list[Victim]) -> Plan | None:
        """kube-scheduler's ``SelectVictimsOnNode``: all gone, then each given back if it can be
        (those a budget protects first, each group most important first)."""
        ordered = _by_importance(victims)
        protected = [v for v in ordered if v.budgets and any(b.allowed <= 0 for b in v.budgets)]
        others = [v for v in ordered if v not in protected]
        chosen = list(ordered)
        placed = None
        for victim in (*protected, *others):
            if self.exhausted():
                break
            trial = [v for v in chosen if v is not victim]
            if not trial:
                continue
            found = self._fits(node, trial)
            if found is not None:
                chosen = trial
                placed = found
        if placed is None:
            if self.exhausted():
                return None
            placed = self._fits(node, chosen)
            if placed is None:
                return None
        return Plan(node=node, victims=tuple(chosen), placed=placed, score=score(chosen))
