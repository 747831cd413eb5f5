"""Placement policies: which node to try next, and in which order to try devices and slices on it.

One module per policy — ``firstfit`` (the default: name order, first fit wins), ``bestfit`` (the GPU
that loses the fewest future placements) and ``scarcity`` (the start that costs the cluster least,
priced in ``costs``) — and ``policy`` for what they share: the ``Policy`` protocol, the ``Condition``
a node must meet and the leapfrog intersection of rank sets. Here: the policies by name.
"""

from collections.abc import Callable

from driver.errors import ConfigError
from driver.placement.policies.bestfit import BestFit
from driver.placement.policies.firstfit import FirstFit
from driver.placement.policies.policy import Condition, Policy, leapfrog
from driver.placement.policies.scarcity import Scarcity

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "BestFit",
    "Condition",
    "FirstFit",
    "Policy",
    "Scarcity",
    "leapfrog",
    "policy_named",
]

POLICIES: dict[str, Callable[[], Policy]] = {
    FirstFit.name: FirstFit,
    BestFit.name: BestFit,
    Scarcity.name: Scarcity,
}
"""Policies selectable by name; register another with one line."""

DEFAULT_POLICY = FirstFit.name


def policy_named(name: str) -> Policy:
    """A fresh policy called ``name``; ``ConfigError`` naming the choices if unknown."""
    factory = POLICIES.get(name)
    if factory is None:
        raise ConfigError(f"unknown placement policy {name!r} (known: {', '.join(POLICIES)})")
    return factory()
