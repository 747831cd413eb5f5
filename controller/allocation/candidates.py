"""Which published devices a request may get: its DeviceClass's selectors, then its own, all true.

Evaluated with the CEL selectors of ``selectors`` (as kube-scheduler evaluates them) over every
published device of ours, and cached per (class version, request selectors, inventory version), so
a thousand pods from one template cost one evaluation. The engine is asked in profile terms, so
the result also says whether the selectors took every device of each matching profile (no
per-device predicate needed) or only some (a GPU index, a placement, a product name).

A device with a ``NoSchedule`` or ``NoExecute`` taint (an unhealthy GPU's, ``driver.taints``) is a
candidate only for a request whose tolerations tolerate every such taint, as kube-scheduler decides;
the tolerations are part of the cache key.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from api.names import DRIVER_NAME
from controller.allocation.conditions import PlacementProblem, Reason
from controller.allocation.inventory import SliceInventory
from controller.allocation.occupancy import DeviceKey
from controller.allocation.selectors import (
    CompiledSelector,
    SelectorError,
    compile_selector,
    matches_all,
)
from driver.cluster.port import JsonObject
from driver.cluster.views import DeviceClassView, path, text
from driver.taints import DeviceTaint, DeviceToleration, untolerated


@dataclass(frozen=True, slots=True)
class Candidates:
    matched: frozenset[DeviceKey]
    profiles: frozenset[str]
    complete: bool
    """Every published device of ``profiles`` matched: the engine needs no predicate."""
    per_node: Mapping[str, int]
    untolerated: int = 0
    """Devices the selectors accepted but whose taints the request does not tolerate."""
    example_taint: DeviceTaint | None = None
    """One of those taints, for messages."""


class CandidateCache:
    """Candidates per (class, request selectors), valid for one inventory version."""

    def __init__(self, inventory: SliceInventory) -> None:
        self._inventory = inventory
        self._version = -1
        self._cache: dict[Hashable, Candidates | PlacementProblem] = {}
        self._profile_totals: dict[str, int] = {}

    def candidates(
        self,
        device_class: JsonObject,
        selectors: Sequence[str],
        tolerations: Sequence[DeviceToleration] = (),
    ) -> Candidates:
        inventory = self._inventory
        if inventory.version != self._version:
            self._cache.clear()
            self._profile_totals = {}
            for view in inventory.views():
                profile = _profile_of(view.attributes)
                self._profile_totals[profile] = self._profile_totals.get(profile, 0) + 1
            self._version = inventory.version
        class_view = DeviceClassView.of(device_class)
        key = (
            class_view.name,
            class_view.meta.uid,
            class_view.meta.resource_version,
            tuple(selectors),
            tuple(tolerations),
        )
        found = self._cache.get(key)
        if found is None:
            try:
                found = self._evaluate(class_view, selectors, tolerations)
            except PlacementProblem as problem:
                found = problem
            self._cache[key] = found
        if isinstance(found, PlacementProblem):
            raise PlacementProblem(found.reason, found.message)
        return found

    def _evaluate(
        self,
        device_class: DeviceClassView,
        selectors: Sequence[str],
        tolerations: Sequence[DeviceToleration],
    ) -> Candidates:
        class_exprs = list(device_class.selectors)
        try:
            compiled: list[CompiledSelector] = [
                compile_selector(e) for e in [*class_exprs, *selectors]
            ]
        except SelectorError as exc:
            where = "DeviceClass " + device_class.name if exc.expression in class_exprs else ""
            raise PlacementProblem(
                Reason.INVALID_SELECTOR, f"{where + ': ' if where else ''}{exc}"
            ) from exc
        matched: set[DeviceKey] = set()
        profiles: dict[str, int] = {}
        per_node: dict[str, int] = {}
        refused = 0
        example: DeviceTaint | None = None
        try:
            for view in self._inventory.views():
                if matches_all(compiled, view):
                    device = self._inventory.device(view.pool, view.name)
                    taint = untolerated(device.taints, tolerations) if device else None
                    if taint is not None:
                        refused += 1
                        example = example or taint
                        continue
                    matched.add((view.pool, view.name))
                    profile = _profile_of(view.attributes)
                    profiles[profile] = profiles.get(profile, 0) + 1
                    per_node[view.pool] = per_node.get(view.pool, 0) + 1
        except SelectorError as exc:
            raise PlacementProblem(Reason.INVALID_SELECTOR, str(exc)) from exc
        complete = all(self._profile_totals.get(p) == n for p, n in profiles.items())
        return Candidates(
            matched=frozenset(matched),
            profiles=frozenset(profiles),
            complete=complete,
            per_node=per_node,
            untolerated=refused,
            example_taint=example,
        )


def _profile_of(attributes: Mapping[str, Mapping[str, Any]]) -> str:
    """A CEL device view's ``profile`` attribute of our driver."""
    return text(path(attributes, DRIVER_NAME, "profile"))
